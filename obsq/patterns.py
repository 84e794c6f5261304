"""Values by route pattern (routes, aggregators, a worker's own limits), found for a task
type as routes are: the exact type, else the longest prefix ending in ':' or '.', else '*'."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

CATCH_ALL = "*"
PREFIX_ENDINGS = (":", ".")
T = TypeVar("T")
_MISSING: Any = object()


def is_prefix(pattern: str) -> bool:
    return pattern == CATCH_ALL or pattern.endswith(PREFIX_ENDINGS)


class PatternTable(Generic[T]):
    """Values by route pattern, found for a task type as routes are: the exact type, else
    the longest prefix (ending in ':' or '.') it starts with, else '*'."""

    def __init__(self) -> None:
        self._exact: dict[str, T] = {}
        self._prefixes: list[tuple[str, T]] = []  # longest first, '*' last
        self._cache: dict[str, T | None] = {}

    def __contains__(self, pattern: str) -> bool:
        return pattern in self._exact or any(p == pattern for p, _ in self._prefixes)

    def add(self, pattern: str, value: T) -> None:
        if is_prefix(pattern):
            self._prefixes.append((pattern, value))
            self._prefixes.sort(key=lambda item: (item[0] == CATCH_ALL, -len(item[0])))
        else:
            self._exact[pattern] = value
        self._cache.clear()

    def match(self, task_type: str) -> T | None:
        found = self._cache.get(task_type, _MISSING)
        if found is _MISSING:
            found = self._exact.get(task_type)
            if found is None:
                found = next((v for p, v in self._prefixes
                              if p == CATCH_ALL or task_type.startswith(p)), None)
            if len(self._cache) < 10_000:  # types behind "*" are unbounded
                self._cache[task_type] = found
        return found

    def values(self) -> list[T]:
        return [*self._exact.values(), *(v for _, v in self._prefixes)]
