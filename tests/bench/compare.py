"""Comparing runs: another git ref of obsq installed into a scratch directory (the baseline)
to run beside the checkout's code on the same interpreter and packages, the median of each
figure over interleaved rounds, and the table of the checkout's figures against the
baseline's. Standard library only."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from harness import REPO, first_on_path


@dataclass
class Contender:
    """One column of the run: a system's code with `env` added, and obsq imported from
    `obsq_from` (the checkout, or a baseline's directory), on the bench's own Python."""

    label: str  # obsq, obsq@<ref>, obsq/asyncio, dramatiq, taskiq
    system: str  # the system child.py runs: obsq, dramatiq or taskiq
    env: dict[str, str] = field(default_factory=dict)
    obsq_from: Path = REPO

    def on(self, loop: str) -> Contender:
        """This contender's obsq worker on `loop` (OBSQ_LOOP), labelled with it."""
        return Contender(f"{self.label}/{loop}", self.system, {**self.env, "OBSQ_LOOP": loop},
                         self.obsq_from)


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def default_ref() -> str:
    """The newest tag before HEAD, else the commit before HEAD."""
    try:
        return _git("describe", "--tags", "--abbrev=0", "HEAD^")
    except subprocess.CalledProcessError:
        return "HEAD~1"


MARKER = "installed"  # written last, once the directory is known to import its own obsq


def _interpreter() -> str:
    """What a baseline directory is built for: this Python (its path and version)."""
    tag = hashlib.sha256(f"{sys.executable}\0{sys.version}".encode()).hexdigest()[:8]
    return f"py{sys.version_info[0]}{sys.version_info[1]}-{tag}"


def _imports_from(site: Path) -> str | None:
    """None if this Python, with `site` first on PYTHONPATH as the baseline's children run,
    imports obsq from `site`; else what went wrong."""
    # `-c` puts the working directory first on sys.path, a child script its own folder:
    # dropped, so that only PYTHONPATH can lead to `site`, as in the children
    where = subprocess.run(
        [sys.executable, "-c", "import sys; del sys.path[0]; import obsq; print(obsq.__file__)"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": first_on_path(site)},
        cwd=str(site.parent))
    found = where.stdout.strip()
    if where.returncode or not found:
        return (f"{sys.executable} with {site} first on PYTHONPATH could not import "
                f"obsq:\n{where.stderr.strip()}")
    if not Path(found).resolve().is_relative_to(site.resolve()):
        return (f"{sys.executable} with {site} first on PYTHONPATH imports obsq from "
                f"{found}, not from {site}")
    return None


def _install(sha: str, ref: str, root: Path) -> None:
    """obsq at `sha`, without dependencies, into a new directory renamed to `root` once it
    imports its own obsq; a failed install leaves nothing behind."""
    build = Path(tempfile.mkdtemp(prefix=f"{root.name}.", dir=root.parent))
    try:
        src, site = build / "src", build / "site"
        src.mkdir()
        archive = subprocess.run(["git", "-C", str(REPO), "archive", sha],
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
        # this Python's pip: --target installs obsq alone into `site` (it neither sees nor
        # touches the obsq installed in this Python); the dependencies are this Python's own
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                              "--disable-pip-version-check", "--target", str(site), str(src)],
                             capture_output=True, text=True)
        if pip.returncode:
            raise SystemExit(f"--baseline-ref {ref}: pip could not install obsq {sha[:12]} "
                             f"(nothing kept):\n{(pip.stdout + pip.stderr).strip()}")
        problem = _imports_from(site)
        if problem:
            raise SystemExit(f"--baseline-ref {ref}: obsq {sha[:12]}, installed for the "
                             f"baseline, is not usable (nothing kept): {problem}")
        shutil.rmtree(src)
        (build / MARKER).write_text(f"{sha}\n{sys.executable}\n{sys.version}\n")
        try:
            build.rename(root)
        except OSError:  # another run got there first: keep its directory
            if not (root / MARKER).exists():
                raise
    finally:
        shutil.rmtree(build, ignore_errors=True)


def baseline(ref: str) -> Contender:
    """obsq at `ref`, installed without its dependencies into a directory of its own under
    the temp directory (kept for the next run of the same commit on the same Python), run by
    this Python with that directory first on PYTHONPATH: the same redis-py, orjson and peers
    as the checkout's obsq, whatever environment runs the bench."""
    try:
        sha = _git("rev-parse", "--verify", f"{ref}^{{commit}}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"--baseline-ref {ref}: no such commit") from None
    root = Path(tempfile.gettempdir()) / f"obsq-bench-{sha[:12]}-{_interpreter()}"
    site = root / "site"
    kept = (root / MARKER).exists()
    problem = _imports_from(site) if kept else None
    if kept and problem is None:
        print(f"baseline: obsq {ref} ({sha[:12]}) from {site}", file=sys.stderr)
        return Contender(f"obsq@{ref}", "obsq", obsq_from=site)
    if problem:
        print(f"the baseline kept in {root} is not usable, installed again: {problem}",
              file=sys.stderr)
    shutil.rmtree(root, ignore_errors=True)  # unfinished, or no longer importable
    print(f"installing obsq {ref} ({sha[:12]}) into {site} ...", file=sys.stderr)
    _install(sha, ref, root)
    return Contender(f"obsq@{ref}", "obsq", obsq_from=site)


def chooses_loop(c: Contender) -> bool:
    """Whether the obsq `c` runs can put its worker on uvloop: a version from before the
    choice of loop (no eventloop module) runs on asyncio's, whatever OBSQ_LOOP says."""
    return any((c.obsq_from / "obsq" / where).exists()
               for where in ("engine/eventloop.py", "eventloop.py"))


def has_uvloop() -> bool:
    """Whether this Python, which runs every child, can import uvloop."""
    return importlib.util.find_spec("uvloop") is not None


def guard_loops(asked: str | None, base: Contender) -> tuple[list[str], str]:
    """The loops the previous-version guard compares on (each on both sides), and a line
    saying why where it is fewer than asked: `asked` is asyncio, uvloop, both, or None
    (both where uvloop is installed and the baseline can choose its loop, else asyncio)."""
    if not has_uvloop():
        why = "uvloop is not installed in this Python"
    elif not chooses_loop(base):
        why = f"{base.label} predates the choice of loop (its worker runs on asyncio's only)"
    else:
        why = ""
    if asked == "uvloop" and why:
        raise SystemExit(f"--loop uvloop: no like-with-like run on uvloop: {why}")
    if asked in (None, "both"):
        return (["asyncio"], f"the guard compares on asyncio alone: {why}") if why else (
            ["asyncio", "uvloop"], "")
    return [asked], ""


def versions_of_extras() -> str:
    """The installed versions of the packages that change obsq's speed, which both sides
    of the guard import from this same Python."""
    found = []
    for name in ("uvloop", "hiredis", "orjson", "redis"):
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{name} absent")
    return ", ".join(found)


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
