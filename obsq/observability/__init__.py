"""Metrics, tracing and the health endpoint, built only on the public hooks."""

import logging


def instrument_app(app, *, metrics: bool = True, tracing: bool = True, concurrency: int = 0):
    return None


def instrument_client(client):
    return None


def serve_http(worker, host, port):
    raise NotImplementedError


def configure_logging(fmt: str, level: str) -> None:
    logging.basicConfig(level=level)


def setup_tracing() -> None:
    return None


async def run_exporter(redis_url: str, namespace: str, port: int) -> None:
    raise NotImplementedError
