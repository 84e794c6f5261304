"""The key layout, defined once. Every key of a queue carries the queue name as a Redis
Cluster hash tag, so each Lua script touches a single slot.

`KEY_NAMES` is every key name built from a tag's prefix ("<ns>:{<tag>}:"): the classes
below build theirs from it, and a script builds the same key as `prefix .. @key_<name>`
(`prefix` is its first key's, _prelude.lua; the name's text is put in at load, scripts.py),
so the two never spell a name apart. `TASK_FIELDS` are the fields of a task's hash, which
tests/test_wire.py holds the scripts and the Python readers to."""

from __future__ import annotations

TASK_STATES = ("pending", "active", "scheduled", "retry", "dead", "completed", "cancelled")
# What a queue's depth counts: its tasks by state, and the grouped tasks waiting for their
# aggregator (kept in groups, not in a state's list).
DEPTH_STATES = (*TASK_STATES, "aggregating")
FLOW_WATCHER = "~flows"  # the pseudo-client watching every flow step (_prelude.lua)

KEY_NAMES = {
    # a queue's ("<ns>:{<queue>}:"); a name ending in ':' is followed by what it is of
    "pending": "pending",  # list of ids: pushed left, popped right
    # set of the priorities above 0 whose lists (pending:<p>, kept like pending) may hold
    # tasks; a task of priority 0 is in pending itself (obsq/task.py)
    "levels": "levels",
    "lease": "lease",  # zset id -> lease expiry (ms): the active tasks
    "active": "active",  # hash id -> "<fence>:<worker id>" of each attempt
    "fence": "fence",  # counter the fencing tokens are drawn from
    "scheduled": "scheduled",  # zset id -> due time (ms)
    "retry": "retry",  # zset id -> due time (ms)
    "dead": "dead",  # zset id -> time of death (ms)
    "completed": "completed",  # zset id -> end of retention (ms)
    "cancelled": "cancelled",  # zset id -> time of cancellation (ms)
    # zset id -> the time until which a deleted task's producer-chosen id is refused (ms)
    "ended": "ended",
    "wake": "wake",  # list of tokens idle workers block on
    "paused": "paused",  # exists while the queue is paused
    "watched": "watched",  # hash id -> ids of clients waiting in result()
    "stats": "stats",  # ":<minute>": hash outcome -> count, for an hour
    "task": "t:",  # hash of a task: TASK_FIELDS
    "progress": "progress:",  # a task's last update_state
    "cancels": "cancel:",  # list of a worker's tasks to cancel
    "inbox": "inbox:",  # list of watched tasks' ends for a client
    "unique": "unique:",  # a unique task's digest -> its id, for its unique_for
    # "<type> <debounce key>" -> "<id> <first ms>": the task waiting for its burst of
    # enqueues to end, and when the burst began; kept until DEBOUNCE_KEEP_MS past its due
    # time (enqueue.lua)
    "debounce": "debounce:",
    "memory_budget": "memok",  # enqueue's budget below the producers' share (above_share)
    # hash: a record a script could not read (a task's key holding no hash, a pending list
    # of no priority), by its key's name in the queue -> "<ms> <why>" (set_aside)
    "junk": "junk",
    # a key of the queue's own that held another type (written outside obsq), moved here as
    # found by the name it had in the queue (key_aside); named in the junk
    "aside": "aside:",
    # route limits and ordering keys (_prelude_limits.lua)
    "running": "running:",  # set of a route slot's running ids
    "rate": "rate:",  # a route slot's rate window
    # zset "<place>:<id>" -> rank of the tasks a route pattern's limit holds back, ranked
    # as pending tasks are (_prelude_limits.lua: hold_back)
    "held": "hold:",
    "holding": "holds",  # set of the patterns with held ids
    "held_places": "holdseq",  # counter the places of held tasks are drawn from
    # an earlier version's holds, lists of ids (oldest at the right) and the set of their
    # patterns: read, and let out by the forwarder to be held anew by rank
    "held_unranked": "held:",
    "holding_unranked": "holding",
    "waiting": "waiting",  # counter: tasks held back or waiting behind an ordering key
    "ordering": "ord:",  # list of an ordering key's ids, the running one first
    "ordering_waiting": "ordwait",  # zset id -> when it began waiting behind its key (ms)
    # fairness keys (_prelude.lua: push_fair): the pending tasks of a key, zset id -> their
    # order within it (priority first, then their place); the ring of the keys with waiting
    # tasks, plus '' for the plain pending lists while any key waits; the zset of those keys
    # -> their waiting tasks; the count of the keyed tasks waiting (they count as pending);
    # the counter their places are drawn from; the zset of those keys -> when the task next
    # in line of each became due (ms: the queue's latency counts the oldest)
    "fair": "fair:",
    "fair_ring": "fairring",
    "fair_waiting": "fairkeys",
    "fair_count": "fairn",
    "fair_places": "fairseq",
    "fair_age": "fairage",
    # task groups (group.lua, claim_batches.lua, end_batch.lua describe the rest)
    "group_types": "gtypes",  # set of the task types with groups
    "grouped": "grouped",  # counter: grouped tasks not yet aggregated
    "batches": "batches",  # zset batch id -> end of its claim (ms)
    "batch": "batch:",  # hash of a claimed batch
    "group": "grp:",  # "<type> <group>": list of a group's ids
    "group_sizes": "gsize:",  # "<type>": zset group -> its size
    "group_firsts": "gfirst:",  # "<type>": zset group -> when its first task came (ms)
    "group_lasts": "glast:",  # "<type>": zset group -> when its last task came (ms)
    # the schedules' ("<ns>:{schedules}:"); ScheduleKeys says what each holds
    "entries": "entries",
    "next": "next",
    "last": "last",
    "firing": "firing",
    "counts": "counts",
    "version": "version",
    "changes": "changes",
    # a flow's ("<ns>:{flow:<id>}:"); FlowKeys says what each holds
    "flow": "flow",
    "results": "res",
    "launching": "launching",
    "flow_ended": "ended",
    # the events' ("<ns>:{events}:"); EventKeys says what each holds
    "subscribed": "subscribed",
    "subscribers": "sub:",
}

# The fields of a task's hash (`KEY_NAMES["task"]`): name -> the field as stored.
TASK_FIELDS = {
    "type": "type", "state": "state", "payload": "payload",
    "binary_payload": "bin",  # the payload, when the producer's own bytes
    "headers": "headers", "options": "opts", "enqueued": "enq", "due": "due", "done": "done",
    "retried": "retried", "error": "error", "traceback": "tb", "result": "result",
    "priority": "pri", "unique_key": "uniq", "own_id": "own", "ordering_key": "ordk",
    "group": "grp",
    "batch": "batch", "slot": "slot", "held_by": "held", "held_place": "hc",
    "cancel": "cancel", "settled_by": "fin", "isolated": "iso", "suspect": "sus",
    "recoveries": "recov", "first_unknown": "unk0", "unknown_count": "unkn",
    "reserved": "rsv", "waited": "ow", "debounce_key": "dbk", "fairness_key": "fk",
    "expires": "exp",  # when (ms) it expires if not started by then (enqueue's `expires`)
}


class QueueKeys:
    __slots__ = (
        "active",
        "batches",
        "cancelled",
        "completed",
        "dead",
        "ended",
        "fair_count",
        "fair_ring",
        "fair_waiting",
        "fence",
        "group_types",
        "grouped",
        "junk",
        "lease",
        "levels",
        "paused",
        "pending",
        "prefix",
        "queue",
        "retry",
        "scheduled",
        "stats",
        "waiting",
        "wake",
        "watched",
    )

    def __init__(self, namespace: str, queue: str) -> None:
        self.queue = queue
        self.prefix = prefix = f"{namespace}:{{{queue}}}:"
        self.pending = prefix + KEY_NAMES["pending"]
        self.levels = prefix + KEY_NAMES["levels"]
        self.lease = prefix + KEY_NAMES["lease"]
        self.active = prefix + KEY_NAMES["active"]
        self.fence = prefix + KEY_NAMES["fence"]
        self.scheduled = prefix + KEY_NAMES["scheduled"]
        self.retry = prefix + KEY_NAMES["retry"]
        self.dead = prefix + KEY_NAMES["dead"]
        self.completed = prefix + KEY_NAMES["completed"]
        self.cancelled = prefix + KEY_NAMES["cancelled"]
        self.ended = prefix + KEY_NAMES["ended"]
        self.wake = prefix + KEY_NAMES["wake"]
        self.paused = prefix + KEY_NAMES["paused"]
        self.watched = prefix + KEY_NAMES["watched"]
        self.stats = prefix + KEY_NAMES["stats"]
        self.group_types = prefix + KEY_NAMES["group_types"]
        self.grouped = prefix + KEY_NAMES["grouped"]
        self.batches = prefix + KEY_NAMES["batches"]
        self.waiting = prefix + KEY_NAMES["waiting"]
        self.junk = prefix + KEY_NAMES["junk"]
        self.fair_ring = prefix + KEY_NAMES["fair_ring"]
        self.fair_count = prefix + KEY_NAMES["fair_count"]
        self.fair_waiting = prefix + KEY_NAMES["fair_waiting"]

    def pending_of(self, priority: int) -> str:
        """The list of the pending tasks of a priority."""
        return self.pending + (f":{priority}" if priority else "")

    def task(self, task_id: str) -> str:
        return self.prefix + KEY_NAMES["task"] + task_id

    def progress(self, task_id: str) -> str:
        return self.prefix + KEY_NAMES["progress"] + task_id

    def cancels(self, worker_id: str) -> str:
        return self.prefix + KEY_NAMES["cancels"] + worker_id

    def inbox(self, client_id: str) -> str:
        return self.prefix + KEY_NAMES["inbox"] + client_id

    @property
    def flow_inbox(self) -> str:
        return self.inbox(FLOW_WATCHER)  # list of flow steps' ends, until recorded

    def group(self, task_type: str, group: str) -> str:
        return self.prefix + KEY_NAMES["group"] + task_type + " " + group

    def held(self, pattern: str) -> str:
        return self.prefix + KEY_NAMES["held"] + pattern

    def held_unranked(self, pattern: str) -> str:
        return self.prefix + KEY_NAMES["held_unranked"] + pattern

    def ordering(self, ordering_key: str) -> str:
        return self.prefix + KEY_NAMES["ordering"] + ordering_key

    def fair(self, fairness_key: str) -> str:
        return self.prefix + KEY_NAMES["fair"] + fairness_key

    def by_state(self, state: str) -> str:
        return self.lease if state == "active" else getattr(self, state)


class GlobalKeys:
    __slots__ = ("dataset", "flow_junk", "flow_look", "flows", "namespace", "partitions",
                 "queues", "workers")

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.queues = f"{namespace}:queues"  # set of every queue ever enqueued to
        # hash queue -> its number of partitions (obsq/names.py), as its workers' App
        # declares it: what producers without that App read
        self.partitions = f"{namespace}:partitions"
        self.workers = f"{namespace}:workers"  # zset worker id -> last heartbeat (ms)
        # a token the first worker writes, no expiry: missing, the data set is gone
        self.dataset = f"{namespace}:dataset"
        # the flows, under one hash tag (flow_index.lua): zsets flow id -> when it was
        # written, and -> when the flow sweep looks at it next (ms)
        self.flows = f"{namespace}:{{flows}}:index"
        self.flow_look = f"{namespace}:{{flows}}:look"
        # hash flow id -> "<ms> <why>": the flows whose record could not be read, or was
        # gone while they ran, set aside (flow_index.lua)
        self.flow_junk = f"{namespace}:{{flows}}:flowjunk"

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
        self.entries = self.prefix + KEY_NAMES["entries"]  # hash name -> definition (JSON)
        # zset name -> next fire (ms); 0: not picked up yet
        self.next = self.prefix + KEY_NAMES["next"]
        self.last = self.prefix + KEY_NAMES["last"]  # hash name -> last fire enqueued (ms)
        # hash name -> "<fire ms> <definition>" claimed
        self.firing = self.prefix + KEY_NAMES["firing"]
        # hash "fires:<name>" / "missed:<name>" -> count
        self.counts = self.prefix + KEY_NAMES["counts"]
        # counter: bumped by every change of an entry
        self.version = self.prefix + KEY_NAMES["version"]
        # list (one token) the scheduler blocks on
        self.changes = self.prefix + KEY_NAMES["changes"]


class FlowKeys:
    """The keys of one flow (a chain or chord) share its hash tag, so that one script records
    a step's end and decides the next (scripts/_prelude_flows.lua). A queue named
    "flow:<id>" would share it: flow ids are 32 random hex digits."""

    __slots__ = ("ended", "flow", "launching", "results")

    def __init__(self, namespace: str, flow_id: str) -> None:
        prefix = f"{namespace}:{{flow:{flow_id}}}:"
        # hash: state, steps (s:, k:, d:, q:, m: <step>), error
        self.flow = prefix + KEY_NAMES["flow"]
        # hash step -> its result (JSON), or '!' and its error
        self.results = prefix + KEY_NAMES["results"]
        # set of steps decided and not yet enqueued
        self.launching = prefix + KEY_NAMES["launching"]
        # exists from the flow's end until an hour past its keys (end_flow): a flow gone
        # without it did not end, its record was deleted
        self.ended = prefix + KEY_NAMES["flow_ended"]


class EventKeys:
    """The subscriptions of a namespace's events share one hash tag. A queue named "events"
    shares it too: these names stay apart from QueueKeys' (a test holds them to it)."""

    __slots__ = ("prefix", "subscribed")

    def __init__(self, namespace: str) -> None:
        self.prefix = f"{namespace}:{{events}}:"
        # set of the events with subscribers
        self.subscribed = self.prefix + KEY_NAMES["subscribed"]

    def subscribers(self, event: str) -> str:
        # zset "<subscriber> <queue>" -> lapse time (ms)
        return self.prefix + KEY_NAMES["subscribers"] + event
