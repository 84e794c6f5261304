"""The one way obsq calls the hooks users (and obsq.observability) register.

A hook is told what happened; it never decides what happens. So a hook that raises is
logged, with its traceback, the first time it fails (later failures of the same hook at
DEBUG, so a hook broken for every task does not flood the log), and obsq goes on as if it
had returned: the error a failed Redis call raises, a worker's health, a settle, a sweep
are the same with or without it. This holds on every thread that calls hooks (the event
loop, the heartbeat thread, a SyncClient's caller).

Middleware (`app.use`) and producer hooks (`app.use_producer`) wrap a call and may change
it on purpose; they are onions, not hooks, and are not called through here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Generic, ParamSpec

log = logging.getLogger("obsq")
P = ParamSpec("P")


class Hooks(list[Callable[P, object]], Generic[P]):
    """The hooks of one kind, in the order added; `hooks(*args)` calls each, guarded."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind  # as the log names it: "outcome hook", "Redis-error hook", ...
        self._failed: set[int] = set()  # ids of the hooks whose failure was logged

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> None:
        for hook in self:
            try:
                hook(*args, **kwargs)
            except Exception:
                if id(hook) in self._failed:
                    log.debug("%s %r failed again", self.kind, hook, exc_info=True)
                else:
                    self._failed.add(id(hook))
                    log.exception("%s %r failed; obsq goes on without it (later failures "
                                  "of this hook are logged at DEBUG)", self.kind, hook)
