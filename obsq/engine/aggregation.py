"""The aggregator loop: every worker whose App has aggregators (app.aggregate) claims
batches of due groups in the queues it serves and turns each into one task.

It runs in every such worker, not under a lock, so that the work spreads: the claim in
Redis (claim_batches.lua) gives each batch to one worker, and a batch's claim runs out
after `aggregate_lease` so that another worker takes over the batch of one that died. The
aggregated task's id is its batch's id and it is kept at least AGGREGATE_KEEP after it
ends, so a batch claimed again after a crash between the enqueue and the end of the batch
is refused by Redis as a duplicate and then ended: each batch gives one task. An
aggregator that raises or returns junk loses nothing: the batch keeps its tasks and the
error and is claimed again after a backoff.

A stopping worker claims no more batches, cancels the aggregations it is running and
releases their claims at once (release_batches.lua checks that each claim is still its
own), so another worker takes them over now rather than when the claims run out; a batch
whose task was enqueued before the cancel is refused as a duplicate there and ended.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from typing import Any

from obsq.app import App
from obsq.background import BackgroundLoop
from obsq.broker import Batch, Broker
from obsq.errors import BrokerError
from obsq.producer.client import Client
from obsq.settings import (
    AGGREGATE_BACKOFF_BASE,
    AGGREGATE_BACKOFF_CAP,
    AGGREGATE_BATCHES,
    AGGREGATE_KEEP,
)
from obsq.task import Job, Task

log = logging.getLogger("obsq")
GROUP_HEADER = "obsq-group"  # on an aggregated task: the group it was made of


class AggregationLoop(BackgroundLoop):
    name = "aggregator"

    def __init__(self, app: App, broker: Broker, owner: str, queues: list[str],
                 interval: float, lease: float, allow_eviction: bool = False) -> None:
        """`allow_eviction`: the worker's (it checked Redis's policy at start)."""
        super().__init__(interval, broker.clock)
        self.app = app
        self.broker = broker
        self.owner = owner
        self.queues = queues  # shared: the worker adds partitions to it
        self.lease = lease
        self._running: set[asyncio.Task[None]] = set()  # aggregations under way
        self._abandoned: list[Batch] = []  # claimed, their aggregation cancelled by stop()
        # the App's producer hooks apply to the aggregated tasks
        self.client = Client(namespace=broker.namespace, app=app, broker=broker,
                             allow_eviction=allow_eviction)

    async def tick(self) -> float | None:
        claimable = [(a.pattern, a.max_size, a.max_delay, a.grace_period)
                     for a in self.app.aggregations]
        waits = [self.interval]
        for queue in self.queues:
            if self._stopping.is_set():
                return None
            claimed = await self.broker.claim_batches(queue, self.owner, self.lease,
                                                      claimable, AGGREGATE_BATCHES)
            if self._stopping.is_set():  # stopped while claiming: stop() releases these
                self._abandoned.extend(claimed.batches)
                return None
            runs = [asyncio.create_task(self.aggregate(b)) for b in claimed.batches]
            self._running.update(runs)
            try:
                ran = await asyncio.gather(*runs, return_exceptions=True)
            finally:
                self._running.difference_update(runs)
            # Redis away: the batches' claims run out, and are taken again (a cancelled
            # run is no failure: stop() releases its batch)
            failed = next((r for r in ran if isinstance(r, Exception)), None)
            if failed is not None:
                raise failed
            if claimed.next_due is not None:
                waits.append(claimed.next_due)
        return min(waits)

    async def stop(self) -> None:
        """Stop claiming, cancel the aggregations under way and release their batches."""
        self._stopping.set()
        for run in list(self._running):
            run.cancel()
        await super().stop()
        abandoned, self._abandoned = self._abandoned, []
        if abandoned:
            try:
                released = await self.broker.release_batches(self.owner, abandoned)
            except BrokerError as exc:
                log.warning("could not release %d batch claim(s) (%s): they run out in "
                            "%g s", len(abandoned), exc, self.lease)
            else:
                log.info("released %d of %d batch claim(s) for other workers", released,
                         len(abandoned))

    async def aggregate(self, batch: Batch) -> None:
        """Aggregate a claimed batch; one cancelled by stop() is left for it to release."""
        try:
            await self._aggregate(batch)
        except asyncio.CancelledError:
            self._abandoned.append(batch)
            raise

    async def _aggregate(self, batch: Batch) -> None:
        """Run the batch's aggregator and enqueue its task, then end the batch; a failure
        hands the batch back with its error, to be claimed again after a backoff."""
        entry = self.app.aggregation(batch.type)
        if entry is None:  # claimed by type: cannot happen unless the App changed
            return
        tasks = [Task(id=t.id, type=batch.type, queue=batch.queue, raw_payload=t.payload,
                      raw_headers=t.headers, retry_count=0, max_retry=0, timeout=0,
                      retention=0, binary=t.binary) for t in batch.tasks]
        try:
            if inspect.iscoroutinefunction(entry.aggregator):
                made = await entry.aggregator(batch.group, tasks)
            else:  # a plain function must not stall the worker's event loop
                made = await asyncio.to_thread(entry.aggregator, batch.group, tasks)
            job = _aggregated_job(made, batch)
            job.origins = [t.headers for t in tasks]
            await self.client.enqueue_many([job])  # a duplicate: enqueued by an earlier claim
        except BrokerError:
            raise  # Redis away, not the aggregator: its claim runs out, it is taken again
        except Exception as exc:
            retry_in = min(AGGREGATE_BACKOFF_BASE * 2 ** batch.failures, AGGREGATE_BACKOFF_CAP)
            log.warning("aggregator of %r failed for group %r of queue %s (%d task(s), "
                        "failure %d): %s: %s; trying again in %.0f s", entry.pattern,
                        batch.group, batch.queue, len(tasks), batch.failures + 1,
                        type(exc).__name__, exc, retry_in)
            await self.broker.end_batch(batch, f"{type(exc).__name__}: {exc}"[:1000],
                                        retry_in)
            self._report(batch.queue, entry.pattern, "failed")
            return
        if await self.broker.end_batch(batch):
            self._report(batch.queue, entry.pattern, "success")

    def _report(self, queue: str, pattern: str, outcome: str) -> None:
        self.app.aggregation_hooks(queue, pattern, outcome)


def _aggregated_job(made: Any, batch: Batch) -> Job:
    """The aggregator's answer as the job to enqueue under the batch's id."""
    if isinstance(made, Job):
        job = made
    elif isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], str):
        job = Job(made[0], made[1])
    else:
        raise TypeError(f"an aggregator returns (task type, payload) or an obsq.Job, got "
                        f"{type(made).__name__}")
    job.task_id = batch.id
    job.retention = max(job.retention or 0.0, AGGREGATE_KEEP)
    job.headers = {**job.headers, GROUP_HEADER: batch.group}
    return job
