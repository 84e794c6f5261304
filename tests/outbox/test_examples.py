"""The FastAPI guide's outbox example (examples/fastapi_outbox.py) as a reader runs it: an
order placed commits its task with it, one refused leaves none, and the relay
(`obsq outbox`) moves the committed one to Redis."""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from support import ROOT, ObsqProcess, obsq_env, sync_redis


def test_the_fastapi_outbox_example(sqlite_url: str, admin_redis_url: str, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", sqlite_url)
    monkeypatch.setenv("OBSQ_REDIS_URL", admin_redis_url)
    monkeypatch.syspath_prepend(str(ROOT))
    sys.modules.pop("examples.fastapi_outbox", None)
    example = importlib.import_module("examples.fastapi_outbox")
    redis = sync_redis(admin_redis_url)
    for key in redis.scan_iter(match="shop:*"):
        redis.unlink(key)
    relay = None
    try:
        with TestClient(example.api) as http:
            placed = http.post("/orders", params={"email": "a@b.c"}).json()
            assert http.post("/orders", params={"email": "nobody"}).status_code == 422
            assert http.get(f"/tasks/{placed['task']}").json()["state"] == "committed"
            relay = ObsqProcess(["outbox", "--database-url", sqlite_url, "--namespace",
                                 "shop", "--redis-url", admin_redis_url, "--http-port", "-1"],
                                obsq_env(), ROOT, tmp_path / "relay.log")
            state = "committed"
            for _ in range(300):
                state = http.get(f"/tasks/{placed['task']}").json()["state"]
                if state != "committed":
                    break
                time.sleep(0.1)
            assert state == "pending", relay.log()
        assert [i.decode() for i in redis.lrange("shop:{emails}:pending", 0, -1)] == [
            placed["task"]]
    finally:
        if relay is not None:
            relay.close()
        for key in redis.scan_iter(match="shop:*"):
            redis.unlink(key)
        example.engine.dispose()
