"""What a team that type-checks sees: the public modules pass `mypy --strict`, the guide's
typed example (examples/typed_tasks.py) type-checks and runs, and a user's app gets its
mistakes reported (a typo in an option, a payload of the wrong type, the result used as
the wrong type) while its correct calls pass."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

import obsq
import obsq.testing

PUBLIC_MODULES = ["obsq/__init__.py", "obsq/task.py", "obsq/payloads.py", "obsq/app.py",
                  "obsq/producer/client.py", "obsq/producer/sync_client.py",
                  "obsq/producer/results.py", "obsq/flow.py", "obsq/errors.py",
                  "obsq/testing.py"]
EXAMPLE = ROOT / "examples" / "typed_tasks.py"

# Each line marked `# E` must be reported, and no other line.
USER_APP = '''\
from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import obsq


@dataclass
class Order:
    id: int


class Shipped(TypedDict):
    tracking: str


app = obsq.App("shop")


@app.task("order:ship")
async def ship(task: obsq.Task[Order]) -> Shipped:
    return {"tracking": str(task.payload.id)}


@app.task("order:count")
def count(task: obsq.Task) -> int:  # a bare Task: any payload
    return len(task.payload)


async def correct(client: obsq.Client) -> str:
    info = await client.enqueue(ship, Order(id=1), queue="orders", delay=5, priority=3)
    shipped = await client.result(info, timeout=10)
    by_name = await client.enqueue("order:ship", {"id": 2}, retention=60)
    flow = await client.enqueue(obsq.chain(obsq.Job(ship, Order(id=3)),
                                           obsq.Job("order:count")))
    infos = await client.enqueue_many([obsq.Job(ship, Order(id=4), unique_for=60)])
    await client.result(by_name)
    await client.result(flow)
    await client.result(infos[0])
    n: int = await client.result(await client.enqueue(count, [1, 2]))
    return shipped["tracking"] + flow.state + str(n)


def correct_sync(client: obsq.SyncClient) -> str:
    return client.result(client.enqueue(ship, Order(id=5), retention=60))["tracking"]


async def option_typo(client: obsq.Client) -> None:
    await client.enqueue(ship, Order(id=1), retension=60)  # E


async def option_typo_by_name(client: obsq.Client) -> None:
    await client.enqueue("order:ship", {"id": 1}, max_retries=3)  # E


def sync_option_typo(client: obsq.SyncClient) -> None:
    client.enqueue("order:ship", {"id": 1}, retension=60)  # E


async def option_of_the_wrong_type(client: obsq.Client) -> None:
    await client.enqueue(ship, Order(id=1), priority="high")  # E


async def wrong_payload(client: obsq.Client) -> None:
    await client.enqueue(ship, {"id": 1})  # E


def wrong_payload_in_a_job() -> None:
    obsq.Job(ship, Order)  # E


async def result_as_the_wrong_type(client: obsq.Client) -> int:
    info = await client.enqueue(ship, Order(id=1))
    return await client.result(info)  # E


def sync_result_as_the_wrong_type(client: obsq.SyncClient) -> str:
    return client.result(client.enqueue(count, None))  # E


async def payload_as_the_wrong_type(task: obsq.Task[Order]) -> str:
    return task.payload.id  # E
'''


def _mypy(*paths: str | Path) -> dict[str, list[tuple[int, str]]]:
    """mypy --strict on `paths`, obsq read as an installed package is (its own modules'
    errors not reported): the errors by file name, each (line, message)."""
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
         "--no-error-summary", "--show-error-codes", "--no-incremental", *map(str, paths)],
        cwd=ROOT, capture_output=True, text=True, timeout=110)
    assert done.returncode in (0, 1), done.stderr or done.stdout  # 2: mypy itself failed
    errors: dict[str, list[tuple[int, str]]] = {}
    for line in done.stdout.splitlines():
        found = re.match(r"(.+?):(\d+): error: (.*)", line)
        if found:
            errors.setdefault(Path(found[1]).name, []).append((int(found[2]), found[3]))
    return errors


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[int, str]]]:
    """One mypy run for the tests below (it takes seconds)."""
    user_app = tmp_path_factory.mktemp("typed") / "user_app.py"
    user_app.write_text(USER_APP)
    return _mypy(*PUBLIC_MODULES, EXAMPLE, user_app)


def test_the_public_modules_pass_mypy_strict(checked: dict[str, list[tuple[int, str]]]
                                              ) -> None:
    public = {Path(p).name for p in PUBLIC_MODULES}
    assert {name: found for name, found in checked.items() if name in public} == {}


def test_the_typed_example_type_checks(checked: dict[str, list[tuple[int, str]]]) -> None:
    assert checked.get(EXAMPLE.name, []) == []


def test_a_users_mistakes_are_reported_and_nothing_else(
        checked: dict[str, list[tuple[int, str]]]) -> None:
    reported = checked.get("user_app.py", [])
    marked = {n for n, line in enumerate(USER_APP.splitlines(), 1) if line.endswith("# E")}
    assert {line for line, _ in reported} == marked, reported
    messages = "\n".join(message for _, message in reported)
    assert 'Unexpected keyword argument "retension"' in messages
    assert 'did you mean "retention"' in messages
    assert 'Unexpected keyword argument "max_retries"' in messages
    assert "Incompatible return value type" in messages


def test_a_typo_in_an_option_is_a_type_error_at_run_time_too() -> None:
    app = obsq.App("t")

    @app.task("x")
    async def handler(task: obsq.Task[int]) -> None: ...

    client = obsq.Client(namespace="t")
    with pytest.raises(TypeError, match="retension"):
        client.enqueue("x", 1, retension=60)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="retension"):
        obsq.Job(handler, 1, retension=60)  # type: ignore[call-overload]
    sync_enqueue = obsq.SyncClient.enqueue
    with pytest.raises(TypeError, match="retension"):
        sync_enqueue(None, "x", 1, retension=60)  # type: ignore[call-overload, arg-type]


async def test_the_typed_example_runs() -> None:
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import typed_tasks
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    async with obsq.testing.Environment(typed_tasks.app) as env:  # its worker runs them
        message_id = await typed_tasks.send_welcome(env.client, "a@example.com")
        assert message_id.startswith("<") and message_id.endswith("@mail.example.com>")
        total = await asyncio.to_thread(_total, env.redis_url, env.namespace)
        assert total == 3.5


def _total(redis_url: str, namespace: str) -> float:
    import typed_tasks

    with obsq.SyncClient(redis_url, namespace=namespace) as client:
        return typed_tasks.total(client, [1.0, 2.5])
