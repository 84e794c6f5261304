"""Lua scripts, one file per state change, called by SHA and loaded again after NOSCRIPT
(a restarted or failed-over Redis has none); and a script's call on a bare connection that
a producer keeps beside its pool (asyncio and blocking alike)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from importlib import resources
from string import Template
from typing import Any

from hiredis import pack_command
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError

from obsq.settings import INBOX_TTL, LUA_SLICE, MEMORY_LOOK_MS, WAKE_CAP

# While Redis is above the producers' share, a failed attempt keeps only the start of its
# error, with this note, in at most FULL_ERROR_BYTES (what a small task hash holds in
# Redis's compact encoding); a worker told so sends no more than that for FULL_TEXT_HOLD s.
FULL_NOTE = " (rest not kept: Redis full)"
FULL_ERROR_BYTES = 64
FULL_TEXT_HOLD = 1.0

SCRIPT_DIR = resources.files("obsq.broker") / "scripts"


class Script:
    __slots__ = ("name", "sha", "source")

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


class _Constants(Template):
    delimiter = "@"  # Lua uses $ in patterns, never @


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


def _prelude_for(body: str, blocks: list[tuple[str, str]]) -> str:
    """Only the definitions `body` uses, and the ones those use: Redis runs a script's
    prelude on every call, and all of it costs an enqueue several µs of server time."""
    uses = _COMMENT.sub("", body)
    needed = []
    for name, text in reversed(blocks):  # a definition uses only the ones above it
        if re.search(rf"\b{name}\b", uses):
            needed.append(text)
            uses += _COMMENT.sub("", text)
    return "\n".join(reversed(needed))


def load_scripts() -> dict[str, Script]:
    preludes = sorted((p for p in SCRIPT_DIR.iterdir() if p.name.startswith("_")),
                      key=lambda p: p.name)  # _prelude.lua, then the ones built on it
    blocks = _prelude_blocks(_Constants("\n".join(p.read_text() for p in preludes)).substitute(
        LUA_SLICE=LUA_SLICE, WAKE_CAP=WAKE_CAP, INBOX_TTL=INBOX_TTL,
        MEMORY_LOOK_MS=MEMORY_LOOK_MS, FULL_NOTE=FULL_NOTE, FULL_ERROR_BYTES=FULL_ERROR_BYTES))
    scripts = {}
    for path in SCRIPT_DIR.iterdir():
        if path.name.endswith(".lua") and not path.name.startswith("_"):
            name, body = path.name[:-4], path.read_text()
            scripts[name] = Script(name, _prelude_for(body, blocks) + "\n" + body)
    return scripts


def is_noscript(result: Any) -> bool:
    return isinstance(result, NoScriptError) or (
        isinstance(result, ResponseError) and str(result).startswith("NOSCRIPT"))


# A kept connection is used by one caller at a time, with nothing else in flight on it. Its
# commands are packed by hiredis at once (redis-py's asyncio packer encodes every argument
# in Python: 9 µs of an enqueue's 150). One the server closed while it sat idle (a
# restart) is made again before the call; one that failed or was cancelled halfway is
# closed, as a reply may be left unread on it, and made again at the next call.


def _packed(script: Script, keys: Sequence[str], args: Sequence[Any]) -> list[bytes]:
    return [pack_command(("EVALSHA", script.sha, len(keys), *keys, *args))]


async def call_on(connection: Any, script: Script, keys: Sequence[str],
                  args: Sequence[Any]) -> Any:
    """`script` on a kept redis-py asyncio connection."""
    try:
        try:
            # the check a pool makes before lending a connection (renamed in redis-py 8)
            can_read = getattr(connection, "can_read", None) or connection.can_read_destructive
            stale = connection.is_connected and await can_read()
        except RedisConnectionError:
            stale = True
        if stale:
            await connection.disconnect()
        for attempt in range(2):
            try:
                await connection.send_packed_command(_packed(script, keys, args),
                                                     check_health=False)
                return await connection.read_response()
            except ResponseError as exc:
                if attempt or not is_noscript(exc):
                    raise
                await connection.send_command("SCRIPT", "LOAD", script.source)
                await connection.read_response()
    except ResponseError:
        raise
    except BaseException:
        await connection.disconnect(nowait=True)
        raise


def call_on_blocking(connection: Any, script: Script, keys: Sequence[str],
                     args: Sequence[Any]) -> Any:
    """`script` on a kept redis-py blocking connection."""
    try:
        try:
            stale = connection.can_read()  # connects one that is not
        except RedisConnectionError:
            stale = True
        if stale:
            connection.disconnect()
        for attempt in range(2):
            try:
                connection.send_packed_command(_packed(script, keys, args), check_health=False)
                return connection.read_response()
            except ResponseError as exc:
                if attempt or not is_noscript(exc):
                    raise
                connection.send_command("SCRIPT", "LOAD", script.source)
                connection.read_response()
    except ResponseError:
        raise
    except BaseException:
        connection.disconnect()
        raise
