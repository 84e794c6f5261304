"""`obsq doctor`: a namespace's invariants checked queue by queue (each partition of a
partitioned queue as a queue: it has every key of one; it is named after its queue), in
bounded steps, and what of them can be mended safely. What it checks, per queue: every id
of `pending`, the leases and the state zsets has a task hash (not a key of another type)
whose state is that of the key it sits in (and of `pending:<p>`, whose priority is p, each
named in `levels` while it holds tasks, and `levels` names only priorities 1 to 9); the
options stored with each pending task read as a worker reads them; every id a route limit
holds (in a sorted set, or an earlier version's list) or of an ordering key's list has a
task naming that pattern or key; `waiting` counts the held tasks and those behind the first
of each ordering key; `grouped` counts the tasks in groups and in batches; no attempt is in
`active` without a lease, nor holds a lease that ended long ago while its worker is lost.
Per namespace: the flows and the live workers (obsq/ops/doctor_namespace.py); as
information (the engine mends these by itself): schedule fires claimed and not confirmed,
lapsed subscriptions, flow steps' ends not yet recorded and steps left launching; as
notices, what the workers and --repair set aside.

States the engine repairs within its sweep intervals (a lease that just ended, a lost
worker's attempts before the recoverer's next pass) are not problems: an attempt counts as
orphaned only once its lease ended `grace` seconds ago and its worker's heartbeat is gone,
and a counter that disagrees is read again before it is reported."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from obsq.broker import Broker
from obsq.broker.checking import ID_KEYS, Finding
from obsq.broker.wire import EndEntry
from obsq.engine.execution import stored_options
from obsq.errors import UnknownTaskType, UnreadableRecord
from obsq.inspection.inspector import Inspector
from obsq.inspection.partition_view import readable
from obsq.ops.doctor_namespace import EXAMPLES, STEP, aside_notices, check_flows, stalled_workers
from obsq.producer.flow_steps import record_ends
from obsq.settings import WorkerSettings
from obsq.task import PRIORITIES

ORPHAN_GRACE = 60.0  # seconds past a lease's end before a lost worker's attempt is reported
HANDED_ON_SAMPLE = 200  # scheduled tasks of a queue read for those handed on


@dataclass
class Problem:
    """One kind of damage in one queue: `what`, how many, and a few of the ids."""

    queue: str
    what: str
    count: int
    examples: list[str]
    # what --repair does: drop, aside, recover, unleased, bury, count, mark, unlevel, fail,
    # flow_aside ('': nothing safe)
    repair: str = ""
    key: str = ""  # the list or zset the ids are in, and its kind ('lease' for the leases)
    kind: str = ""
    ids: list[Any] = field(default_factory=list, repr=False)  # every id found, for repair
    whys: list[str] = field(default_factory=list, repr=False)  # each one's, to record

    def line(self) -> str:
        shown = ", ".join(self.examples)
        return f"{readable(self.queue)}: {self.what}: {self.count}" + (
            f" (e.g. {shown})" if shown else "")


@dataclass
class Diagnosis:
    namespace: str
    queues: list[str]
    problems: list[Problem]
    notes: list[str]  # transient states the engine mends by itself
    repairs: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.problems


async def stalls(inspector: Inspector) -> list[str]:
    """Work that waits while every invariant holds, so that the checks above cannot show it:
    pending tasks of a queue no live worker serves (a worker in another namespace, or
    without --queues for it), and tasks handed on because no worker that took them had a
    handler for their type (read among the first HANDED_ON_SAMPLE scheduled)."""
    served = {q for w in await inspector.workers() for q in w.queues}
    notices = []
    for q in await inspector.queues():
        if q.depth.get("pending") and q.name not in served and not q.paused:
            notices.append(f"{q.name}: {q.depth['pending']} pending task(s), the oldest "
                           f"waiting {q.latency:.0f} s, and no live worker serves the queue")
        if q.depth.get("scheduled"):
            page = await inspector.tasks(q.name, "scheduled", limit=HANDED_ON_SAMPLE)
            types = Counter(t.type for t in page.tasks
                            if t.error.startswith(UnknownTaskType.__name__))
            if types:
                notices.append(f"{q.name}: {sum(types.values())} task(s) handed on by workers "
                               "with no handler for their type: " + ", ".join(
                                   f"{t} ({n})" for t, n in types.most_common(EXAMPLES)))
    return notices


class Doctor:
    def __init__(self, broker: Broker, grace: float = ORPHAN_GRACE) -> None:
        self.broker = broker
        self.grace = grace

    async def diagnose(self) -> Diagnosis:
        queues = await self.broker.queues()
        problems: list[Problem] = []
        for queue in queues:
            problems += await self.examine(queue)
        found, notes = await check_flows(self.broker, queues)
        problems += [Problem("flows", what, len(ids), examples,
                             "flow_aside" if whys else "fail", ids=ids, whys=whys)
                     for what, examples, ids, whys in found]
        stalled, said = await stalled_workers(self.broker)
        if stalled:
            problems.append(Problem("workers", "live workers whose event loop or fetch loop "
                                    "stands still (they serve nothing)", len(stalled),
                                    said[:EXAMPLES], ids=stalled))
        return Diagnosis(self.broker.namespace, queues, problems, await self.notes() + notes)

    async def set_aside(self, queues: list[str]) -> list[str]:
        """Notices of what the workers and --repair set aside (doctor_namespace.aside_notices)."""
        return await aside_notices(self.broker, queues)

    async def examine(self, queue: str) -> list[Problem]:
        """The problems of one queue."""
        found = _Findings(queue)
        k = self.broker.keys(queue)
        for name, kind, state in ID_KEYS:
            if name == "lease":
                await self._leases(queue, found)
            else:
                await self._ids(queue, getattr(k, name), kind, name, state, found)
        for priority in PRIORITIES[1:]:  # the pending lists of the other priorities
            await self._ids(queue, k.pending_of(priority), "list", f"pending:{priority}",
                            "pending", found, "pri", str(priority))
        unmarked, strays = await self.broker.check_levels(queue)
        found.add("priorities whose pending list is not named in levels (not fetched)",
                  unmarked, "mark")
        found.add("priorities named in levels that are not 1 to 9 (each fetch set them "
                  "aside; before, every fetch failed)", strays, "unlevel")
        for priority in PRIORITIES:
            await self._options(queue, k.pending_of(priority), found)
        await self._unleased(queue, found)
        await self._counters(queue, found)
        return found.problems()

    async def _options(self, queue: str, key: str, found: _Findings) -> None:
        """Pending tasks whose stored options a worker cannot read: it would end them dead
        at once, with the error --repair records (the worker's own)."""
        offset = 0
        while True:
            length, page = await self.broker.stored_options(queue, key, offset, STEP)
            for task_id, options in page:
                try:
                    stored_options(options)
                except UnreadableRecord as exc:
                    found.add("pending tasks whose stored options a worker cannot read (it "
                              "ends them dead unrun)", [task_id], "bury", key,
                              shown=[f"{task_id}: {exc}"],
                              whys=[f"{type(exc).__name__}: {exc}"])
            offset += STEP
            if offset >= length:
                return

    async def _unleased(self, queue: str, found: _Findings) -> None:
        """Attempts in `active` without a lease: a live worker's next extension writes its
        lease again; a lost worker's is taken back by --repair as the recoverer would."""
        cursor, unleased = "0", []
        while True:
            cursor, page = await self.broker.check_owners(queue, cursor, STEP)
            unleased += page
            if cursor == "0":
                break
        live = await self.broker.live_workers(sorted({o.split(":", 1)[-1]
                                                      for _, o in unleased}))
        found.add("attempts in active without a lease, of workers that are gone",
                  [i for i, o in unleased if o.split(":", 1)[-1] not in live], "unleased")
        found.add("attempts in active without a lease, of live workers (their next lease "
                  "extension writes it again)",
                  [i for i, o in unleased if o.split(":", 1)[-1] in live])

    async def repair(self, diagnosis: Diagnosis) -> None:
        """Mend what can be mended safely, then count again: drop ids with no task behind
        them, set aside what cannot be read (records that are not task hashes, priority
        levels that are not 1 to 9, flows that cannot be moved on), end tasks whose options
        cannot be read dead, take orphaned attempts and those without a lease back through
        the recoverer's path, set counters to what they count (last, as dropping a held id
        changes what `waiting` should be)."""
        for problem in diagnosis.problems:
            where = readable(problem.queue)
            if problem.repair == "drop":
                n = await self.broker.drop_missing(problem.queue, problem.key, problem.kind,
                                                   problem.ids)
                diagnosis.repairs.append(f"{where}: dropped {n} id(s) with no task "
                                         f"from {problem.key}")
            elif problem.repair == "aside":
                n = await self.broker.set_aside(problem.queue, problem.key, problem.kind,
                                                problem.ids)
                diagnosis.repairs.append(f"{where}: set {n} record(s) that are not task "
                                         f"hashes aside from {problem.key} in the queue's junk")
            elif problem.repair == "bury":
                n = 0
                for why in sorted(set(problem.whys)):
                    n += await self.broker.bury(problem.queue, [
                        i for i, w in zip(problem.ids, problem.whys) if w == why], why)
                diagnosis.repairs.append(f"{where}: ended {n} task(s) whose stored options "
                                         "cannot be read dead, as a worker does")
            elif problem.repair == "fail":
                await record_ends(self.broker, [
                    EndEntry(task_id, "dead", b"its task was gone (obsq doctor --repair)"
                             ).written() for task_id in problem.ids])
                diagnosis.repairs.append(f"flows: recorded {len(problem.ids)} step(s) whose "
                                         "task was gone as dead, failing their flow")
            elif problem.repair == "flow_aside":
                for flow_id, why in zip(problem.ids, problem.whys):
                    await self.broker.set_flow_aside(flow_id, why)
                diagnosis.repairs.append(f"flows: set {len(problem.ids)} flow(s) that cannot "
                                         "be moved on aside")
            elif problem.repair in ("mark", "unlevel"):
                await self.broker.check_levels(problem.queue, mend=True)
                diagnosis.repairs.append(
                    f"{where}: named priorities {problem.ids} in levels"
                    if problem.repair == "mark" else f"{where}: set the pending lists of "
                    f"priorities {problem.ids} aside in the queue's junk")
            elif problem.repair == "recover":
                n = await self._recover(problem.queue)
                diagnosis.repairs.append(f"{where}: took back {n} orphaned "
                                         "attempt(s) to pending (or dead past max_recoveries)")
            elif problem.repair == "unleased":
                await self.broker.lease_unleased(problem.queue, problem.ids)
                n = await self._recover(problem.queue)
                diagnosis.repairs.append(f"{where}: took back {n} attempt(s) without a lease "
                                         "to pending, as the recoverer does")
        for queue in sorted({p.queue for p in diagnosis.problems
                             if p.repair not in ("", "fail", "flow_aside")}):
            diagnosis.repairs += await self._recount(queue)

    async def notes(self) -> list[str]:
        now = int(self.broker.clock.time() * 1000)
        notes = [f"schedule {name}: fire at {fire} ms claimed and not confirmed (the next "
                 "scheduler finishes or counts it missed)"
                 for name, fire in sorted((await self.broker.firing_claims()).items())]
        for event, subs in (await self.broker.lapsed_subscriptions(now)).items():
            notes.append(f"event {event}: {len(subs)} lapsed subscription(s) (dropped at the "
                         f"next publish): {', '.join(subs[:EXAMPLES])}")
        return notes

    async def _ids(self, queue: str, key: str, kind: str, name: str, state: str,
                   found: _Findings, field: str = "", value: str = "", drop: str = "") -> None:
        """Check the ids of list or zset `key` (`kind`: 'list', 'zset', or 'held' for a
        sorted set of held tasks); `drop`: how drop_missing mends it, when not by `kind`."""
        offset = 0
        while True:
            length, findings = await self.broker.check_ids(queue, key, kind, offset, STEP,
                                                           state, field, value)
            found.sort_out(name, key, drop or kind, findings)
            offset += STEP
            if offset >= length:
                return

    async def _leases(self, queue: str, found: _Findings) -> None:
        offset, expired = 0, []
        while True:
            length, findings = await self.broker.check_leases(queue, offset, STEP,
                                                              int(self.grace * 1000))
            found.sort_out("active", self.broker.keys(queue).lease, "lease",
                           [f for f in findings if f[1] != "expired"])
            expired += [f for f in findings if f[1] == "expired"]
            offset += STEP
            if offset >= length:
                break
        owners = {i: o.split(":", 1)[-1] for i, _, o in expired}
        live = await self.broker.live_workers(sorted(set(owners.values())))
        found.add(f"active attempts of lost workers, their lease ended over {self.grace:g}s "
                  "ago", [i for i, w in owners.items() if w not in live], "recover")

    async def _counters(self, queue: str, found: _Findings) -> None:
        k = self.broker.keys(queue)
        _, _, _, _, _, ranked, unranked = await self.broker.counters(queue)
        for pattern in ranked:
            held = k.held(pattern)
            await self._ids(queue, held, "held", held[len(k.prefix):], "", found, "held",
                            pattern)
        for pattern in unranked:
            held = k.held_unranked(pattern)
            await self._ids(queue, held, "list", held[len(k.prefix):], "", found, "held",
                            pattern, drop="held_list")
        ordering = await self.broker.ordering_keys(queue, STEP)
        for key in ordering:
            listed = k.ordering(key)
            await self._ids(queue, listed, "list", listed[len(k.prefix):], "", found, "ordk",
                            key, drop="ord")
        first = await self._count(queue, ordering)
        if first != await self._count(queue, ordering):  # moving: not a drift
            return
        waiting, should_wait, grouped, should_group = first
        if waiting != should_wait:
            found.count(f"counter waiting is {waiting}, the held and key-waiting tasks are "
                        f"{should_wait}", abs(waiting - should_wait))
        if grouped != should_group:
            found.count(f"counter grouped is {grouped}, the tasks in groups and batches are "
                        f"{should_group}", abs(grouped - should_group))

    async def _count(self, queue: str, ordering: list[str]) -> tuple[int, int, int, int]:
        """(waiting, what it should be, grouped, what it should be)."""
        waiting, held, grouped, in_groups, in_batches, _, _ = await self.broker.counters(queue)
        behind = 0
        for i in range(0, len(ordering), STEP):
            behind += await self.broker.ordering_waiting(queue, ordering[i:i + STEP])
        return waiting, held + behind, grouped, in_groups + in_batches

    async def _recount(self, queue: str) -> list[str]:
        k = self.broker.keys(queue)
        ordering = await self.broker.ordering_keys(queue, STEP)
        waiting, should_wait, grouped, should_group = await self._count(queue, ordering)
        done = []
        for key, now, should in ((k.waiting, waiting, should_wait),
                                 (k.grouped, grouped, should_group)):
            if now != should and await self.broker.settle_counter(key, now, should):
                done.append(f"{readable(queue)}: set {key.rsplit(':', 1)[-1]} from {now} to "
                            f"{should}")
        return done

    async def _recover(self, queue: str) -> int:
        """Hand the queue's expired attempts back as the recoverer does, with the workers'
        max_recoveries (OBSQ_MAX_RECOVERIES, as they read it)."""
        max_recoveries = WorkerSettings.from_env().max_recoveries
        total = 0
        while True:
            requeued, killed, *_ = await self.broker.recover(queue, max_recoveries, STEP)
            total += requeued + killed
            if requeued + killed < STEP:
                return total


class _Findings:
    """The findings of one queue's steps, gathered by kind into problems."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.found: dict[tuple[str, str, str, str], list[tuple[str, str, str]]] = {}
        self.counts: dict[str, int] = {}

    def add(self, what: str, ids: list[str], repair: str = "", key: str = "", kind: str = "",
            shown: list[str] | None = None, whys: list[str] | None = None) -> None:
        into = self.found.setdefault((what, repair, key, kind), [])
        into += zip(ids, shown or ids, whys or [""] * len(ids))

    def count(self, what: str, off_by: int) -> None:
        self.counts[what] = off_by

    def sort_out(self, name: str, key: str, kind: str, findings: list[Finding]) -> None:
        by_problem: dict[str, list[Finding]] = defaultdict(list)
        for f in findings:
            by_problem[f[1]].append(f)
        for problem, fs in sorted(by_problem.items()):
            ids = [i for i, _, _ in fs]
            if problem == "missing":
                self.add(f"ids with no task in {name}", ids, "drop", key, kind)
            elif problem == "unreadable":
                self.add(f"records in {name} that are not task hashes (a worker sets them "
                         "aside)", ids, "aside", key, kind,
                         shown=[f"{i}={s}" for i, _, s in fs])
            elif problem == "unowned":
                self.add(f"leases in {name} with no attempt in active", ids)
            else:  # a state, or the field naming the list's pattern or key
                field = "state" if problem == "state" else f"field {problem}"
                self.add(f"tasks in {name} whose {field} names another place", ids,
                         shown=[f"{i}={s or '(none)'}" for i, _, s in fs])

    def problems(self) -> list[Problem]:
        found = [Problem(self.queue, what, len(entries),
                         [s for _, s, _ in entries[:EXAMPLES]], repair, key, kind,
                         [i for i, _, _ in entries],
                         [w for _, _, w in entries] if repair == "bury" else [])
                 for (what, repair, key, kind), entries in self.found.items() if entries]
        return found + [Problem(self.queue, what, n, [], "count")
                        for what, n in self.counts.items()]
