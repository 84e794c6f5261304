"""Lua scripts, one file per state change, each with the prelude definitions it uses; how
they are called is calls.py's. They are prepared at the first call (`scripts()`), not at
import: a process that imports obsq and never calls Redis pays nothing for them."""

from __future__ import annotations

import functools
import hashlib
import re
from importlib import resources
from string import Template

from obsq.broker.keys import KEY_NAMES
from obsq.broker.wire import constants
from obsq.errors import EXPIRED_PREFIX
from obsq.settings import INBOX_TTL, LUA_SLICE, MEMORY_LOOK_MS, WAKE_CAP

# While Redis is above the producers' share, a failed attempt keeps only the start of its
# error, with this note, in at most FULL_ERROR_BYTES (what a small task hash holds in
# Redis's compact encoding); a worker told so sends no more than that for FULL_TEXT_HOLD s.
FULL_NOTE = " (rest not kept: Redis full)"
FULL_ERROR_BYTES = 64
FULL_TEXT_HOLD = 1.0

SCRIPT_DIR = resources.files("obsq.broker") / "scripts"


class Script:
    """A script's text and SHA; `takes_now`: its first argument is the time it is to read
    (every obsq script; not the ACL probe, whose arguments are all commands); `operation`:
    what its failures are reported under (a variant's is its file's)."""

    __slots__ = ("name", "operation", "sha", "source", "takes_now")

    def __init__(self, name: str, source: str, *, takes_now: bool = True,
                 operation: str | None = None) -> None:
        self.name = name
        self.operation = operation or name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        self.takes_now = takes_now


# A variant is a script's file prepared without some prelude definitions, for the calls that
# never reach them: Redis makes each function a script defines, a Lua closure, at every call
# (about 1,100 instructions each; enqueue.lua's were a tenth of a single enqueue's cost).
# enqueue_plain is enqueue.lua for a batch none of whose tasks gives a rarer option
# (wire.py's `rare`): its debounce, priority, fairness and ordering helpers are reached only
# from those options. A call that reached a left-out helper would fail halfway (a missing
# global), so only the caller that knows they are out of reach picks a variant
# (producing.enqueue_call; test_enqueue_options checks each option). It takes its file's
# arguments and its failures are reported under its file's name.
VARIANTS = {"enqueue_plain": ("enqueue", frozenset(
    {"replace_waiting", "push_pending", "queue_behind"}))}


class _Constants(Template):
    delimiter = "@"  # Lua uses $ in patterns, never @


# The key names a script builds from a prefix (`prefix .. @key_task .. id`), as Lua strings.
KEY_CONSTANTS = {f"key_{name}": f"'{text}'" for name, text in KEY_NAMES.items()}


_DEFINITION = re.compile(r"^local (?:function )?(\w+)", re.M)
_COMMENT = re.compile(r"--.*$", re.M)


def _prelude_blocks(prelude: str) -> list[tuple[str, str]]:
    """The prelude's top-level definitions, in order, as (name, text): a `local function`
    runs to the `end` at the start of a line, any other `local` is one line."""
    blocks = []
    lines = prelude.splitlines()
    i = 0
    while i < len(lines):
        found = _DEFINITION.match(lines[i])
        if not found:
            i += 1
            continue
        end = i
        if lines[i].startswith("local function"):
            while lines[end] != "end":
                end += 1
        blocks.append((found[1], "\n".join(lines[i:end + 1])))
        i = end + 1
    return blocks


_WORD = re.compile(r"\w+")


def _words(code: str) -> set[str]:
    return set(_WORD.findall(_COMMENT.sub("", code)))


def _prelude_for(body: str, blocks: list[tuple[str, str]],
                 left_out: frozenset[str] = frozenset()) -> str:
    """Only the definitions `body` uses, and the ones those use, but `left_out` (a
    variant's): Redis runs a script's prelude on every call, and all of it costs an enqueue
    several µs of server time."""
    uses = _words(body) - left_out
    needed = []
    for name, text in reversed(blocks):  # a definition uses only the ones above it
        if name in uses:
            needed.append(text)
            uses |= _words(text)
    return "\n".join(reversed(needed))


def script_names() -> list[str]:
    """The scripts' names, from their files (the `_` files are the prelude)."""
    return sorted(p.name[:-4] for p in SCRIPT_DIR.iterdir()
                  if p.name.endswith(".lua") and not p.name.startswith("_"))


def load_scripts() -> dict[str, Script]:
    """Every script, prepared now: the prelude's constants and the definitions it uses,
    its own constants (wire.py's layout)."""
    preludes = sorted((p for p in SCRIPT_DIR.iterdir() if p.name.startswith("_")),
                      key=lambda p: p.name)  # _prelude.lua, then the ones built on it
    blocks = _prelude_blocks(_Constants("\n".join(p.read_text() for p in preludes)).substitute(
        KEY_CONSTANTS, LUA_SLICE=LUA_SLICE, WAKE_CAP=WAKE_CAP, INBOX_TTL=INBOX_TTL,
        MEMORY_LOOK_MS=MEMORY_LOOK_MS, FULL_NOTE=FULL_NOTE, FULL_ERROR_BYTES=FULL_ERROR_BYTES,
        EXPIRED_PREFIX=EXPIRED_PREFIX))
    bodies = {}
    for name in script_names():
        body = (SCRIPT_DIR / f"{name}.lua").read_text()
        bodies[name] = _Constants(body).substitute(KEY_CONSTANTS, **constants(name))  # wire.py
    prepared = {name: Script(name, _prelude_for(body, blocks) + "\n" + body)
                for name, body in bodies.items()}
    for name, (file, left_out) in VARIANTS.items():
        body = bodies[file]
        prepared[name] = Script(name, _prelude_for(body, blocks, left_out) + "\n" + body,
                                operation=file)
    return prepared


# The scripts by name, prepared at the first call (a hit costs a call of C code, no Python
# frame, on an enqueue's path)
scripts = functools.cache(load_scripts)
