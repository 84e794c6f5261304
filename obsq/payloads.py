"""A handler's payload and result types: the `P` of its `task: obsq.Task[P]` and what it
returns, read from its annotations when it is registered (`@app.task`).

A producer's payload is checked against `P` at enqueue and written as JSON (a dataclass as
an object of its fields, each checked; a pydantic model as its `model_dump(mode="json")`),
so a payload that cannot become `P` is refused (PayloadError) before anything is written.
The worker reads the stored JSON back as `P` before the handler runs; a stored payload that
no longer does (a deploy changed the type) raises PayloadError, which ends the task dead
without retries: it would not decode on a retry either. A Client reads the stored result
of a task it enqueued by its handler back as the handler's return type the same way.

Understood: dict, list, tuple, TypedDict, dataclasses, pydantic models (recognized without
importing pydantic), unions and Optional, Literal, Annotated, and the JSON scalars; any
other class is checked with isinstance. An untyped handler (`task: obsq.Task`, or no
annotation) gets the JSON value as it is, unchecked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import types
import typing
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Union

from obsq.errors import PayloadError

if TYPE_CHECKING:
    from obsq.app import Route

_UNIONS = (Union, types.UnionType)
_SEQUENCES = (list, tuple, Sequence, set, frozenset)
_MAPPINGS = (dict, Mapping)


class _Mismatch(Exception):
    """A value that is not of the type where it was found (`where`: its path in the payload)."""

    def __init__(self, where: str, problem: str) -> None:
        super().__init__(f"{where}: {problem}" if where else problem)


class PayloadType:
    """One declared type: `encode` makes a value of it JSON-able, `decode` reads JSON back
    as it. Both raise PayloadError naming the type and where the value differs."""

    __slots__ = ("annotation", "name")

    def __init__(self, annotation: Any) -> None:
        self.annotation = annotation
        self.name = getattr(annotation, "__qualname__", None) or repr(annotation)

    def encode(self, value: Any, what: str) -> Any:
        """`value` as JSON-able data, or PayloadError (`what`: the payload's name)."""
        try:
            return _convert(self.annotation, value, "", decoding=False)
        except _Mismatch as exc:
            raise PayloadError(f"{what} cannot become {self.name}: {exc}") from None

    def decode(self, value: Any, what: str) -> Any:
        """The JSON `value` read back as the type, or PayloadError."""
        try:
            return _convert(self.annotation, value, "", decoding=True)
        except _Mismatch as exc:
            raise PayloadError(f"{what} does not decode into {self.name}: {exc}") from None


def payload_type_of(handler: Callable[..., Any]) -> PayloadType | None:
    """The type of the handler's first parameter's payload (`obsq.Task[P]`'s P); None when
    it is untyped (no annotation, a bare Task, Task[Any])."""
    hints = _hints(handler)
    params = [p for p in _parameters(handler) if p in hints]
    if not params:
        return None
    args = typing.get_args(hints[params[0]])
    return _typed(args[0]) if args else None


def result_type_of(handler: Callable[..., Any]) -> PayloadType | None:
    """The handler's declared result (an async handler's: what its coroutine returns)."""
    returned = _hints(handler).get("return", Any)
    return _typed(returned)


def _typed(annotation: Any) -> PayloadType | None:
    return None if annotation in (Any, object, None, type(None)) else PayloadType(annotation)


def _hints(handler: Callable[..., Any]) -> dict[str, Any]:
    """Its annotations resolved (a module using `from __future__ import annotations` holds
    them as text). When a name does not resolve (a type local to a function): a typed
    payload (`Task[...]`) is a registration error, said at once; otherwise the handler is
    untyped, as before types were read."""
    try:
        return typing.get_type_hints(handler, include_extras=True)
    except (NameError, TypeError) as exc:
        annotations = getattr(handler, "__annotations__", {})
        first = next((annotations[p] for p in _parameters(handler) if p in annotations), "")
        if "[" in str(first):
            raise TypeError(f"the annotations of handler {_name(handler)} do not resolve: "
                            f"{exc}; define the types it names at the top level of its "
                            "module") from None
        return {}


def _parameters(handler: Callable[..., Any]) -> list[str]:
    import inspect  # here, not at the top: only a registration needs it

    try:
        return list(inspect.signature(handler).parameters)
    except (TypeError, ValueError):
        return []


def _convert(tp: Any, value: Any, where: str, *, decoding: bool) -> Any:
    """`value` as `tp`: JSON-able when encoding, of the type when decoding."""
    if tp is Any or tp is object or isinstance(tp, typing.TypeVar):
        return value
    if tp is None or tp is type(None):
        if value is not None:
            raise _Mismatch(where, f"expected None, got {_kind(value)}")
        return None
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return _convert(args[0], value, where, decoding=decoding)
    if origin in _UNIONS:
        return _one_of(args, value, where, decoding)
    if origin is Literal:
        if value not in args:
            raise _Mismatch(where, f"expected one of {list(args)!r}, got {value!r}")
        return value
    if typing.is_typeddict(tp):
        return _record(tp, value, where, decoding, make=None)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not decoding and isinstance(value, tp):  # its fields, each checked and encoded
            value = {f.name: getattr(value, f.name) for f in dataclasses.fields(tp) if f.init}
        return _record(tp, value, where, decoding, make=tp)
    if isinstance(tp, type) and _is_pydantic(tp):
        return _model(tp, value, where, decoding)
    if origin in _MAPPINGS or tp in _MAPPINGS:
        return _mapping(args, value, where, decoding)
    if origin in _SEQUENCES or tp in _SEQUENCES:
        return _sequence(origin or tp, args, value, where, decoding)
    return _scalar(origin or tp, value, where)


def _one_of(args: tuple[Any, ...], value: Any, where: str, decoding: bool) -> Any:
    problems = []
    for arg in args:
        try:
            return _convert(arg, value, where, decoding=decoding)
        except _Mismatch as exc:
            problems.append(str(exc))
    raise _Mismatch("", " / ".join(problems))


def _record(tp: type, value: Any, where: str, decoding: bool,
            make: Callable[..., Any] | None) -> Any:
    """A TypedDict (`make` None: stays a dict) or a dataclass, field by field: the required
    fields present, no unknown one."""
    if not isinstance(value, dict):
        raise _Mismatch(where, f"expected an object for {tp.__qualname__}, got {_kind(value)}")
    hints = typing.get_type_hints(tp, include_extras=True)
    if make is None:
        fields, required = hints, set(getattr(tp, "__required_keys__", hints))
    else:
        init = [f for f in dataclasses.fields(tp) if f.init]
        fields = {f.name: hints.get(f.name, Any) for f in init}
        required = {f.name for f in init if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING}
    missing = sorted(required - value.keys())
    if missing:
        raise _Mismatch(where, f"{tp.__qualname__} misses {', '.join(map(repr, missing))}")
    unknown = sorted(str(k) for k in value.keys() - fields.keys())
    if unknown:
        raise _Mismatch(where, f"{tp.__qualname__} has no field "
                               f"{', '.join(map(repr, unknown))}")
    converted = {name: _convert(fields[name], item, f"{where}.{name}".lstrip("."),
                                decoding=decoding) for name, item in value.items()}
    return make(**converted) if make is not None and decoding else converted


def _is_pydantic(tp: type) -> bool:
    """A pydantic model, found without importing pydantic (a user without it pays nothing)."""
    return any(base.__module__.startswith("pydantic") and base.__name__ == "BaseModel"
               for base in tp.__mro__)


def _model(tp: Any, value: Any, where: str, decoding: bool) -> Any:
    if not isinstance(value, tp):
        try:
            value = tp.model_validate(value)
        except ValueError as exc:  # pydantic's ValidationError
            raise _Mismatch(where, str(exc)) from None
    return value if decoding else value.model_dump(mode="json")


def _mapping(args: tuple[Any, ...], value: Any, where: str, decoding: bool) -> Any:
    if not isinstance(value, dict):
        raise _Mismatch(where, f"expected an object, got {_kind(value)}")
    item_type = args[1] if len(args) == 2 else Any
    return {key: _convert(item_type, item, f"{where}[{key!r}]", decoding=decoding)
            for key, item in value.items()}


def _sequence(kind: Any, args: tuple[Any, ...], value: Any, where: str,
              decoding: bool) -> Any:
    if not isinstance(value, (list, tuple) if decoding or kind in (list, tuple) else
                      (list, tuple, set, frozenset)):
        raise _Mismatch(where, f"expected an array, got {_kind(value)}")
    if kind is tuple and args and args[-1] is not Ellipsis:  # tuple[A, B]: one type each
        if len(args) != len(value):
            raise _Mismatch(where, f"expected {len(args)} items, got {len(value)}")
        types_ = list(args)
    else:
        types_ = [args[0] if args else Any] * len(value)
    items = [_convert(t, item, f"{where}[{i}]", decoding=decoding)
             for i, (t, item) in enumerate(zip(types_, value))]
    if not decoding:
        return items
    return tuple(items) if kind is tuple else set(items) if kind in (set, frozenset) else items


def _scalar(tp: Any, value: Any, where: str) -> Any:
    if not isinstance(tp, type):
        return value  # a typing construct this module does not read: unchecked
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)  # JSON has one kind of number
    if isinstance(value, tp) and not (tp is int and isinstance(value, bool)):
        return value
    raise _Mismatch(where, f"expected {tp.__qualname__}, got {_kind(value)}")


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:120]


class Registration:
    """What `@app.task` learned of a handler: the patterns it was registered for, its
    route (the last registered: its defaults) and its declared payload and result types.
    A Client finds it from the handler itself, so `client.enqueue(handler, payload)` needs
    no App."""

    __slots__ = ("patterns", "payload", "result", "route")

    def __init__(self, handler: Callable[..., Any]) -> None:
        self.patterns: list[str] = []
        self.route: Route | None = None
        self.payload = payload_type_of(handler)
        self.result = result_type_of(handler)

    def task_type(self, handler: Callable[..., Any]) -> str:
        """The one task type its tasks are enqueued as; TypeError when it has none (a prefix
        or '*') or more than one."""
        exact = sorted({p for p in self.patterns if not p.endswith((":", ".", "*"))})
        if len(exact) != 1:
            raise TypeError(f"handler {_name(handler)} is registered for "
                            f"{', '.join(map(repr, self.patterns))}: enqueue it by the "
                            "type name")
        return exact[0]


_registrations: weakref.WeakKeyDictionary[Callable[..., Any], Registration] = \
    weakref.WeakKeyDictionary()


def register(handler: Callable[..., Any], pattern: str) -> Registration:
    """Record that `handler` runs `pattern`'s tasks; its types are read once."""
    try:
        found = _registrations.get(handler)
    except TypeError:  # not weakly referable (a builtin): it cannot be enqueued by itself
        found = None
    if found is None:
        found = Registration(handler)
        with contextlib.suppress(TypeError):
            _registrations[handler] = found
    found.patterns.append(pattern)
    return found


def registration_of(handler: Callable[..., Any]) -> Registration:
    """The handler's Registration; TypeError when `@app.task` did not register it."""
    try:
        found = _registrations.get(handler)
    except TypeError:
        found = None
    if found is None:
        raise TypeError(f"{_name(handler)} is not a handler registered with @app.task: give "
                        "a registered handler or a task type name")
    return found


def _name(handler: Callable[..., Any]) -> str:
    return getattr(handler, "__qualname__", None) or repr(handler)
