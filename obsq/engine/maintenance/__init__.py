"""Maintenance sweeps that keep the queues healthy whichever workers come and go:
the forwarder (due scheduled/retry tasks -> pending), the recoverer (tasks of lost
workers and expired leases -> pending) and the janitor (retention). Every worker runs
them; a short lock per sweep lets one process at a time do the work."""

from obsq.engine.maintenance.forwarder import Forwarder
from obsq.engine.maintenance.janitor import Janitor
from obsq.engine.maintenance.recoverer import Recoverer

__all__ = ["Forwarder", "Janitor", "Recoverer"]
