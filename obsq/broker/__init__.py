"""Everything that speaks Redis lives in this package."""

from obsq.broker.broker import Broker, RawTask
from obsq.broker.keys import TASK_STATES, GlobalKeys, QueueKeys

__all__ = ["TASK_STATES", "Broker", "GlobalKeys", "QueueKeys", "RawTask"]
