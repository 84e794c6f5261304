"""The broker: one method per state change, each one Lua script or one plain command,
grouped by who calls them. This package is the only code in obsq that speaks Redis."""

from __future__ import annotations

from obsq.broker.checking import Checking
from obsq.broker.flowing import Flowing
from obsq.broker.groups_events import GroupsAndEvents
from obsq.broker.inspection import Inspection
from obsq.broker.producing import Producing
from obsq.broker.scheduling import Scheduling
from obsq.broker.startup import StartupChecks
from obsq.broker.upkeep import Upkeep
from obsq.broker.working import Working


class Broker(Producing, Working, Upkeep, Inspection, Scheduling, GroupsAndEvents, Flowing, Checking,
             StartupChecks):
    """Every Redis call of obsq, on one connection pool."""
