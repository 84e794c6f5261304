"""Everything that speaks Redis lives in this package."""

from obsq.broker.broker import Broker
from obsq.broker.keys import (
    DEPTH_STATES,
    TASK_STATES,
    EventKeys,
    GlobalKeys,
    QueueKeys,
    ScheduleKeys,
)
from obsq.broker.records import (
    Attempt,
    Batch,
    Claimed,
    Completion,
    Completions,
    DueFires,
    Ended,
    Enqueued,
    Fetched,
    FetchedTask,
    GroupedTask,
    QueueStats,
    ScheduleRecord,
)

__all__ = [
    "DEPTH_STATES",
    "TASK_STATES",
    "Attempt",
    "Batch",
    "Broker",
    "Claimed",
    "Completion",
    "Completions",
    "DueFires",
    "Ended",
    "Enqueued",
    "EventKeys",
    "Fetched",
    "FetchedTask",
    "GlobalKeys",
    "GroupedTask",
    "QueueKeys",
    "QueueStats",
    "ScheduleKeys",
    "ScheduleRecord",
]
