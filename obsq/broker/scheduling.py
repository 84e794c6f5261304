"""Schedules in Redis: clients add and remove entries; the scheduler holding the lock reads
what is due, claims each fire, enqueues its task through a Client and confirms it.

Exactly once comes from the claim, not from the lock: claim_fire moves an entry's next
fire on only from the value the scheduler read, so two schedulers that both believe they
hold the lock claim each fire once between them; the claim is recorded until its task is
enqueued (under an id made of the fire time, which Redis refuses twice), so a scheduler
killed between the claim and the enqueue leaves the fire for the next one."""

from __future__ import annotations

from obsq.broker.calls import RedisCalls
from obsq.broker.records import DueFires, ScheduleRecord
from obsq.broker.wire import REPLIES, argv, as_count


class Scheduling(RedisCalls):
    async def put_schedule(self, name: str, definition: bytes, from_app: bool = False) -> str:
        """Add or replace an entry -> 'new', 'replaced', 'same' (kept with its state) or
        'app' (refused: the App's code defines it, and only a scheduler may change it)."""
        s = self.schedule_keys
        status = await self._script("schedule", (s.entries, s.next, s.version, s.changes),
                                    argv("schedule", name=name, definition=definition,
                                         from_app=1 if from_app else 0))
        return status.decode()

    async def remove_schedule(self, name: str, from_app: bool = False) -> str:
        """Remove an entry -> 'removed', 'none' or 'app' (refused, as for put_schedule)."""
        s = self.schedule_keys
        status = await self._script(
            "unschedule", (s.entries, s.next, s.last, s.counts, s.version, s.changes),
            argv("unschedule", name=name, from_app=1 if from_app else 0))
        return status.decode()

    async def schedule_entries(self) -> dict[str, bytes]:
        """Every entry's stored definition, by name."""
        stored = await self._guard("schedule_entries",
                                   self.redis.hgetall(self.schedule_keys.entries))
        return {name.decode(errors="replace"): value for name, value in stored.items()}

    async def due_fires(self, limit: int) -> DueFires:
        s = self.schedule_keys
        r = REPLIES["due_fires"].head_of(await self._script(
            "due_fires", (s.next, s.version, s.firing), argv("due_fires", limit=limit)))
        return DueFires(
            r.now, r.version, float(r.soonest) if r.soonest else None,
            [(name.decode(errors="replace"), float(at))
             for name, at in zip(r.due[::2], r.due[1::2])],
            {name.decode(errors="replace"): claim
             for name, claim in zip(r.firing[::2], r.firing[1::2])})

    async def claim_fire(self, name: str, digest: str, expected: float, following: float,
                         fire: int = 0, claim: bytes = b"", missed: int = 0) -> bool:
        """Move the entry's next fire from `expected` to `following` (inf: parked) and
        claim the fires from `fire` on that `claim` names (0: none), counting `missed` fires;
        False when it was not `expected`, the definition's SHA-1 is not `digest`, or a fire
        of the entry is still claimed."""
        s = self.schedule_keys
        return bool(await self._script(
            "claim_fire", (s.entries, s.next, s.firing, s.counts),
            argv("claim_fire", name=name, digest=digest, expected=_score(expected),
                 following=_score(following), fire=fire, claim=claim, missed=missed)))

    async def confirm_fire(self, name: str, claim: bytes, fire: int, outcome: str,
                           count: int) -> bool:
        """End a claim of `count` fires, `fire` the latest: 'fired' (their tasks are
        enqueued), 'missed' or 'dropped'; False when another scheduler ended it first."""
        s = self.schedule_keys
        return bool(await self._script("confirm_fire",
                                       (s.firing, s.entries, s.last, s.counts),
                                       argv("confirm_fire", name=name, claim=claim, fire=fire,
                                            outcome=outcome, count=count)))

    async def wait_schedule_change(self, timeout: float) -> bool:
        """Block until an entry is added, changed or removed (True) or `timeout` passes."""
        return await self._blpop_any("wait_schedule_change", [self.schedule_keys.changes],
                                     timeout) is not None

    async def interrupt_schedule_wait(self) -> None:
        """End a wait_schedule_change of this namespace at once (a scheduler stopping)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.delete(self.schedule_keys.changes)  # one token at most, as schedule.lua leaves
        pipe.rpush(self.schedule_keys.changes, 1)
        await self._guard("wait_schedule_change", pipe.execute())

    async def schedule_table(self, limit: int) -> tuple[int, list[ScheduleRecord]]:
        """(Redis's clock in ms, up to `limit` entries, soonest next fire first)."""
        s = self.schedule_keys
        reply = await self._script("schedules", (s.next, s.entries, s.last, s.firing,
                                                 s.counts), argv("schedules", limit=limit))
        shape = REPLIES["schedules"]
        records = [
            ScheduleRecord(r.name.decode(errors="replace"), r.definition or None,
                           float(r.next), as_count(r.last) or None, r.claim or None,
                           as_count(r.fires), as_count(r.missed))
            for r in shape.records(reply)]
        return shape.head_of(reply).now, records


def _score(ms: float) -> str:
    return "+inf" if ms == float("inf") else str(int(ms))
