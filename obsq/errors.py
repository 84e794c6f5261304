"""Exceptions of the public API, and the ones a handler raises to steer its task."""

from __future__ import annotations


class ObsqError(Exception):
    """Base class of every error obsq raises."""


class DuplicateTask(ObsqError):
    """A task with the same id, or the same type and payload within `unique_for`, exists."""

    def __init__(self, message: str, existing_id: str | None = None) -> None:
        super().__init__(message)
        self.existing_id = existing_id


class SkipRetry(ObsqError):
    """Raised by a handler: the task can never succeed, send it to `dead` at once."""


class Retry(ObsqError):
    """Raised by `Task.retry_in`: schedule the task again after `delay` seconds."""

    def __init__(self, delay: float) -> None:
        if delay < 0:
            raise ValueError(f"retry delay must not be negative, got {delay!r}")
        super().__init__(f"retry requested in {delay:g} s")
        self.delay = delay


class PayloadError(ObsqError, ValueError):
    """A payload that cannot become its handler's payload type (`task: obsq.Task[P]`): at
    enqueue it is refused, nothing written; a stored one that does not decode (into P, or
    as JSON) ends its task dead, as retrying cannot help."""


class UnreadableRecord(ObsqError):
    """A record in Redis does not read as what its place says it is (written or deleted
    outside obsq): the task ends dead, or the flow is set aside, alone, with this as why."""


class TaskTooLarge(ObsqError, ValueError):
    """A producer's payload or headers exceed their limit; nothing was written."""


class UnknownTaskType(ObsqError, ValueError):
    """No route matches the task's type. A worker hands the task on, as a newer worker may
    know it; a Client given the App refuses it at enqueue, writing nothing (a typo)."""


class TaskTimeout(ObsqError):
    """The handler ran longer than the task's timeout."""


class HandlerCrashed(ObsqError):
    """The process that ran a plain handler (`pool="process"`) died before the handler
    returned: only that attempt fails (and is retried), and the process is replaced."""


class TaskFailed(ObsqError):
    """`Client.result`: the task ended in `dead`."""

    def __init__(self, task_id: str, error: str | None) -> None:
        super().__init__(f"task {task_id} failed: {error}")
        self.task_id = task_id
        self.error = error


class FlowFailed(TaskFailed):
    """`Client.result` of a flow: the step `task_id` ended dead or cancelled (or the flow was
    cancelled: `task_id` is then the flow's id), so the flow stopped there."""

    def __init__(self, flow_id: str, task_id: str, error: str | None) -> None:
        super().__init__(task_id, error)
        self.flow_id = flow_id
        self.args = (f"flow {flow_id} failed at step {task_id}: {error}",)


class ResultTimeout(ObsqError, TimeoutError):
    """`Client.result(timeout=)`: the task did not end within the time the caller waits (the
    task goes on; it is not the handler's TaskTimeout)."""


class TaskCancelled(TaskFailed):
    """`Client.result`: the task was cancelled."""

    def __init__(self, task_id: str) -> None:
        super().__init__(task_id, "cancelled")
        self.args = (f"task {task_id} was cancelled",)


EXPIRED_PREFIX = "TaskExpired:"  # how a dead task's stored error says it expired


class TaskExpired(TaskFailed):
    """The task was not started by its expiry (`expires=`), so it never ran (or, failed, its
    retry would have started after it): it ended dead with this as its error, its text
    starting with EXPIRED_PREFIX. `Client.result` raises it."""

    def __init__(self, task_id: str, error: str | None = None) -> None:
        super().__init__(task_id, error or f"{EXPIRED_PREFIX} not started by its expiry")
        why = self.error.removeprefix(EXPIRED_PREFIX).strip() if self.error else ""
        self.args = (f"task {task_id} expired: {why}",)


class FlowCancelled(FlowFailed, TaskCancelled):
    """`Client.result` of a flow that was cancelled (`Client.cancel`): a FlowFailed, and a
    TaskCancelled as a cancelled task's result raises."""

    def __init__(self, flow_id: str) -> None:
        TaskFailed.__init__(self, flow_id, "cancelled")  # the two bases' own set only args
        self.flow_id = flow_id
        self.args = (f"flow {flow_id} was cancelled",)


class TaskNotFound(ObsqError, LookupError):
    """No such task (never enqueued, or finished without retention and already removed)."""


class QueueNotFound(ObsqError, LookupError):
    """No queue of that name in the namespace (no task was ever enqueued to it)."""


class TaskRunning(ObsqError):
    """The Inspector refuses to delete a task while an attempt of it runs."""


class BrokerError(ObsqError):
    """A Redis call failed (Redis away, restarting, failing over, or refusing the command).

    Loops retry with backoff; producers get it raised and may retry."""

    def __init__(self, operation: str, cause: BaseException, message: str | None = None
                 ) -> None:
        """`message`: said instead of the call's name and its cause (the broker's own
        wording of a failed first contact, or of a permission the Redis user lacks)."""
        self.operation = operation
        self.out_of_memory = "maxmemory" in str(cause)  # Redis refuses writes: it is full
        self.permission_denied = denied_by_acl(cause)  # an operator must change the ACL
        if message is not None:
            super().__init__(message)
        elif self.out_of_memory:
            super().__init__(f"Redis call {operation!r} refused: Redis is full (tasks "
                             f"already queued are kept and run, and enqueues succeed again "
                             f"as workers drain them): {cause}")
        else:
            super().__init__(f"Redis call {operation!r} failed: {cause}")

    def during(self, call: str) -> BrokerError:
        """This failure named by the call the user made (`enqueue`), not by the step of it
        that failed (`partition_counts`): the same class, cause and flags (itself when it
        names that call already)."""
        if call == self.operation:
            return self
        named = type(self).__new__(type(self))
        named.__dict__.update(self.__dict__)
        named.operation = call
        named.args = (str(self).replace(repr(self.operation), repr(call), 1),)
        return named


READ_ONLY_CALLS = frozenset({"task_info", "memory_policy", "watch", "find_queue",
                             "read_inbox", "schedules", "partition_counts"})


class BrokerTimeout(BrokerError):
    """A producer's call got no answer from Redis within its deadline (Client(call_timeout=),
    OBSQ_CALL_TIMEOUT): Redis is stopped, overloaded or out of reach. Whether a write sent
    before the deadline happened is unknown: Redis may still run it when it wakes up, so
    retry an enqueue with the same task_id (a DuplicateTask then means it is there). A call
    that only reads (READ_ONLY_CALLS) wrote nothing and is simply made again. The calls of
    a worker and of a scheduler have the deadline too (`worker`), and their loops try them
    again."""

    def __init__(self, operation: str, timeout: float, url: str, *, worker: bool = False
                 ) -> None:
        self.timeout = timeout
        if worker:
            said = (f"within {timeout:g} s (the call deadline of workers and schedulers, "
                    "OBSQ_CALL_TIMEOUT; a blocking wait gets its own length on top)")
        else:
            said = (f"within the call deadline of {timeout:g} s (Client(call_timeout=...), "
                    "OBSQ_CALL_TIMEOUT)")
            if operation not in READ_ONLY_CALLS:
                said += "; a write it carried may still happen: retry an enqueue with the " \
                    "same task_id"
        super().__init__(operation, TimeoutError(f"no answer within {timeout:g} s"),
                         f"Redis at {url} did not answer {operation!r} {said}")


def denied_by_acl(cause: BaseException | str) -> bool:
    """Redis refused a command or a key to the user's ACL: NOPERM, or, inside a script on
    Redis 6.2, "can't run this command"."""
    text = str(cause).lower()
    return "noperm" in text or "no permissions" in text or "can't run" in text


class ConfigurationError(ObsqError, ValueError):
    """A wrong option, URL or setting; reported once at start (`obsq` exits 2)."""


class StartupError(ConfigurationError):
    """What a process needs at start fails it, though its options are right: Redis cannot
    be reached or refuses the credentials, the Redis version or the user's commands, the
    App's module does not import, a port is taken (`obsq` exits 1). `unreachable`: Redis
    did not answer at all (refused, reset, timed out), which a later try may mend."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable
