"""Everything that speaks Redis lives in this package."""

from obsq.broker.broker import Broker
from obsq.broker.keys import TASK_STATES, GlobalKeys, QueueKeys, ScheduleKeys
from obsq.broker.records import (
    Attempt,
    Completion,
    Completions,
    DueFires,
    Ended,
    Enqueued,
    Fetched,
    FetchedTask,
    QueueStats,
    ScheduleRecord,
)

__all__ = ["TASK_STATES", "Attempt", "Broker", "Completion", "Completions", "DueFires",
           "Ended", "Enqueued", "Fetched", "FetchedTask", "GlobalKeys", "QueueKeys",
           "QueueStats", "ScheduleKeys", "ScheduleRecord"]
