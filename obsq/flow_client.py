"""The public path of `ClientFlows` (docs/reference/api.md), the type of `Client.flows`:
it lives in obsq/producer/flow_client.py."""

from obsq.producer.flow_client import ClientFlows

__all__ = ["ClientFlows"]
