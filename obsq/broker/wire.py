"""Each script's arguments, declared once: Python builds ARGV from the declaration
(`Layout.pack`), and the script reads its positions from it, as `@name` constants put
into its text when it is loaded (scripts.py). A field added, moved or renamed on one side
without the other fails at load or in tests/test_wire.py, not in production.

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
name means the same position in every mode; mode "*" is any other value.

What Redis replies is read alike in every broker module (`as_text`, `as_count`,
`as_number`): bytes that are not UTF-8 kept readable, and a field written by hand that is
not a number read as nothing (0, or None), never as a crash."""

from __future__ import annotations

import re
from collections import namedtuple
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from obsq.broker.keys import TASK_STATES

_SPEC = re.compile(r"\*\((?P<items>[\w ]+)\)|(?P<rest>\w+)\.\.\.|(?P<name>\w+)")


class Layout:
    """One script's ARGV after now."""

    __slots__ = ("_mode_field", "_modes", "constants")

    def __init__(self, spec: str = "", modes: dict[str, str] | None = None) -> None:
        if modes is not None and len(spec.split()) != 1:
            raise ValueError("a script with modes names its mode field alone, first")
        self._mode_field = spec if modes is not None else ""
        self.constants: dict[str, int] = {}
        self._modes = {mode: self._parse(f"{spec} {rest}") for mode, rest in
                       (modes or {"": ""}).items()}

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

    @property
    def variants(self) -> dict[str, tuple[list[str], tuple[str, ...], str]]:
        """Per mode ("" for a script without), (fixed names, item fields, rest name)."""
        return dict(self._modes)

    def mode_of(self, value: Any) -> tuple[list[str], tuple[str, ...], str]:
        """(fixed names, item fields, rest name) of the mode the mode field's `value` picks."""
        if self._modes.keys() == {""}:
            return self._modes[""]
        mode = self._modes.get(value.decode() if isinstance(value, bytes) else str(value))
        return mode or self._modes["*"]

    def pack(self, items: Iterable[Sequence[Any]] = (), **fields: Any) -> list[Any]:
        """ARGV after now: the named fields, then the items (each a sequence in the
        declared order) or the rest list (passed by its name)."""
        names, item_fields, rest = self.mode_of(fields.get(self._mode_field, ""))
        if len(fields) != len(names) + bool(rest):
            raise TypeError(f"expected {names} {rest}, got {sorted(fields)}")
        args = [fields[name] for name in names]
        if rest:
            args += fields[rest]
        stride = len(item_fields)
        for item in items:
            if len(item) != stride:
                raise TypeError(f"an item is {item_fields}, got {len(item)} values")
            args += item
        return args


def modes(field: str, **specs: str) -> Layout:
    return Layout(field, {"*" if mode == "other" else mode: spec
                          for mode, spec in specs.items()})


class Reply:
    """A script's reply: `head` values, then `count_in` (a head value; "" to the end)
    items of `item` fields, then pairs of `tail` fields to the end; `rows` names the head
    values (or fields of rows) that are lists of rows, with each row's fields."""

    __slots__ = ("_head", "_item", "_rows", "constants", "count_in", "head", "item", "rows",
                 "tail")

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
        self._head = namedtuple("Head", self.head)
        self._item = namedtuple("Item", self.item)
        self._rows = {part: namedtuple("Row", fields) for part, fields in self.rows.items()}

    def head_of(self, reply: Sequence[Any]) -> Any:
        """The leading values by name; those missing at the end read as None (a Lua table
        ends at its first nil)."""
        return self._head._make(_padded(reply[:len(self.head)], len(self.head)))

    def items(self, reply: Sequence[Any]) -> list[Sequence[Any]]:
        """The reply's items, each a slice of `item` fields in the declared order."""
        start, stride = len(self.head), len(self.item)
        end = (start + int(reply[self.head.index(self.count_in)]) * stride if self.count_in
               else len(reply))
        return [reply[i:i + stride] for i in range(start, end, stride)]

    def records(self, reply: Sequence[Any]) -> list[Any]:
        """The reply's items, each by its fields' names."""
        return [self._item._make(item) for item in self.items(reply)]

    def rows_of(self, part: str, rows: Sequence[Sequence[Any]]) -> list[Any]:
        """The rows of head value `part`, each by its fields' names (a short row's missing
        fields read as None)."""
        shape, size = self._rows[part], len(self.rows[part])
        return [shape._make(_padded(row, size)) for row in rows]

    def tail_of(self, reply: Sequence[Any]) -> list[Sequence[Any]]:
        """The pairs after the items."""
        start = len(self.head) + int(reply[self.head.index(self.count_in)]) * len(self.item)
        return [reply[i:i + len(self.tail)] for i in range(start, len(reply), len(self.tail))]


def _padded(values: Sequence[Any], size: int) -> list[Any]:
    return [*values, *[None] * (size - len(values))]


# Each script's ARGV after now, as its header comment describes it.
LAYOUTS: dict[str, Layout] = {
    "ack": Layout("worker resent window share "
                  "*(id fence retention result own type slot ordering)"),
    "cancel": modes("mode", task="id", attempt="id fence worker type slot"),
    "claim_batches": Layout("owner lease plan"),
    "claim_fire": Layout("name digest expected following fire claim missed"),
    "cleanup": Layout("dead_age dead_count batch window max_ids"),
    "confirm_fire": Layout("name claim fire outcome count"),
    "delete": modes("mode", id="id", other="batch"),
    "dequeue": Layout("lease count worker limits aging ahead floor"),
    "doctor": modes("step", list="offset count state field value",
                    zset="offset count state field value", lease="offset count grace",
                    owners="cursor count", ord="keys...", counters="",
                    drop="kind ids...", settle="expected wanted", levels="mark"),
    "due_fires": Layout("limit"),
    "end_batch": Layout("batch fence outcome error delay window"),
    "enqueue": Layout("share "
                      "*(id own type payload field headers options delay unique unique_for "
                      "ordering priority)"),
    "extend": Layout("lease worker *(id fence)"),
    "fail": Layout("worker id fence error traceback type slot ordering share"),
    "flow_cancel": Layout(),
    "flow_create": Layout("count values..."),
    "flow_ends": modes("mode", read="count", drop="entries..."),
    "flow_index": modes("mode", add="id written look", due="until count", page="offset count",
                        set="to ids...", remove="gone..."),
    "flow_launched": Layout("steps..."),
    "flow_previous": Layout("step"),
    "flow_state": Layout(),
    "flow_step": Layout("*(step ended value)"),
    "forward": Layout("batch scheduled"),
    "group": Layout("type group *(id payload field headers own)"),
    "groups": Layout("offset limit batch_offset batch_limit"),
    "hand_back": Layout("worker *(id fence type slot)"),
    "hand_on": Layout("worker id fence shortest longest max_age error type slot ordering"),
    "heartbeat": Layout("ttl description"),
    "interrupt": Layout("ttl"),
    "isolate": Layout("worker id fence"),
    "lock": Layout("owner ttl"),
    "page": Layout("order offset limit pattern cap"),
    "pause": Layout("paused"),
    "recover": Layout("max_recoveries batch cursor lost..."),
    "register": modes("kind", set="members...", zset="*(score member)",
                      hash="*(field value)"),
    "release_batches": Layout("owner *(id fence)"),
    "retry": Layout("worker id fence delay error traceback type slot share"),
    "revive": Layout("reset batch ids..."),
    "schedule": Layout("name definition from_app"),
    "schedules": Layout("limit"),
    "stats": Layout(),
    "subscribe": Layout("ttl *(event entry)"),
    "subscribers": Layout("event"),
    "tally": Layout("ttl *(outcome count)"),
    "throughput": Layout("minutes outcomes..."),
    "unfinished": Layout("worker"),
    "unschedule": Layout("name from_app"),
    "watch": Layout("id client watching"),
}

# Each script's KEYS, one string per shape a call may take: the names of the keys.py
# attributes (or methods) that build them, in order, a position's alternatives joined by
# "|"; "key" is a key the caller names. A key the script builds itself is a KEY_NAMES one,
# from its first key's prefix. tests/test_wire.py holds every call in the broker to these.
KEYS: dict[str, tuple[str, ...]] = {
    "ack": ("lease completed active watched",),
    "cancel": ("pending scheduled retry active lease",),
    "claim_batches": ("batches grouped group_types",),
    "claim_fire": ("entries next firing counts",),
    "cleanup": ("completed dead cancelled ended",),
    "confirm_fire": ("firing entries last counts",),
    "delete": ("pending scheduled retry dead completed cancelled active",),
    "dequeue": ("pending lease wake paused active fence",),
    # a key of the queue, then what the step reads: the list or zset ("list", "zset",
    # "drop"), the active hash ("lease"), the batches ("counters"); "settle": the counter
    "doctor": ("pending key", "lease active", "active", "pending", "group_types batches",
               "key"),
    "due_fires": ("next version firing",),
    "end_batch": ("batches",),
    "enqueue": ("pending scheduled wake",),
    "extend": ("lease active",),
    "fail": ("lease dead active",),
    "flow_cancel": ("flow results launching",),
    "flow_create": ("flow launching",),
    "flow_ends": ("flow_inbox",),
    "flow_index": ("flows flow_look",),
    "flow_launched": ("flow launching",),
    "flow_previous": ("flow results",),
    "flow_state": ("flow results",),
    "flow_step": ("flow results launching",),
    "forward": ("by_state pending wake",),  # by_state: scheduled or retry
    "group": ("group_types grouped",),
    "groups": ("group_types batches",),
    "hand_back": ("lease pending wake active",),
    "hand_on": ("lease scheduled dead active",),
    "heartbeat": ("worker",),
    "interrupt": ("wake",),
    "isolate": ("active",),
    "lock": ("lock",),
    "page": ("by_state", "group_types group"),  # a state's tasks, or a group's
    "pause": ("paused pending wake",),
    "recover": ("lease pending dead wake active",),
    "register": ("queues|partitions|workers",),
    "release_batches": ("batches",),
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


# The replies read by position. dequeue's items are FetchedTask's fields, in its order
# (records.py).
DEQUEUE_TASK = ("id", "fence", "type", "payload", "headers", "options", "retried", "due_ms",
                "id_chosen", "ordering_key", "waited", "slot", "binary", "suspect", "priority")
REPLIES: dict[str, Reply] = {
    "claim_batches": Reply(("wait", "batches"), rows={
        "batches": ("id", "type", "group", "fence", "failures", "tasks"),
        "tasks": ("id", "payload", "headers", "binary")}),
    "delete": Reply(("deleted", "left")),  # of a purge step (an id's returns its state)
    "dequeue": Reply(("now", "dropped", "count", "ahead"), DEQUEUE_TASK, count_in="count",
                     tail=("type", "why")),
    "enqueue": Reply((), ("position", "refusal")),
    "due_fires": Reply(("now", "version", "soonest", "due", "firing")),
    "flow_cancel": Reply(("state",), ("step", "where")),
    "flow_index": Reply(("total",), ("id",)),  # of a page (the other modes: a list or 1)
    "flow_previous": Reply(("chord", "waited"), ("result",)),
    "flow_state": Reply(("state", "failed", "error", "steps", "completed", "written", "ended",
                         "current", "current_queue", "result")),
    "flow_step": Reply(("state", "ended"), ("step", "task")),
    "groups": Reply(("now", "total", "next_offset", "batch_total", "next_batch", "groups",
                     "batches"),
                    rows={"groups": ("type", "group", "size", "first", "last"),
                          "batches": ("id", "claim_end", "type", "group", "ids", "owner",
                                      "failures", "error")}),
    "forward": Reply(("moved", "next_due")),
    "page": Reply(("total", "next_offset"),
                  ("id", "score", "type", "retried", "enqueued", "due", "done", "error",
                   "payload", "owner", "size", "priority")),
    "recover": Reply(("requeued", "killed", "cursor", "ends_in")),
    "revive": Reply(("moved", "left"), ("missing",)),
    "schedules": Reply(("now",), ("name", "next", "definition", "last", "claim", "fires",
                                  "missed")),
    "stats": Reply((*TASK_STATES, "oldest_due", "paused", "now", "aggregating")),
    "watch": Reply(("state", "result", "error")),
}


def constants(script: str) -> dict[str, int]:
    """The `@name` positions put into the script's text: its ARGV's and its reply's."""
    reply = REPLIES.get(script)
    return {**LAYOUTS[script].constants, **(reply.constants if reply else {})}


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
        return int(float(raw))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
