"""A child process of the process pool: it imports the worker's App by its module path (as
`obsq worker MODULE:APP` names it), then runs the plain handlers the worker sends it, one at
a time, and sends back each one's result, or its exception with the traceback as text,
with whether it is past its limits (obsq/engine/recycling.py) and should be replaced.

A task reaches the child as the fields it was built from (`Task.portable()`: id, type,
queue, the payload and headers as Redis gave them, retry count, options), so the handler
decodes the payload itself, as in a thread; and with the worker's OpenTelemetry context
(W3C trace context and baggage through the API's global propagator), attached around the
handler, so spans it starts or enqueues it sends belong to the task's trace. What the child
cannot do: `task.update_state` raises RuntimeError (progress is written by the worker
process, which a plain handler cannot await), and `task.cancelled` stays False (a cancelled
task's child is killed instead). The child ignores SIGINT (a terminal's Ctrl-C is for the
worker, which decides when its children end) and exits when the worker is gone.

What the worker's process sets up on its App at run time (obsq.observability.run_worker's
tracing) is not in a freshly imported App: `on_child_start(setup)` registers what each child
runs on its App after importing it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from obsq.app import App, load_app
from obsq.engine.pools.base import handler_traceback, raised_at
from obsq.engine.recycling import NO_RECYCLING, Recycling
from obsq.errors import UnknownTaskType
from obsq.task import Task

if TYPE_CHECKING:  # the child's pipes; a worker imports this module without multiprocessing
    from multiprocessing.connection import Connection

ChildSetup = Callable[[App], None]
_setups: list[ChildSetup] = []


def on_child_start(setup: ChildSetup) -> None:
    """Run `setup(app)` in each child process of the process pools started from now on,
    once it has imported the App. It travels to the child by pickle: a function of a module,
    or a functools.partial of one. Registering the same one again adds nothing."""
    if setup not in _setups:
        _setups.append(setup)


def child_setups() -> list[ChildSetup]:
    return list(_setups)


class RemoteError(Exception):
    """A handler's exception that could not travel back as itself (it does not pickle)."""


def serve(conn: Connection, lifeline: Connection, app_path: str,
          setups: list[ChildSetup], recycling: Recycling = NO_RECYCLING) -> None:
    """The child's main loop (the target of its multiprocessing.Process). `lifeline`: the
    read end of a pipe whose write end only the worker holds; `recycling`: the limits past
    which its replies ask the worker to replace it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_worker(lifeline)
    app = load_app(app_path)
    for setup in setups:
        setup(app)
    tasks = 0
    while True:
        try:
            fields, carrier = conn.recv()
        except (EOFError, OSError):  # the worker closed its end: it is done with us
            return
        tasks += 1
        conn.send_bytes(_run(app, fields, carrier, functools.partial(_retiring, recycling, tasks)))


def _retiring(recycling: Recycling, tasks: int) -> tuple[str, str] | None:
    """(why, the log's words) when this child is past its limits after `tasks` tasks."""
    reason = recycling.spent(tasks) if recycling else None
    return None if reason is None else (reason, recycling.said(reason, tasks))


def _run(app: App, fields: dict[str, Any], carrier: dict[str, str],
         retiring: Callable[[], tuple[str, str] | None]) -> bytes:
    """The pickled reply: the child's `retiring()` after the handler, then ("ok", result),
    ("unsent", why) or ("error", exc, traceback, where it was raised)."""
    import pickle  # here, not at the top: a worker imports this module and never pickles

    route = app.route(fields["type"])
    task: Task[Any] = Task(**fields, update_state=_no_update_state,
                           payload_type=route.payload_type if route is not None else None)
    token = _attach(carrier)
    try:
        if route is None or route.is_async:
            raise UnknownTaskType(f"no plain handler is registered for task type "
                                  f"{task.type!r} in {app.import_path}")
        result = route.handler(task)
    except BaseException as exc:  # SystemExit too: it ends the attempt, not the child
        return pickle.dumps((retiring(), "error", _sendable(exc), handler_traceback(exc),
                             raised_at(exc)))
    finally:
        _detach(token)
    try:
        return pickle.dumps((retiring(), "ok", result))
    except Exception as exc:
        return pickle.dumps((retiring(), "unsent", f"the result of task type {task.type!r} "
                             f"cannot be sent back from the handler's process: {exc}"))


def _sendable(exc: BaseException) -> BaseException:
    import pickle

    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return RemoteError(f"{type(exc).__qualname__}: {exc}")


def _no_update_state(task: Task, state: Any) -> NoReturn:
    raise RuntimeError("task.update_state is not available to a plain handler run in a "
                       "process pool (the worker process writes progress); return it in the "
                       "result, or make the handler async")


def _attach(carrier: dict[str, str]) -> object | None:
    if not carrier:
        return None
    from opentelemetry import context, propagate

    return context.attach(propagate.extract(carrier))


def _detach(token: object | None) -> None:
    if token is not None:
        from opentelemetry import context

        context.detach(token)  # type: ignore[arg-type]


def _exit_with_worker(lifeline: Connection) -> None:
    """A child must not outlive its worker (a SIGKILLed one) in a hung handler. Its parent
    is the fork server, which lives as long as any child does, so the child watches a pipe
    of the worker's instead: nothing is ever written to it, and its end means the worker's."""
    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv()
        os._exit(1)

    threading.Thread(target=watch, name="obsq-worker-watch", daemon=True).start()
