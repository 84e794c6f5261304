"""What `obsq doctor` (obsq/ops/doctor.py) asks of Redis: one bounded step of a queue's
invariants per call of doctor.lua (a window of a list or zset, of the leases, of the active
hash, of the stored options, the counters against what they count, the junk set aside),
the ordering-key lists found by SCAN, and the repairs that re-check what they mend in the
same script."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from obsq.broker.calls import RedisCalls
from obsq.broker.wire import argv, as_count, as_text
from obsq.schedule import parse_claim

# A queue's lists and zsets of task ids, by the state their tasks' hashes must name ('':
# any; running tasks keep the state they were fetched in).
ID_KEYS = (("pending", "list", "pending"), ("lease", "zset", ""),
           ("scheduled", "zset", "scheduled"), ("retry", "zset", "retry"),
           ("dead", "zset", "dead"), ("completed", "zset", "completed"),
           ("cancelled", "zset", "cancelled"))

# One finding of a window: (id, problem, what was found: a state, a field's value, an owner)
Finding = tuple[str, str, str]


class Checking(RedisCalls):
    async def check_ids(self, queue: str, key: str, kind: str, offset: int, count: int,
                        state: str = "", field: str = "", value: str = ""
                        ) -> tuple[int, list[Finding]]:
        """(length of the queue's list or zset `key`, the findings among `count` ids from
        `offset`)."""
        reply = await self._script("doctor", (self.keys(queue).pending, key),
                                   argv("doctor", step=kind, offset=offset, count=count,
                                        state=state, field=field, value=value))
        return reply[0], [_finding(r) for r in reply[1:]]

    async def check_leases(self, queue: str, offset: int, count: int, grace_ms: int
                           ) -> tuple[int, list[Finding]]:
        """(attempts in all, those among `count` from `offset` with no task, no owner, or a
        lease that ended over `grace_ms` ago)."""
        k = self.keys(queue)
        reply = await self._script("doctor", (k.lease, k.active),
                                   argv("doctor", step="lease", offset=offset, count=count,
                                        grace=grace_ms))
        return reply[0], [_finding(r) for r in reply[1:]]

    async def check_owners(self, queue: str, cursor: str, count: int
                           ) -> tuple[str, list[tuple[str, str]]]:
        """(next cursor, '0' at the end; the attempts in the active hash without a lease, as
        (id, "<fence>:<worker>"))."""
        k = self.keys(queue)
        cursor_raw, *pairs = await self._script("doctor", (k.lease, k.active), argv(
            "doctor", step="owners", cursor=cursor, count=count))
        return as_text(cursor_raw), [(as_text(i), as_text(o))
                                     for i, o in zip(pairs[::2], pairs[1::2])]

    async def lease_unleased(self, queue: str, ids: Sequence[str]) -> int:
        """Give the attempts of the active hash among `ids` that still have no lease one
        that ended, for the recoverer's path to take back; how many."""
        k = self.keys(queue)
        return await self._script("doctor", (k.lease, k.active),
                                  argv("doctor", step="unleased", attempts=ids)) if ids else 0

    async def stored_options(self, queue: str, key: str, offset: int, count: int
                             ) -> tuple[int, list[tuple[str, bytes]]]:
        """(length of the queue's list `key`, (id, stored options) of those among `count`
        ids from `offset` that have options)."""
        length, *pairs = await self._script("doctor", (self.keys(queue).pending, key), argv(
            "doctor", step="options", offset=offset, count=count))
        return length, [(as_text(i), o) for i, o in zip(pairs[::2], pairs[1::2])]

    async def bury(self, queue: str, ids: Sequence[str], why: str) -> int:
        """End the tasks among `ids` still in a pending list dead, with `why`."""
        return await self._script("doctor", (self.keys(queue).pending,),
                                  argv("doctor", step="bury", why=why, ids=ids)) if ids else 0

    async def set_aside(self, queue: str, key: str, kind: str, ids: Sequence[str]) -> int:
        """Set aside in the queue's junk the ids among `ids` whose key holds no hash, out of
        the queue's list or zset `key` (its kind as drop_missing's)."""
        if not ids:
            return 0
        return await self._script("doctor", (self.keys(queue).pending, key),
                                  argv("doctor", step="aside", kind=kind, ids=ids))

    async def junk(self, queue: str, cursor: str, count: int
                   ) -> tuple[str, list[tuple[str, int, str]]]:
        """A step of the queue's junk: (next cursor, '0' at the end; [(the record's key
        name in the queue, when it was set aside (ms), why)])."""
        cursor_raw, *pairs = await self._script("doctor", (self.keys(queue).pending,), argv(
            "doctor", step="junk", cursor=cursor, count=count))
        found = []
        for name, value in zip(pairs[::2], pairs[1::2]):
            at, _, why = as_text(value).partition(" ")
            found.append((as_text(name), as_count(at.encode()), why))
        return as_text(cursor_raw), found

    async def ordering_keys(self, queue: str, count: int) -> list[str]:
        """The ordering keys with a list in the queue (SCAN in steps of `count`)."""
        start = self.keys(queue).ordering("")
        found = []
        async for key in self.redis.scan_iter(match=_glob(start) + "*", count=count):
            found.append(as_text(key)[len(start):])
        return found

    async def ordering_waiting(self, queue: str, keys: Sequence[str]) -> int:
        """The tasks waiting behind the first of the given ordering keys' lists."""
        return await self._script("doctor", (self.keys(queue).pending,),
                                  argv("doctor", step="ord", keys=keys))

    async def counters(self, queue: str
                       ) -> tuple[int, int, int, int, int, list[str], list[str]]:
        """(waiting, held tasks, grouped, tasks in groups, tasks in batches, the patterns
        with a sorted set of held tasks, those with an earlier version's list of them), read
        together."""
        k = self.keys(queue)
        *counts, ranked, unranked = await self._script("doctor", (k.group_types, k.batches),
                                                       argv("doctor", step="counters"))
        return (*counts, [as_text(p) for p in ranked], [as_text(p) for p in unranked])

    async def drop_missing(self, queue: str, key: str, kind: str, ids: Sequence[str]) -> int:
        """Remove from a list of the queue, a sorted set of held tasks ('held': its
        members), an earlier version's list of them ('held_list'), an ordering key's list
        ('ord'), a zset or the leases ('lease') those ids with no task hash."""
        if not ids:
            return 0
        return await self._script("doctor", (self.keys(queue).pending, key),
                                  argv("doctor", step="drop", kind=kind, ids=ids))

    async def check_levels(self, queue: str, mend: bool = False
                           ) -> tuple[list[str], list[str]]:
        """(the priorities whose pending list holds tasks while `levels` does not name them:
        no worker would fetch those; the members of `levels` that are not 1 to 9); `mend`:
        name the first, set the others aside as a fetch does."""
        unmarked, strays = await self._script("doctor", (self.keys(queue).pending,), argv(
            "doctor", step="levels", mark="1" if mend else "0"))
        return [as_text(p) for p in unmarked], [as_text(p) for p in strays]

    async def settle_counter(self, counter: str, expected: int, value: int) -> bool:
        """Set a counter to `value` if it still reads `expected`."""
        return bool(await self._script("doctor", (counter,), argv(
            "doctor", step="settle", expected=expected, wanted=value)))

    async def live_workers(self, worker_ids: Sequence[str]) -> set[str]:
        """Those of the given workers whose heartbeat key exists."""
        if not worker_ids:
            return set()
        pipe = self.redis.pipeline(transaction=False)
        for worker in worker_ids:
            pipe.exists(self.global_keys.worker(worker))
        alive = await self._guard("doctor", pipe.execute())
        return {w for w, a in zip(worker_ids, alive) if a}

    async def firing_claims(self) -> dict[str, int]:
        """{schedule entry: the first fire (ms) claimed and not confirmed}."""
        raw = await self._guard("doctor", self.redis.hgetall(self.schedule_keys.firing))
        return {as_text(k): parse_claim(v)[0][0] for k, v in raw.items()}

    async def lapsed_subscriptions(self, now_ms: int) -> dict[str, list[str]]:
        """{event: subscriptions ('<subscriber> <queue>') lapsed by `now_ms`}."""
        e = self.event_keys
        events = await self._guard("doctor", self.redis.smembers(e.subscribed))
        found = {}
        for event in sorted(as_text(x) for x in events):
            lapsed = await self._guard("doctor", self.redis.zrange(
                e.subscribers(event), "-inf", now_ms, byscore=True))
            if lapsed:
                found[event] = [as_text(s) for s in lapsed]
        return found


def _finding(raw: Sequence[Any]) -> Finding:
    return as_text(raw[0]), as_text(raw[1]), as_text(raw[2])


def _glob(text: str) -> str:
    """`text` with SCAN's pattern characters escaped."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
