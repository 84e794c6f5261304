"""How a declared payload type reads a value (obsq/payloads.py), without Redis: what is
accepted and what it becomes, at enqueue (encode: JSON-able) and in the worker (decode)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, TypedDict

import orjson
import pytest

import obsq
from obsq.payloads import PayloadType, payload_type_of, result_type_of


@dataclass
class Inner:
    n: int


@dataclass
class Outer:
    inner: Inner
    items: tuple[int, str]
    maybe: Inner | None = None
    tags: set[str] = field(default_factory=set)


class Partial(TypedDict, total=False):
    a: int
    b: Literal["x", "y"]


def round_trip(tp: Any, value: Any) -> Any:
    """As the payload travels: encoded at enqueue, written as JSON, decoded in the worker."""
    declared = PayloadType(tp)
    stored = orjson.loads(orjson.dumps(declared.encode(value, "p")))
    return declared.decode(stored, "p")


@pytest.mark.parametrize(("tp", "value", "expected"), [
    (Outer, Outer(Inner(1), (2, "b"), Inner(3), {"t"}), Outer(Inner(1), (2, "b"), Inner(3), {"t"})),
    (Outer, {"inner": {"n": 1}, "items": [2, "b"]}, Outer(Inner(1), (2, "b"))),
    (Partial, {}, {}),
    (Partial, {"b": "y"}, {"b": "y"}),
    (float, 3, 3.0),
    (int | None, None, None),
    (Annotated[int, "units"], 4, 4),
    (list[Inner], [{"n": 1}, Inner(2)], [Inner(1), Inner(2)]),
    (dict[str, list[float]], {"a": [1, 2.5]}, {"a": [1.0, 2.5]}),
    (bytes, b"\x00raw", b"\x00raw"),
])
def test_values_that_can_become_the_type_make_the_round_trip(tp: Any, value: Any,
                                                             expected: Any) -> None:
    if tp is bytes:  # stored as it is, not as JSON
        assert PayloadType(tp).decode(PayloadType(tp).encode(value, "p"), "p") == expected
        return
    assert round_trip(tp, value) == expected


@pytest.mark.parametrize(("tp", "value", "problem"), [
    (int, True, "expected int, got bool True"),
    (int, 1.5, "expected int, got float"),
    (Outer, {"inner": {"n": "1"}, "items": [2, "b"]}, "inner.n: expected int"),
    (Outer, {"inner": {"n": 1}, "items": [2]}, "items: expected 2 items, got 1"),
    (Partial, {"b": "z"}, "b: expected one of ['x', 'y'], got 'z'"),
    (Partial, {"c": 1}, "Partial has no field 'c'"),
    (list[int], {"a": 1}, "expected an array, got dict"),
    (dict[str, int], [1], "expected an object, got list"),
    (int | str, [1], "expected int, got list [1] / expected str, got list [1]"),
])
def test_values_that_cannot_become_the_type_are_named_with_where_they_differ(
        tp: Any, value: Any, problem: str) -> None:
    for direction in (PayloadType(tp).encode, PayloadType(tp).decode):
        with pytest.raises(obsq.PayloadError) as refused:
            direction(value, "the payload")
        assert problem in str(refused.value)


def test_the_types_are_read_from_the_handlers_annotations() -> None:
    async def typed(task: obsq.Task[Outer]) -> Inner: ...
    def bare(task: obsq.Task) -> None: ...
    def untyped(task): ...  # type: ignore[no-untyped-def]
    def of_any(task: obsq.Task[Any]) -> Any: ...

    declared = payload_type_of(typed)
    assert declared is not None and declared.annotation is Outer
    result = result_type_of(typed)
    assert result is not None and result.annotation is Inner
    for handler in (bare, untyped, of_any):
        assert payload_type_of(handler) is None and result_type_of(handler) is None


def test_a_dataclass_instance_is_checked_field_by_field_at_enqueue() -> None:
    wrong = Outer(Inner("1"), (2, "b"))  # type: ignore[arg-type]
    with pytest.raises(obsq.PayloadError, match=r"inner\.n: expected int, got str '1'"):
        PayloadType(Outer).encode(wrong, "the payload")
