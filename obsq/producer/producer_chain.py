"""Producer hooks composed around a write: the App's (outermost), then a Client's, the
first added outermost. A hook marked `sync_safe` awaits nothing but `call_next`, so a
SyncClient can run the chain in its caller's thread with no event loop."""

from __future__ import annotations

from collections.abc import Awaitable

from obsq.app import CallNextProducer, ProducerHook
from obsq.task import TaskInfo, TaskMessage


def sync_safe(hook: ProducerHook) -> ProducerHook:
    """Mark a producer hook that awaits nothing but `call_next`: a SyncClient can then run
    it in the caller's own thread, without an event loop. (A SyncClient with a hook not so
    marked hands its enqueues to its event-loop thread, as a hook may await anything.)"""
    hook.obsq_sync_safe = True  # type: ignore[attr-defined]
    return hook


def is_sync_safe(hook: ProducerHook) -> bool:
    return getattr(hook, "obsq_sync_safe", False) is True


class ProducerChain:
    """Producer hooks (an App's, then a Client's: the first is the outermost) around an
    innermost write, composed again only when hooks were added."""

    def __init__(self, innermost: CallNextProducer) -> None:
        self.innermost = innermost
        self._built: tuple[int, int] = (-1, -1)  # the hook counts `_call` was built of
        self._call: CallNextProducer = innermost

    def __call__(self, app_hooks: list[ProducerHook], hooks: list[ProducerHook]
                 ) -> CallNextProducer:
        if self._built != (len(app_hooks), len(hooks)):
            call = self.innermost
            for hook in reversed([*app_hooks, *hooks]):
                call = _bind(hook, call)
            self._call, self._built = call, (len(app_hooks), len(hooks))
        return self._call


def _bind(hook: ProducerHook, call_next: CallNextProducer) -> CallNextProducer:
    def call(messages: list[TaskMessage]) -> Awaitable[list[TaskInfo]]:
        return hook(messages, call_next)
    return call
