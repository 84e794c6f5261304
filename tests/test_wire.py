"""Python and Lua agree on every script's arguments (obsq/broker/wire.py): each script has a
declared layout, reads ARGV only through its `@name` positions, reads every position its
layout declares, and every call in the broker builds its arguments from the layout. No
Redis: the scripts' behaviour under these layouts is what the engine tests run."""

from __future__ import annotations

import ast
import re

import pytest
from support import ROOT

from obsq.broker.keys import KEY_NAMES, TASK_STATES
from obsq.broker.records import FetchedTask
from obsq.broker.scripts import VARIANTS, scripts
from obsq.broker.wire import (
    LAYOUTS,
    REPLIES,
    EndEntry,
    Layout,
    Reply,
    argv,
    constants,
    in_order,
    key_constants,
)

SCRIPT_DIR = ROOT / "obsq" / "broker" / "scripts"
BODIES = {p.stem: p.read_text() for p in sorted(SCRIPT_DIR.glob("[!_]*.lua"))}
COMMENT = re.compile(r"--.*$", re.M)
# ARGV read by a number: ARGV[3], ARGV[i + 2], #ARGV > 4
BY_NUMBER = re.compile(r"ARGV\[\s*\d|ARGV\[\s*i\s*[-+]\s*\d|#ARGV\s*[<>=~]+\s*\d")


def test_every_script_has_a_layout_and_loads_with_it() -> None:
    assert set(LAYOUTS) == set(BODIES)
    assert set(REPLIES) <= set(BODIES)
    assert set(scripts()) == set(BODIES) | set(VARIANTS)
    assert {file for file, _ in VARIANTS.values()} <= set(BODIES)
    assert not [name for name, s in scripts().items() if "@" in COMMENT.sub("", s.source)]


@pytest.mark.parametrize("name", sorted(BODIES))
def test_the_script_reads_argv_by_its_layout_only(name: str) -> None:
    code = COMMENT.sub("", BODIES[name])
    assert not BY_NUMBER.findall(code), f"{name}.lua reads ARGV by a number"
    keys = {f"key_{n}" for n in KEY_NAMES} | set(key_constants(name))  # test_contract's
    used = set(re.findall(r"@(\w+)", code)) - keys
    declared = set(constants(name)) - keys
    assert used == declared, (
        f"{name}.lua reads {sorted(used)}, its layout declares {sorted(declared)}")


def _script_calls(tree: ast.AST) -> list[tuple[str, ast.expr]]:
    """(script name, its arguments' expression) of each `_script(...)`/`_producer_script`
    call and each ("name", keys, args) call tuple naming a script."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") in (
                "_script", "_producer_script", "_failure_call") and len(node.args) == 3:
            name, _, args = node.args
        elif isinstance(node, ast.Tuple) and len(node.elts) == 3:
            name, _, args = node.elts
        else:
            continue
        if isinstance(name, ast.Constant) and name.value in LAYOUTS:
            found.append((name.value, args))
    return found


def test_every_call_builds_its_arguments_from_the_layout() -> None:
    literal = []
    calls = 0
    for path in sorted((ROOT / "obsq" / "broker").glob("*.py")):
        for name, args in _script_calls(ast.parse(path.read_text())):
            calls += 1
            if isinstance(args, (ast.Tuple, ast.List)):
                literal.append(f"{path.name}: {name} {ast.unparse(args)}")
    assert calls > 30
    assert literal == []


def test_a_call_that_does_not_match_its_layout_is_refused() -> None:
    with pytest.raises(TypeError):
        argv("isolate", worker="w", id="t")  # the fence is missing
    with pytest.raises(TypeError):
        argv("hand_back", [("t", 1, "type")], worker="w")  # an item one short
    with pytest.raises(TypeError):
        in_order("flow_index", "add", "id")  # the score is missing
    assert argv("hand_back", [("t", 1, "type", "")], worker="w") == ["w", "t", 1, "type", ""]
    assert argv("cancel", mode="task", id="t") == ["task", "t"]
    assert argv("delete", mode="dead", batch=10) == ["dead", 10]
    assert argv("recover", max_recoveries=3, batch=10, cursor="0", lost=["a"]) == [
        3, 10, "0", "a"]


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_layout_builds_a_call_from_its_own_names(name: str) -> None:
    layout = LAYOUTS[name]
    for mode, (names, item, rest) in layout.variants.items():
        fields = {n: f"<{n}>" for n in names}
        if mode not in ("", "*"):
            fields[names[0]] = mode
        if rest:
            fields[rest] = ["<a>", "<b>"]
        items = [tuple(item), tuple(item)] if item else []
        built = layout.pack(items, **fields)
        assert len(built) == len(names) + 2 * (bool(rest) or len(item)), (name, mode)
        if item:
            assert built[layout.constants["items"] - 2 + layout.constants[item[-1]]] == item[-1]


def test_a_name_cannot_mean_two_positions() -> None:
    with pytest.raises(ValueError, match="two positions"):
        Layout("step", {"a": "x y", "b": "y"})
    assert Layout("w *(id fence)").constants == {"w": 2, "items": 3, "stride": 2,
                                                 "id": 0, "fence": 1}


def test_a_fetched_task_is_read_in_the_order_dequeue_writes_it() -> None:
    assert REPLIES["dequeue"].item == FetchedTask._fields


# A reply written as a list of values, `return {a, b}`, where the script's own body returns
# (indented two spaces at most: the chunk, or an `if` of it), or a value put at a number of
# the reply table (`out`) or of one of its rows.
LISTED_REPLY = re.compile(r"^ {0,2}return \{\s*[^\s\[}]", re.M)
AT_A_NUMBER = re.compile(r"\b(?:out|row)\[\s*\d+\s*\]\s*=[^=]")


@pytest.mark.parametrize("name", sorted(REPLIES))
def test_the_script_writes_its_reply_by_the_declared_names_only(name: str) -> None:
    code = COMMENT.sub("", BODIES[name])
    assert not LISTED_REPLY.findall(code), f"{name}.lua returns values listed by position"
    assert not AT_A_NUMBER.findall(code), f"{name}.lua puts a value at a number"
    written = set(re.findall(r"\[\s*(?:[\w#]+\s*\+\s*)?@(r_\w+|rt_\w+)\s*\]\s*=[^=]", code))
    declared = set(REPLIES[name].constants) - {"r_stride"}
    assert written == declared, f"{name}.lua writes {sorted(written)}, declared {sorted(declared)}"


def test_a_reply_is_read_by_the_names_it_is_written_by() -> None:
    shape = Reply(("now", "count", "rows"), ("id", "fence"), count_in="count",
                  tail=("type", "why"), rows={"rows": ("a", "b")})
    reply = [7, 2, [["x", "y"], ["z"]], "t1", 1, "t2", 2, "held", "rate"]
    head = shape.head_of(reply)
    assert (head.now, head.count) == (7, 2)
    assert [(r.id, r.fence) for r in shape.records(reply)] == [("t1", 1), ("t2", 2)]
    assert shape.tail_of(reply) == [["held", "rate"]]
    assert [(r.a, r.b) for r in shape.rows_of("rows", head.rows)] == [("x", "y"), ("z", None)]
    assert shape.head_of([7]).count is None  # a Lua table ends at its first nil
    assert shape.constants["r_rows_b"] == 2 and shape.constants["rt_why"] == 2
    with pytest.raises(ValueError, match="twice"):
        Reply(("id",), ("id",))


def test_the_depths_of_stats_are_the_task_states_in_order() -> None:
    assert REPLIES["stats"].head[:len(TASK_STATES)] == TASK_STATES


def test_an_end_entry_is_read_in_the_order_notify_done_writes_it() -> None:
    prelude = COMMENT.sub("", (SCRIPT_DIR / "_prelude.lua").read_text())
    [written] = re.findall(r"'LPUSH', inbox, (.+)\)", prelude)
    assert tuple(part.strip() for part in written.split(".. '\\n' ..")) == EndEntry._fields
    entry = EndEntry("t1", "dead", b"line\nnext")
    assert EndEntry.read(entry.written()) == entry
    assert EndEntry.read(b"junk") == EndEntry("junk", "", b"")


def test_a_packed_field_holds_its_declared_values_in_order() -> None:
    layout = Layout("share *(id rest)", packed={"rest": "a b"})
    assert layout.constants["rest_a"] == 1 and layout.constants["rest_b"] == 2
    assert layout.packed_value("rest", b=2, a="x") == b'["x",2]'
    with pytest.raises(TypeError):
        layout.packed_value("rest", a="x")  # b is missing
    with pytest.raises(ValueError, match="not in"):
        Layout("share *(id)", packed={"rest": "a"})
