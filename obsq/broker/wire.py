"""Each script's arguments, declared once: Python builds ARGV from the declaration
(`Layout.pack`), and the script reads its positions from it, as `@name` constants put
into its text when it is loaded (scripts.py). A field added, moved or renamed on one side
without the other fails at load or in tests/test_wire.py, not in production.

Its KEYS are declared alike (`KEYS`), by the names of the keys.py attributes that build
them, and the script reads each at `KEYS[@k_<name>]`; only the prelude reads the first key
by its number, `KEYS[1]`, for the prefix of the keys a script builds (_prelude.lua).

A reply read by position is declared too (`Reply`): its leading values, then items of
fixed fields (their count in a leading value, or to the end), then optional pairs to the
end; a leading value, or a field of a row, may be a list of rows of its own fields
(`rows`). The script writes each value at `out[@r_name]`, an item's at `base + @r_name`, a
pair's at `base + @rt_name` (1-based) and a row's field at `row[@r_<list>_<field>]`, and
Python reads them by the same names (`Reply.head_of`, `records`, `rows_of`).

A spec lists ARGV after "now" (the runner's, always first): plain names in order, then
`*(a b c)` for items repeated to the end (Lua: `for i = @items, #ARGV, @stride`, fields
`ARGV[i + @a]`), or `name...` for plain values to the end (`for i = @name, #ARGV`). A
script whose first field picks a mode (`modes`) declares each mode's fields after it; a
name means the same position in every mode; mode "*" is any other value. A field may pack
values that few calls give (`packed`): '' when none is given, else a JSON array of them
in their declared order (`Layout.packed_value`), which the script decodes once and reads at
`@<field>_<name>` (1-based); each argument costs the client's encoder, Redis's parser and
the script's ARGV table, and most calls would send each of these empty.

What Redis replies is read alike in every broker module (`as_text`, `as_count`,
`as_number`): bytes that are not UTF-8 kept readable, and a field written by hand that is
not a number read as nothing (0, or None), never as a crash."""

from __future__ import annotations

import functools
import re
from collections import namedtuple
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import orjson

from obsq.broker.keys import TASK_STATES

_SPEC = re.compile(r"\*\((?P<items>[\w ]+)\)|(?P<rest>\w+)\.\.\.|(?P<name>\w+)")


class Layout:
    """One script's ARGV after now."""

    __slots__ = ("_mode_field", "_modes", "_only", "constants", "packed")

    def __init__(self, spec: str = "", modes: dict[str, str] | None = None, *,
                 packed: dict[str, str] | None = None) -> None:
        if modes is not None and len(spec.split()) != 1:
            raise ValueError("a script with modes names its mode field alone, first")
        self._mode_field = spec if modes is not None else ""
        self.constants: dict[str, int] = {}
        self._modes = {mode: self._parse(f"{spec} {rest}") for mode, rest in
                       (modes or {"": ""}).items()}
        self.packed = {field: tuple(names.split()) for field, names in (packed or {}).items()}
        for field, names in self.packed.items():
            if field not in self.constants:
                raise ValueError(f"packed field {field!r} is not in {spec!r}")
            for position, name in enumerate(names, 1):
                self._place(f"{field}_{name}", position)
        # a script without modes: its one variant, looked up without a call per pack
        self._only = self._modes[""] if modes is None else None

    def _parse(self, spec: str) -> tuple[list[str], tuple[str, ...], str]:
        """(fixed names, item fields, rest name) of a spec, its positions added to
        `constants` (the ARGV index of a field; an item field's offset in its item)."""
        names: list[str] = []
        items: tuple[str, ...] = ()
        rest = ""
        for found in _SPEC.finditer(spec):
            if items or rest:
                raise ValueError(f"nothing may follow the repeated part of {spec!r}")
            if found["name"]:
                names.append(found["name"])
                self._place(found["name"], len(names) + 1)
            elif found["rest"]:
                rest = found["rest"]
                self._place(rest, len(names) + 2)
            else:
                items = tuple(found["items"].split())
                self._place("items", len(names) + 2)
                self._place("stride", len(items))
                for offset, name in enumerate(items):
                    self._place(name, offset)
        return names, items, rest

    def _place(self, name: str, position: int) -> None:
        if self.constants.setdefault(name, position) != position:
            raise ValueError(f"{name} is at two positions")

    def packed_value(self, field: str, **values: Any) -> bytes:
        """Packed field `field` holding `values` (every one of its names given)."""
        names = self.packed[field]
        if len(values) != len(names):
            raise TypeError(f"{field} packs {names}, got {sorted(values)}")
        return orjson.dumps(list(map(values.__getitem__, names)))

    @property
    def variants(self) -> dict[str, tuple[list[str], tuple[str, ...], str]]:
        """Per mode ("" for a script without), (fixed names, item fields, rest name)."""
        return dict(self._modes)

    def mode_of(self, value: Any) -> tuple[list[str], tuple[str, ...], str]:
        """(fixed names, item fields, rest name) of the mode the mode field's `value` picks."""
        if self._only is not None:
            return self._only
        mode = self._modes.get(value.decode() if isinstance(value, bytes) else str(value))
        return mode or self._modes["*"]

    def pack(self, items: Iterable[Sequence[Any]] = (), **fields: Any) -> list[Any]:
        """ARGV after now: the named fields, then the items (each a sequence in the
        declared order) or the rest list (passed by its name)."""
        names, item_fields, rest = self._only or self.mode_of(fields.get(self._mode_field, ""))
        if len(fields) != len(names) + bool(rest):
            raise TypeError(f"expected {names} {rest}, got {sorted(fields)}")
        args = list(map(fields.__getitem__, names))  # not a comprehension: one call less
        if rest:
            args += fields[rest]
        stride = len(item_fields)
        for item in items:
            if len(item) != stride:
                raise TypeError(f"an item is {item_fields}, got {len(item)} values")
            args += item
        return args


@functools.cache
def _shape(kind: str, fields: tuple[str, ...]) -> Any:
    """The named tuple of a reply's `fields`, made at its first use: a class each costs a
    few KB, and most replies are never read in a given process (a worker reads no
    inspector's)."""
    return namedtuple(kind, fields)


def modes(field: str, **specs: str) -> Layout:
    return Layout(field, {"*" if mode == "other" else mode: spec
                          for mode, spec in specs.items()})


class Reply:
    """A script's reply: `head` values, then `count_in` (a head value; "" to the end)
    items of `item` fields, then pairs of `tail` fields to the end; `rows` names the head
    values (or fields of rows) that are lists of rows, with each row's fields."""

    __slots__ = ("constants", "count_in", "head", "item", "rows", "tail")

    def __init__(self, head: Sequence[str] = (), item: Sequence[str] = (), *,
                 count_in: str = "", tail: Sequence[str] = (),
                 rows: dict[str, Sequence[str]] | None = None) -> None:
        self.head, self.item, self.tail, self.count_in = tuple(head), tuple(item), tuple(
            tail), count_in
        self.rows = {part: tuple(fields) for part, fields in (rows or {}).items()}
        if not set(self.rows) <= {*self.head, *(f for row in self.rows.values() for f in row)}:
            raise ValueError("rows belong to a head value or a field of other rows")
        named = [(f"r_{n}", i + 1) for i, n in enumerate(self.head)]
        named += [(f"r_{n}", i + 1) for i, n in enumerate(self.item)]
        named += [(f"rt_{n}", i + 1) for i, n in enumerate(self.tail)]
        named += [(f"r_{part}_{n}", i + 1) for part, fields in self.rows.items()
                  for i, n in enumerate(fields)]
        self.constants = dict(named)
        if len(self.constants) != len(named):
            raise ValueError("a reply names a field twice")
        if count_in:  # the script counts its items
            self.constants["r_stride"] = len(self.item)

    def head_of(self, reply: Sequence[Any]) -> Any:
        """The leading values by name; those missing at the end read as None (a Lua table
        ends at its first nil)."""
        return _shape("Head", self.head)._make(_padded(reply[:len(self.head)], len(self.head)))

    def items(self, reply: Sequence[Any]) -> list[Sequence[Any]]:
        """The reply's items, each a slice of `item` fields in the declared order."""
        start, stride = len(self.head), len(self.item)
        end = (start + int(reply[self.head.index(self.count_in)]) * stride if self.count_in
               else len(reply))
        return [reply[i:i + stride] for i in range(start, end, stride)]

    def records(self, reply: Sequence[Any]) -> list[Any]:
        """The reply's items, each by its fields' names."""
        shape = _shape("Item", self.item)
        return [shape._make(item) for item in self.items(reply)]

    def rows_of(self, part: str, rows: Sequence[Sequence[Any]]) -> list[Any]:
        """The rows of head value `part`, each by its fields' names (a short row's missing
        fields read as None)."""
        shape, size = _shape("Row", self.rows[part]), len(self.rows[part])
        return [shape._make(_padded(row, size)) for row in rows]

    def tail_of(self, reply: Sequence[Any]) -> list[Sequence[Any]]:
        """The pairs after the items."""
        start = len(self.head) + int(reply[self.head.index(self.count_in)]) * len(self.item)
        return [reply[i:i + len(self.tail)] for i in range(start, len(reply), len(self.tail))]


def _padded(values: Sequence[Any], size: int) -> list[Any]:
    return [*values, *[None] * (size - len(values))]


# Each script's ARGV after now. A name means the same in every layout:
#   worker        the worker's id
#   id, fence     a task, and its attempt's fencing token
#   slot          the route whose concurrency limit the attempt counts under, or ''
#   ordering      the task's ordering key, or ''
#   own           '1' when the producer chose the task's id (its id is then remembered for
#                 the dedup window once the task is forgotten), else ''
#   field         the task hash's field of the payload: 'payload' (JSON) or 'bin' (bytes)
#   headers       a JSON object, or '' for none
#   share         the share of maxmemory producers may fill (1: no limit)
#   window        the dedup window (ms)
#   from_app      1 from a scheduler (an entry of the App's code may change), else 0
#   lease, ttl, delay, grace, and a name ending in _age or _for: milliseconds
LAYOUTS: dict[str, Layout] = {
    "ack": Layout("worker "
                  "resent "  # '1' when an earlier send of these acks may have been applied
                  "window share "
                  "*(id fence retention result own type slot ordering)"),  # retention: ms
    "cancel": modes("mode", task="id", attempt="id fence worker type slot"),
    "claim_batches": Layout("owner lease "
                            # JSON {"ids": [fresh batch ids], "patterns": [[pattern,
                            # max_size, max_delay_ms, grace_ms], ...]}: the caller's
                            # aggregators, the most specific pattern first (exact, longest
                            # prefix, '*', as routes match)
                            "plan"),
    "claim_fire": Layout("name "
                         "digest "  # SHA-1 of the entry's definition
                         "expected "  # ms
                         "following "  # ms, or '+inf' to park an entry that is not valid
                         "fire "  # ms, the first claimed; 0: none
                         "claim "  # "<fire>[,<fire>...] <definition>"
                         "missed"),
    "cleanup": Layout("dead_age "
                      "dead_count "  # how many dead and cancelled tasks are kept
                      "batch window "
                      "max_ids"),  # how many forgotten ids are remembered at most
    "confirm_fire": Layout("name claim "
                           "fire "  # ms: the latest fire of the claim
                           "outcome "  # 'fired', 'missed' or 'dropped'
                           "count"),  # how many fires the claim holds
    "defer_unknown": Layout("worker id fence "
                            "shortest longest "  # ms: the bounds of the delay
                            "max_age error type slot ordering"),
    "delete": modes("mode", id="id", other="batch"),  # other: the state to purge
    "dequeue": Layout("lease count worker "
                      # '' or JSON {"g": [[route, concurrency, interval_ms, tolerance_ms,
                      # key_concurrency, key_interval_ms, key_tolerance_ms], ...], "l":
                      # [[pattern, room], ...]}: the App's routes with a limit across
                      # workers (0: none; the key_ ones hold for each fairness key apart),
                      # and this worker's own route limits with the room left under each
                      "limits "
                      "aging "  # ms: a task pending this long ranks one priority higher
                      # '1' to be told the rank of the best task left (a partition's
                      # fetch: the worker takes a queue's partitions by their best tasks)
                      "ahead "
                      # '' or a rank (ms) no task taken may rank after: the best task
                      # another partition of the queue holds, so that the queue's
                      # priorities hold across its partitions
                      "floor "
                      # '' or JSON {fairness key: weight}: how many tasks a key takes per
                      # turn when it is not 1
                      "weights"),
    "doctor": modes("step", list="offset count state field value",
                    zset="offset count state field value",
                    held="offset count state field value", lease="offset count grace",
                    owners="cursor count", options="offset count", junk="cursor count",
                    ord="keys...", counters="", drop="kind ids...", aside="kind ids...",
                    unleased="attempts...", bury="why ids...", settle="expected wanted",
                    levels="mark"),  # mark: '1' to mend them
    "due_fires": Layout("limit"),
    "end_batch": Layout("batch fence "
                        "outcome "  # 'done' or 'failed'
                        "error delay window"),
    "enqueue": Layout("share "
                      "*(id type payload headers "
                      "options "  # JSON, or '' for none
                      "delay "
                      "rare)",  # the options most tasks are given none of: packed
                      packed={"rare": "own "  # 1 or 0 here
                                      "binary "  # 1: the payload is bytes (field 'bin')
                                      "unique "  # the unique digest, or '' when not unique
                                      "unique_for ordering "
                                      "priority "  # 0 to 9
                                      "expires "  # ms from now to its expiry, 0 for none
                                      "debounce_key "  # '' when not debounced
                                      "debounce "
                                      "debounce_max "  # 0: no bound
                                      "fairness"}),  # the fairness key, '' for none
    "extend": Layout("lease worker *(id fence)"),
    "fail": Layout("worker id fence error traceback type slot ordering share"),
    "flow_cancel": Layout(),
    "flow_create": Layout("share "
                          "count "  # how many of the values are the first steps
                          "values..."),  # the first steps, then field, value pairs
    "flow_ends": modes("mode", read="count", drop="entries..."),
    "flow_index": modes("mode",
                        add="id written look",  # ms
                        due="until count",  # until: ms
                        page="offset count",
                        set="to ids...",  # to: the ids' next look, ms
                        junk="id why",  # set it aside
                        junked="cursor count",  # a step of the flows set aside
                        remove="gone..."),
    "flow_launched": Layout("steps..."),
    "flow_previous": Layout("step"),
    "flow_state": Layout(),
    "flow_step": Layout("*(step "
                        "ended "  # 'completed', 'dead' or 'cancelled'
                        "value)"),  # the result or the error
    "forward": Layout("batch "
                      "scheduled"),  # 1 for the scheduled set (not retry), else 0
    "group": Layout("type group *(id payload field headers own)"),
    "groups": Layout("offset limit batch_offset batch_limit"),
    "hand_back": Layout("worker *(id fence type slot)"),
    "heartbeat": Layout("ttl description"),
    "interrupt": Layout("ttl"),
    "isolate": Layout("worker id fence"),
    "lock": Layout("owner ttl"),  # ttl 0: release
    "page": Layout("order "  # 'list', 'head', 'asc' or 'desc'
                   "offset limit "
                   # '' for any type, or a route pattern: a type, a prefix ending in ':'
                   # or '.', or '*'
                   "pattern "
                   "cap"),  # how many ids a page looks at, at most
    "pause": Layout("paused"),  # 1 to pause, 0 to unpause
    "recover": Layout("max_recoveries batch "
                      "cursor "  # of the active hash: '0' to start
                      "lost..."),  # the workers lost; none: the expired leases only
    "register": modes("kind", set="members...", zset="*(score member)",
                      hash="*(field value)"),
    "release_batches": Layout("owner *(id fence)"),
    "release_unheld": Layout("worker batch "
                             "cursor "  # of the active hash: '0' to start
                             "*(id fence)"),  # the attempts the worker holds in the queue
    "retry": Layout("worker id fence delay error traceback type slot share"),
    "revive": Layout("reset "  # '1' to start the retry count afresh
                     "batch "
                     "ids..."),  # none: the first `batch` tasks of the set
    "schedule": Layout("name "
                       "definition "  # JSON
                       "from_app"),
    "schedules": Layout("limit"),
    "stats": Layout("top"),  # how many of the fairness keys with most waiting to name
    "subscribe": Layout("ttl *(event entry)"),  # entry: "<subscriber> <queue>"
    "subscribers": Layout("event"),
    "tally": Layout("ttl *(outcome count)"),
    "throughput": Layout("minutes outcomes..."),
    "unfinished": Layout("worker"),
    "unschedule": Layout("name from_app"),
    "watch": Layout("id client "
                    "watching"),  # 1 to watch, 0 to stop
}

# Each script's KEYS, one string per shape a call may take: the names of the keys.py
# attributes (or methods) that build them, in order, a position's alternatives joined by
# "|"; "key" and "counter" are keys the caller names. The script reads a key by its name,
# `KEYS[@k_<name>]` (key_constants); a name keeps one position in every shape of its
# script, as an ARGV name does in every mode. A key the script builds itself is a KEY_NAMES
# one, from its first key's prefix. tests/test_contract.py holds every call in the broker
# to these.
KEYS: dict[str, tuple[str, ...]] = {
    "ack": ("lease completed active watched",),
    "cancel": ("pending scheduled retry active lease",),
    "claim_batches": ("batches grouped group_types",),
    "claim_fire": ("entries next firing counts",),
    "cleanup": ("completed dead cancelled ended",),
    "confirm_fire": ("firing entries last counts",),
    "defer_unknown": ("lease scheduled dead active",),
    "delete": ("pending scheduled retry dead completed cancelled active",),
    "dequeue": ("pending lease wake paused active fence",),
    # by step: pending and the list or zset it reads ("list", "zset", "held", "drop"), the
    # leases and the active hash ("lease", "owners"), pending alone ("ord", "levels"), the
    # group types and batches ("counters"), the counter ("settle"); pending is there for the
    # queue's prefix, a name with no colon (a held set's or ordering key's may hold some)
    "doctor": ("pending key", "lease active", "pending", "group_types batches", "counter"),
    "due_fires": ("next version firing",),
    "end_batch": ("batches",),
    "enqueue": ("pending scheduled wake",),
    "extend": ("lease active",),
    "fail": ("lease dead active",),
    "flow_cancel": ("flow results launching",),
    "flow_create": ("flow launching",),
    "flow_ends": ("flow_inbox",),
    "flow_index": ("flows flow_look flow_junk",),
    "flow_launched": ("flow launching",),
    "flow_previous": ("flow results",),
    "flow_state": ("flow results",),
    "flow_step": ("flow results launching",),
    "forward": ("by_state pending wake",),  # by_state: scheduled or retry
    "group": ("group_types grouped",),
    "groups": ("group_types batches",),
    "hand_back": ("lease pending wake active",),
    "heartbeat": ("worker",),
    "interrupt": ("wake",),
    "isolate": ("active",),
    "lock": ("lock",),
    "page": ("by_state", "group_types group"),  # a state's tasks, or a group's
    "pause": ("paused pending wake",),
    "recover": ("lease pending dead wake active",),
    "register": ("queues|partitions|workers",),
    "release_batches": ("batches",),
    "release_unheld": ("lease pending wake active",),
    "retry": ("lease retry pending wake active",),
    "revive": ("by_state pending wake",),
    "schedule": ("entries next version changes",),
    "schedules": ("next entries last firing counts",),
    "stats": ("pending lease scheduled retry dead completed cancelled paused",),
    "subscribe": ("subscribed",),
    "subscribers": ("subscribers subscribed",),
    "tally": ("stats",),
    "throughput": ("stats",),
    "unfinished": ("pending paused active",),
    "unschedule": ("entries next last counts version changes",),
    "watch": ("watched task",),
}


def key_shapes(script: str) -> list[list[set[str]]]:
    """`script`'s KEYS shapes, each a list of the names a position may take."""
    return [[set(position.split("|")) for position in shape.split()]
            for shape in KEYS[script]]


def key_constants(script: str) -> dict[str, int]:
    """`k_<name>` -> the position (1-based) of each of `script`'s key names, whatever the
    shape; each of a position's alternatives is at that position."""
    found: dict[str, int] = {}
    for shape in key_shapes(script):
        for position, names in enumerate(shape, 1):
            for name in names:
                if found.setdefault(f"k_{name}", position) != position:
                    raise ValueError(f"{script}: key {name} is at two positions")
    return found


# The replies read by position; a time is in ms, a flag '1' or ''. dequeue's items are
# FetchedTask's fields, in its order (records.py says what each is; a priority of 0 comes
# as '').
DEQUEUE_TASK = ("id", "fence", "type", "payload", "headers", "options", "retried", "due_ms",
                "id_chosen", "ordering_key", "waited", "slot", "binary", "suspect", "priority")
# The records a script set aside in its queue's junk (set_aside, _prelude.lua): each one's
# key name in the queue and why.
ASIDE = ("name", "why")
REPLIES: dict[str, Reply] = {
    "claim_batches": Reply(("wait",  # until the next group or batch is due; -1: none
                            "batches"), rows={
        "batches": ("id", "type", "group", "fence", "failures", "tasks"),
        "tasks": ("id", "payload", "headers", "binary")}),
    "cleanup": Reply(("deleted", "aside"), rows={"aside": ASIDE}),
    "delete": Reply(("deleted", "left")),  # of a purge step (an id's returns its state)
    "dequeue": Reply(("now", "dropped",  # ids whose hash was gone
                      "count",
                      # the rank of the best task left (due - priority * aging), '' when
                      # none is left or it was not asked for
                      "ahead", "aside",
                      "expired"),  # the tasks it found past their expiry, now dead
                     DEQUEUE_TASK, count_in="count",
                     tail=("type", "why"),  # a task held back: 'concurrency' or 'rate'
                     rows={"aside": ASIDE,
                           "expired": ("id", "type", "retried", "headers", "priority")}),
    # the refused tasks only: a task's position in the batch (1-based), and 'id' or
    # 'unique:<id of the task holding the digest>'
    "enqueue": Reply((), ("position",
                          # 'id', 'unique:<holder>', or 'debounced:<waiting task>': not a
                          # refusal, the enqueue replaced that task's payload
                          "refusal")),
    "due_fires": Reply(("now", "version",
                        "soonest",  # the next fire after now, '' when none
                        "due",  # name, next fire, ...
                        "firing")),  # name, claim, ...
    "flow_cancel": Reply(("state",),  # the state it was in, '' when there is no such flow
                         # each step that may still wait or run, with "<queue>\t<type>"
                         ("step", "where")),
    # of a page, latest first (the other modes return a list or 1)
    "flow_index": Reply(("total",), ("id",)),
    "flow_previous": Reply(("chord",  # a flag: a chord's callback, which takes a list
                            "waited"),  # the steps it waited for, space-separated
                           ("result",)),  # theirs, in order (nil for one not kept)
    "flow_state": Reply(("state",  # '' when the flow is gone
                         "failed", "error", "steps", "completed", "written", "ended",
                         "current",  # the step launched last, '' for none
                         "current_queue",
                         "result",  # the last step's
                         # why a flow gone or unreadable is a fault (flow_trouble), or ''
                         "trouble")),
    "flow_step": Reply(("state",  # '' when the flow is gone
                        # a flag: this call ended the flow, or is the first to record a
                        # step's end since its Client cancelled it
                        "ended",
                        # why the flow cannot be moved on (gone before it ended, a key
                        # holding no hash, a field that does not parse), or ''
                        "trouble"),
                       ("step", "task")),  # each step to launch, with its task
    "groups": Reply(("now", "total", "next_offset",  # -1: none
                     "batch_total", "next_batch",  # -1: none
                     "groups", "batches"),
                    # first, last: the group's oldest and newest task; a batch whose hash
                    # is not a hash (written by hand) is its id and claim_end alone
                    rows={"groups": ("type", "group", "size", "first", "last"),
                          "batches": ("id", "claim_end", "type", "group", "ids", "owner",
                                      "failures", "error")}),
    "forward": Reply(("moved",
                      "next_due",  # until the set's next task is due; -1: it is empty
                      "aside"), rows={"aside": ASIDE}),
    "page": Reply(("total", "next_offset"),  # -1: none
                  ("id", "score", "type", "retried", "enqueued", "due", "done",
                   "error", "payload",  # their heads
                   "owner",  # "<fence>:<worker>" while it runs, else ''
                   "size",  # of a bytes payload, '' for JSON
                   "priority")),  # '' for 0
    "recover": Reply(("requeued", "killed",
                      "cursor",  # the next, '0' at the end
                      "ends_in",  # until the next lease ends; -1: none
                      "aside"), rows={"aside": ASIDE}),
    "release_unheld": Reply(("released",
                             "cursor",  # the next, '0' at the end
                             "aside"), rows={"aside": ASIDE}),
    "revive": Reply(("moved", "left"),  # left in the set
                    ("missing",)),  # the ids given that were not in the set
    "schedules": Reply(("now",), ("name", "next", "definition",
                                  "last",  # fire
                                  "claim", "fires", "missed")),
    "stats": Reply((*TASK_STATES,
                    "oldest_due",  # of the pending tasks; -1: none
                    "paused", "now", "aggregating",
                    "fair_keys",  # the fairness keys with waiting tasks
                    "fair_top"),  # the `top` of them with most, most first
                   rows={"fair_top": ("key", "waiting")}),
    "watch": Reply(("state", "result", "error")),
}


def constants(script: str) -> dict[str, int]:
    """The `@name` positions put into the script's text: its ARGV's, its reply's and its
    KEYS' (`k_<name>`)."""
    reply = REPLIES.get(script)
    return {**LAYOUTS[script].constants, **(reply.constants if reply else {}),
            **key_constants(script)}


def argv(script: str, items: Iterable[Sequence[Any]] = (), **fields: Any) -> list[Any]:
    """`script`'s ARGV after now, from its layout (see Layout.pack)."""
    return LAYOUTS[script].pack(items, **fields)


def in_order(script: str, *values: Any) -> list[Any]:
    """`script`'s ARGV after now from values in the declared order, their count checked
    (for a caller that passes a mode's values through, as the flows loop's index steps)."""
    layout = LAYOUTS[script]
    names, _, rest = layout.mode_of(values[0] if values else "")
    if len(values) < len(names) or (len(values) > len(names) and not rest):
        raise TypeError(f"{script} takes {names} {rest}, got {len(values)} values")
    return list(values)


class EndEntry(NamedTuple):
    """A task's end as an inbox holds it: notify_done (_prelude.lua) pushes it onto the
    inbox of each client waiting in result() and onto the queue's flow inbox (flow_ends
    reads it), as these fields joined by newlines, the value last (it may hold newlines)."""

    id: str
    state: str
    value: bytes  # the result (JSON) or the error text

    @classmethod
    def read(cls, raw: bytes) -> EndEntry:
        """The fields of an entry; those an entry written by hand lacks read as empty."""
        task_id, state, value = [*raw.split(b"\n", len(cls._fields) - 1), b"", b""][:3]
        return cls(task_id.decode(errors="replace"), state.decode(errors="replace"), value)

    def written(self) -> bytes:
        """The entry as notify_done writes it."""
        return b"\n".join((self.id.encode(), self.state.encode(), self.value))


def as_text(raw: bytes | str) -> str:
    return raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)


def as_count(raw: bytes | None) -> int:
    """A stored count or time; 0 when absent or not a number."""
    try:
        return int(raw or 0)
    except ValueError:
        return 0


def as_number(raw: bytes | str | int | None) -> int | None:
    """A stored number, None when absent or not a number; a score comes back as
    '1.7e12'-style text."""
    if raw in (None, b"", ""):
        return None
    try:
        return int(float(raw))
    except (TypeError, ValueError):
        return None
