"""Everything that speaks Redis lives in this package."""

from obsq.broker.broker import AckBatches, Broker, RawTask
from obsq.broker.keys import TASK_STATES, GlobalKeys, QueueKeys

__all__ = ["TASK_STATES", "AckBatches", "Broker", "GlobalKeys", "QueueKeys", "RawTask"]
