"""Hearing that a running task was cancelled. `Client.cancel` marks the task in Redis and
pushes its id onto `<ns>:{<queue>}:cancel:<worker id>` in the same script, so the worker
running it learns at once (one blocking read for all its queues) and nothing is lost when
the worker is busy: the marks wait in Redis, and a marked task that its worker hands back
or retries, or whose worker dies, ends cancelled there too."""

from __future__ import annotations

from collections.abc import Callable

from obsq.background import BackgroundLoop
from obsq.broker import Broker


class CancelWatcher(BackgroundLoop):
    name = "cancel-watcher"

    def __init__(self, broker: Broker, worker_id: str, queues: list[str],
                 wait: float, cancel: Callable[[str, str], None]) -> None:
        """`cancel(queue, task id)` stops the attempt running it, if any."""
        super().__init__(wait)
        self.broker = broker
        self.worker_id = worker_id
        self.queues = queues  # shared: the worker adds partitions to it
        self.cancel = cancel

    async def tick(self) -> float:
        for queue, task_id in await self.broker.read_cancels(self.queues, self.worker_id,
                                                             self.interval):
            self.cancel(queue, task_id)
        return 0.0  # block again at once: the read itself waits
