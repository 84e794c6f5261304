"""The relay's metrics, read from the relay at scrape time: the rows waiting and the age of
the oldest (as last counted, the age growing with the clock between counts, so a relay
stuck in a call still shows its backlog ageing), and the rows it moved."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from obsq.outbox.relay import Relay


class RelayCollector:
    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    def collect(self) -> Iterator[Metric]:
        table = self.relay.table.name
        backlog = self.relay.backlog
        waiting = GaugeMetricFamily("obsq_outbox_rows_waiting", "Committed outbox rows not "
                                    "yet moved to Redis, as last counted", labels=["table"])
        waiting.add_metric([table], backlog.rows)
        age = GaugeMetricFamily("obsq_outbox_oldest_age_seconds", "Age of the oldest outbox "
                                "row not yet moved to Redis (0: none)", labels=["table"])
        age.add_metric([table], backlog.age())
        relayed = CounterMetricFamily("obsq_outbox_relayed", "Outbox rows moved to Redis by "
                                      "this relay", labels=["table"])
        relayed.add_metric([table], self.relay.relayed)
        yield from (waiting, age, relayed)


def watch_relay(relay: Relay) -> RelayCollector:
    """Publish the relay's metrics with this process's (unregister the collector after)."""
    collector = RelayCollector(relay)
    REGISTRY.register(collector)
    return collector
