"""The public path of `sync_safe` (docs/guides/producers.md): producer hooks are composed
in obsq/producer/producer_chain.py."""

from obsq.producer.producer_chain import sync_safe

__all__ = ["sync_safe"]
