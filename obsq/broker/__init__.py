"""Everything that speaks Redis lives in this package."""

from obsq.broker.broker import Broker
from obsq.broker.keys import TASK_STATES, GlobalKeys, QueueKeys
from obsq.broker.records import (
    Attempt,
    Completion,
    Completions,
    Ended,
    Enqueued,
    Fetched,
    FetchedTask,
    QueueStats,
)

__all__ = ["TASK_STATES", "Attempt", "Broker", "Completion", "Completions", "Ended",
           "Enqueued", "Fetched", "FetchedTask", "GlobalKeys", "QueueKeys", "QueueStats"]
