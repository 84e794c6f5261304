"""Lua scripts, one file per state change, called by SHA and loaded again after NOSCRIPT
(a restarted or failed-over Redis has none)."""

from __future__ import annotations

import hashlib
from importlib import resources
from string import Template
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from obsq.settings import INBOX_TTL, LUA_SLICE, MEMORY_LOOK_MS, WAKE_CAP

SCRIPT_DIR = resources.files("obsq.broker") / "scripts"


class Script:
    __slots__ = ("name", "sha", "source")

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


class _Constants(Template):
    delimiter = "@"  # Lua uses $ in patterns, never @


def load_scripts() -> dict[str, Script]:
    preludes = sorted((p for p in SCRIPT_DIR.iterdir() if p.name.startswith("_")),
                      key=lambda p: p.name)  # _prelude.lua, then the ones built on it
    prelude = _Constants("\n".join(p.read_text() for p in preludes)).substitute(
        LUA_SLICE=LUA_SLICE, WAKE_CAP=WAKE_CAP, INBOX_TTL=INBOX_TTL,
        MEMORY_LOOK_MS=MEMORY_LOOK_MS)
    scripts = {}
    for path in SCRIPT_DIR.iterdir():
        if path.name.endswith(".lua") and not path.name.startswith("_"):
            name = path.name[:-4]
            scripts[name] = Script(name, prelude + "\n" + path.read_text())
    return scripts


def is_noscript(result: Any) -> bool:
    return isinstance(result, NoScriptError) or (
        isinstance(result, ResponseError) and str(result).startswith("NOSCRIPT"))
