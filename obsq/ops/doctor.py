"""`obsq doctor`: a namespace's invariants checked queue by queue (each partition of a
partitioned queue as a queue: it has every key of one; it is named after its queue), in
bounded steps, and what of them can be mended safely. What it checks, per queue: every id
of `pending`, the leases and the state zsets has a task hash whose state is that of the
key it sits in (and of `pending:<p>`, whose priority is p, each named in `levels` while it
holds tasks); every id a route limit holds (in a sorted set, or an earlier version's list)
or of an ordering key's list has a task naming that pattern or key; `waiting` counts the
held tasks and those behind the first of each ordering key; `grouped` counts the tasks in
groups and in batches; no attempt is in `active` without a lease, nor holds a lease that
ended long ago while its worker is lost.
Per namespace: no running flow waits for a step whose task is gone; as information (the
engine mends these by itself): schedule fires claimed and not confirmed, lapsed
subscriptions, flow steps' ends not yet recorded and steps left launching.

States the engine repairs within its sweep intervals (a lease that just ended, a lost
worker's attempts before the recoverer's next pass) are not problems: an attempt counts as
orphaned only once its lease ended `grace` seconds ago and its worker's heartbeat is gone,
and a counter that disagrees is read again before it is reported."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

from obsq.broker import Broker
from obsq.broker.checking import ID_KEYS, Finding
from obsq.broker.wire import EndEntry
from obsq.errors import UnknownTaskType
from obsq.flow import FlowInfo
from obsq.inspection.inspector import Inspector
from obsq.inspection.partition_view import readable
from obsq.producer.flow_steps import record_ends
from obsq.settings import WorkerSettings
from obsq.task import PRIORITIES

STEP = 1000  # ids per script call: bounds how long one step holds Redis
EXAMPLES = 5  # ids named per problem
ORPHAN_GRACE = 60.0  # seconds past a lease's end before a lost worker's attempt is reported
HANDED_ON_SAMPLE = 200  # scheduled tasks of a queue read for those handed on


@dataclass
class Problem:
    """One kind of damage in one queue: `what`, how many, and a few of the ids."""

    queue: str
    what: str
    count: int
    examples: list[str]
    repair: str = ""  # what --repair does: drop, recover, count, mark ('': nothing safe)
    key: str = ""  # the list or zset the ids are in, and its kind ('lease' for the leases)
    kind: str = ""
    ids: list[str] = field(default_factory=list, repr=False)  # every id found, for repair

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
        lost, notes = await self.flows(queues)
        return Diagnosis(self.broker.namespace, queues, problems + lost,
                         await self.notes() + notes)

    async def flows(self, queues: list[str]) -> tuple[list[Problem], list[str]]:
        """The flows: a running flow's enqueued step whose task is gone with no end waiting
        in its queue's flow inbox can never end (a problem; --repair records it dead, which
        fails the flow); ends waiting in flow inboxes, steps left launching and index entries
        of flows gone are information (the workers' FlowLoop mends them)."""
        waiting: set[str] = set()
        notes = []
        for queue in queues:
            entries = await self.broker.flow_ends(queue, STEP)
            waiting |= {EndEntry.read(e).id for e in entries}
            if entries:
                notes.append(f"{readable(queue)}: {len(entries)} flow step end(s) not yet "
                             "recorded in "
                             "their flow (a worker's FlowLoop records them)")
        gone, launching, suspects = 0, 0, []
        for flow_id in await self._flow_ids():
            summary = await self.broker.flow_state(flow_id)  # its steps only when running
            info = await self._flow(flow_id) if summary and summary.state == "running" else None
            if summary is None:
                gone += 1
            if info is None or info.state != "running":
                continue
            launching += sum(s.state == "launching" for s in info.steps)
            enqueued = [s for s in info.steps if s.state == "enqueued" and s.id not in waiting]
            found = await self.broker.tasks_exist([(s.queue, s.id) for s in enqueued])
            suspects += [(flow_id, s) for s, there in zip(enqueued, found) if not there]
        lost = []
        for flow_id, step in suspects:  # read again: its end may have been recorded since
            info = await self._flow(flow_id)
            if info is not None and info.state == "running" and \
                    info.steps[step.index].state == "enqueued" and \
                    not (await self.broker.tasks_exist([(step.queue, step.id)]))[0]:
                lost.append(step.id)
        notes += [f"{gone} flow(s) indexed and gone (the flow sweep forgets them)"] if gone \
            else []
        notes += [f"{launching} flow step(s) launching (the flow sweep enqueues them)"] \
            if launching else []
        problems = [Problem("flows", "steps of running flows whose task is gone (the flow "
                            "cannot end)", len(lost), lost[:EXAMPLES], "fail", ids=lost)] \
            if lost else []
        return problems, notes

    async def _flow_ids(self) -> list[str]:
        ids: list[str] = []
        while True:
            total, page = await self.broker.flow_page(len(ids), STEP)
            ids += page
            if not page or len(ids) >= total:
                return ids

    async def _flow(self, flow_id: str) -> FlowInfo | None:
        fields, results = await self.broker.flow_record(flow_id)
        return FlowInfo.from_record(flow_id, fields, results) if fields else None

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
        found.add("priorities whose pending list is not named in levels (not fetched)",
                  await self.broker.unmarked_levels(queue), "mark")
        cursor = "0"
        while True:
            cursor, unleased = await self.broker.check_owners(queue, cursor, STEP)
            found.add("attempts in active without a lease", unleased)
            if cursor == "0":
                break
        await self._counters(queue, found)
        return found.problems()

    async def repair(self, diagnosis: Diagnosis) -> None:
        """Mend what can be mended safely, then count again: drop ids with no task behind
        them, take orphaned attempts back through the recoverer's path, set counters to
        what they count (last, as dropping a held id changes what `waiting` should be)."""
        for problem in diagnosis.problems:
            where = readable(problem.queue)
            if problem.repair == "drop":
                n = await self.broker.drop_missing(problem.queue, problem.key, problem.kind,
                                                   problem.ids)
                diagnosis.repairs.append(f"{where}: dropped {n} id(s) with no task "
                                         f"from {problem.key}")
            elif problem.repair == "fail":
                await record_ends(self.broker, [
                    EndEntry(task_id, "dead", b"its task was gone (obsq doctor --repair)"
                             ).written() for task_id in problem.ids])
                diagnosis.repairs.append(f"flows: recorded {len(problem.ids)} step(s) whose "
                                         "task was gone as dead, failing their flow")
            elif problem.repair == "mark":
                await self.broker.unmarked_levels(problem.queue, mark=True)
                diagnosis.repairs.append(f"{where}: named priorities {problem.ids} "
                                         "in levels")
            elif problem.repair == "recover":
                n = await self._recover(problem.queue)
                diagnosis.repairs.append(f"{where}: took back {n} orphaned "
                                         "attempt(s) to pending (or dead past max_recoveries)")
        for queue in sorted({p.queue for p in diagnosis.problems if p.repair != "fail"}):
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
        self.found: dict[tuple[str, str, str, str], list[tuple[str, str]]] = {}
        self.counts: dict[str, int] = {}

    def add(self, what: str, ids: list[str], repair: str = "", key: str = "", kind: str = "",
            shown: list[str] | None = None) -> None:
        into = self.found.setdefault((what, repair, key, kind), [])
        into += zip(ids, shown or ids)

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
            elif problem == "unowned":
                self.add(f"leases in {name} with no attempt in active", ids)
            else:  # a state, or the field naming the list's pattern or key
                field = "state" if problem == "state" else f"field {problem}"
                self.add(f"tasks in {name} whose {field} names another place", ids,
                         shown=[f"{i}={s or '(none)'}" for i, _, s in fs])

    def problems(self) -> list[Problem]:
        found = [Problem(self.queue, what, len(pairs), [s for _, s in pairs[:EXAMPLES]],
                         repair, key, kind, [i for i, _ in pairs])
                 for (what, repair, key, kind), pairs in self.found.items() if pairs]
        return found + [Problem(self.queue, what, n, [], "count")
                        for what, n in self.counts.items()]
