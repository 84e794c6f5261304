"""Comparing runs: another git ref of obsq installed in a scratch venv (the baseline) to run
beside the checkout's code, the median of each figure over interleaved rounds, and the
table of the checkout's figures against the baseline's. Standard library only."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import venv
from dataclasses import dataclass, field
from pathlib import Path

from harness import REPO


@dataclass
class Contender:
    """One column of the run: a system's code run by `python` with `env` added."""

    label: str  # obsq, obsq@<ref>, obsq/asyncio, dramatiq, taskiq
    system: str  # the system child.py runs: obsq, dramatiq or taskiq
    python: str = sys.executable
    env: dict[str, str] = field(default_factory=dict)
    pythonpath: str | None = None  # None: the checkout first; "": the venv's own obsq


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def default_ref() -> str:
    """The newest tag before HEAD, else the commit before HEAD."""
    try:
        return _git("describe", "--tags", "--abbrev=0", "HEAD^")
    except subprocess.CalledProcessError:
        return "HEAD~1"


def baseline(ref: str) -> Contender:
    """obsq at `ref`, installed (without dependencies: the running Python's serve) into a
    venv of its own under the temp directory, kept for the next run of the same commit."""
    try:
        sha = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"--baseline-ref {ref}: no such commit") from None
    root = Path(tempfile.gettempdir()) / f"obsq-bench-{sha[:12]}"
    python = root / "venv" / "bin" / "python"
    if not (root / "installed").exists():
        print(f"installing obsq {ref} ({sha[:12]}) into {root / 'venv'} ...", file=sys.stderr)
        venv.create(root / "venv", system_site_packages=True, with_pip=False)
        src = root / "src"
        src.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", sha],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
        # the running Python's pip, pointed at the venv: it installs there and nowhere else
        # (--ignore-installed: without it pip first uninstalls the obsq it sees installed in
        # the running Python, the user's own)
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                        "--ignore-installed", "--disable-pip-version-check",
                        "--prefix", str(root / "venv"), str(src)], check=True,
                       stdout=subprocess.DEVNULL)
        (root / "installed").write_text(sha)
    where = subprocess.run([str(python), "-c", "import obsq; print(obsq.__file__)"],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""},
                           cwd=tempfile.gettempdir())
    if not where.stdout.startswith(str(root / "venv")):
        raise SystemExit(f"the baseline venv imports obsq from {where.stdout.strip() or '?'}"
                         f"{where.stderr.strip()}, not from {root / 'venv'}")
    return Contender(f"obsq@{ref}", "obsq", str(python), pythonpath="")


def median_of(rounds: list[dict]) -> dict:
    """The median of every number found at the same place in each round's results."""
    first = rounds[0]
    if isinstance(first, dict):
        keys = [k for k in first if all(isinstance(r, dict) and k in r for r in rounds)]
        return {k: median_of([r[k] for r in rounds]) for k in keys}
    if isinstance(first, (int, float)) and not isinstance(first, bool):
        values = [r for r in rounds if isinstance(r, (int, float))]
        return statistics.median(values) if values else first
    return first


# Figures where more is better; every other number is a cost (less is better).
HIGHER_IS_BETTER = ("rate", "achieved_rate", "spans", "received", "handled", "n")
SKIP = ("n", "handled", "received", "polls", "poll_redis_cpu_us", "seconds", "rate_limit",
        "requests", "bytes", "spans")
SET_BY_THE_HARNESS = ("pickup.rate", "pickup.achieved_rate")  # the producer's pace
WORSE_BEYOND = 0.05


def against(current: dict, base: dict) -> list[tuple[str, float, float, float, bool]]:
    """(figure, current, baseline, current/baseline, worse by more than 5 %) for every
    number both have."""
    rows = []
    for section in sorted(current):
        now, then = current.get(section), base.get(section)
        if not isinstance(now, dict) or not isinstance(then, dict):
            continue
        for key in sorted(now):
            a, b = now.get(key), then.get(key)
            if (key in SKIP or f"{section}.{key}" in SET_BY_THE_HARNESS
                    or not all(isinstance(v, (int, float)) for v in (a, b)) or not b):
                continue
            ratio = a / b
            worse = ratio < 1 - WORSE_BEYOND if key in HIGHER_IS_BETTER else (
                ratio > 1 + WORSE_BEYOND)
            rows.append((f"{section}.{key}", a, b, ratio, worse))
    return rows
