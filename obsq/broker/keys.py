"""The key layout, defined once. Every key of a queue carries the queue name as a Redis
Cluster hash tag, so each Lua script touches a single slot."""

from __future__ import annotations

TASK_STATES = ("pending", "active", "scheduled", "retry", "dead", "completed", "cancelled")
# What a queue's depth counts: its tasks by state, and the grouped tasks waiting for their
# aggregator (kept in groups, not in a state's list).
DEPTH_STATES = (*TASK_STATES, "aggregating")
FLOW_WATCHER = "~flows"  # the pseudo-client watching every flow step (_prelude.lua)


class QueueKeys:
    __slots__ = (
        "active",
        "batches",
        "cancelled",
        "completed",
        "dead",
        "ended",
        "fence",
        "group_types",
        "grouped",
        "lease",
        "levels",
        "paused",
        "pending",
        "prefix",
        "queue",
        "retry",
        "scheduled",
        "stats",
        "wake",
        "watched",
    )

    def __init__(self, namespace: str, queue: str) -> None:
        self.queue = queue
        self.prefix = f"{namespace}:{{{queue}}}:"
        self.pending = self.prefix + "pending"  # list of ids: pushed left, popped right
        # set of the priorities above 0 whose lists (pending:<p>, kept like pending) may hold
        # tasks; a task of priority 0 is in pending itself (obsq/priority.py)
        self.levels = self.prefix + "levels"
        self.lease = self.prefix + "lease"  # zset id -> lease expiry (ms): the active tasks
        self.active = self.prefix + "active"  # hash id -> "<fence>:<worker id>" of each attempt
        self.fence = self.prefix + "fence"  # counter the fencing tokens are drawn from
        self.scheduled = self.prefix + "scheduled"  # zset id -> due time (ms)
        self.retry = self.prefix + "retry"  # zset id -> due time (ms)
        self.dead = self.prefix + "dead"  # zset id -> time of death (ms)
        self.completed = self.prefix + "completed"  # zset id -> end of retention (ms)
        self.cancelled = self.prefix + "cancelled"  # zset id -> time of cancellation (ms)
        # zset id -> the time until which a deleted task's producer-chosen id is refused (ms)
        self.ended = self.prefix + "ended"
        self.wake = self.prefix + "wake"  # list of tokens idle workers block on
        self.paused = self.prefix + "paused"  # exists while the queue is paused
        self.watched = self.prefix + "watched"  # hash id -> ids of clients waiting in result()
        self.stats = self.prefix + "stats"  # ":<minute>": hash outcome -> count, for an hour
        # Task groups (group.lua, claim_batches.lua, end_batch.lua describe the rest)
        self.group_types = self.prefix + "gtypes"  # set of the task types with groups
        self.grouped = self.prefix + "grouped"  # counter: grouped tasks not yet aggregated
        self.batches = self.prefix + "batches"  # zset batch id -> end of its claim (ms)

    def pending_of(self, priority: int) -> str:
        """The list of the pending tasks of a priority."""
        return self.pending + (f":{priority}" if priority else "")

    def task(self, task_id: str) -> str:
        return self.prefix + "t:" + task_id

    def progress(self, task_id: str) -> str:
        return self.prefix + "progress:" + task_id

    def cancels(self, worker_id: str) -> str:
        return self.prefix + "cancel:" + worker_id  # list of a worker's tasks to cancel

    def inbox(self, client_id: str) -> str:
        return self.prefix + "inbox:" + client_id  # list of watched tasks' ends for a client

    @property
    def flow_inbox(self) -> str:
        return self.inbox(FLOW_WATCHER)  # list of flow steps' ends, until recorded

    def group(self, task_type: str, group: str) -> str:
        return self.prefix + "grp:" + task_type + " " + group  # list of a group's ids

    def by_state(self, state: str) -> str:
        return self.lease if state == "active" else getattr(self, state)


class GlobalKeys:
    __slots__ = ("dataset", "flow_look", "flows", "namespace", "partitions", "queues",
                 "workers")

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.queues = f"{namespace}:queues"  # set of every queue ever enqueued to
        # hash queue -> its number of partitions (obsq/partitions.py), as its workers' App
        # declares it: what producers without that App read
        self.partitions = f"{namespace}:partitions"
        self.workers = f"{namespace}:workers"  # zset worker id -> last heartbeat (ms)
        # a token the first worker writes, no expiry: missing, the data set is gone
        self.dataset = f"{namespace}:dataset"
        # the flows, under one hash tag (flow_index.lua): zsets flow id -> when it was
        # written, and -> when the flow sweep looks at it next (ms)
        self.flows = f"{namespace}:{{flows}}:index"
        self.flow_look = f"{namespace}:{{flows}}:look"

    def worker(self, worker_id: str) -> str:
        return f"{self.namespace}:worker:{worker_id}"  # hash describing a live worker

    def wake(self, worker_id: str) -> str:
        return f"{self.namespace}:worker:{worker_id}:wake"  # a worker interrupting its wait

    def lock(self, name: str) -> str:
        return f"{self.namespace}:lock:{name}"


class ScheduleKeys:
    """Every key of the schedules of a namespace shares one hash tag, so that one script
    claims a fire. A queue named "schedules" shares that tag too: these names must stay
    apart from QueueKeys' (a test holds them to it)."""

    __slots__ = ("changes", "counts", "entries", "firing", "last", "next", "prefix", "version")

    def __init__(self, namespace: str) -> None:
        self.prefix = f"{namespace}:{{schedules}}:"
        self.entries = self.prefix + "entries"  # hash name -> definition (JSON)
        self.next = self.prefix + "next"  # zset name -> next fire (ms); 0: not picked up yet
        self.last = self.prefix + "last"  # hash name -> last fire enqueued (ms)
        self.firing = self.prefix + "firing"  # hash name -> "<fire ms> <definition>" claimed
        self.counts = self.prefix + "counts"  # hash "fires:<name>" / "missed:<name>" -> count
        self.version = self.prefix + "version"  # counter: bumped by every change of an entry
        self.changes = self.prefix + "changes"  # list (one token) the scheduler blocks on


class FlowKeys:
    """The keys of one flow (a chain or chord) share its hash tag, so that one script records
    a step's end and decides the next (scripts/_prelude_flows.lua). A queue named
    "flow:<id>" would share it: flow ids are 32 random hex digits."""

    __slots__ = ("flow", "launching", "results")

    def __init__(self, namespace: str, flow_id: str) -> None:
        prefix = f"{namespace}:{{flow:{flow_id}}}:"
        self.flow = prefix + "flow"  # hash: state, steps (s:, k:, d:, q:, m: <step>), error
        self.results = prefix + "res"  # hash step -> its result (JSON), or '!' and its error
        self.launching = prefix + "launching"  # set of steps decided and not yet enqueued


class EventKeys:
    """The subscriptions of a namespace's events share one hash tag. A queue named "events"
    shares it too: these names stay apart from QueueKeys' (a test holds them to it)."""

    __slots__ = ("prefix", "subscribed")

    def __init__(self, namespace: str) -> None:
        self.prefix = f"{namespace}:{{events}}:"
        self.subscribed = self.prefix + "subscribed"  # set of the events with subscribers

    def subscribers(self, event: str) -> str:
        return self.prefix + "sub:" + event  # zset "<subscriber> <queue>" -> lapse time (ms)
