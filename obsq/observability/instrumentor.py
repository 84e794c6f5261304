"""OpenTelemetry's instrumentor for obsq, registered in the `opentelemetry_instrumentor`
entry-point group: `opentelemetry-instrument python app.py` gives every Client (and so
every SyncClient) its send spans, with the trace context in the task headers, and its
enqueue counts, with no change to the application's code, as it does for Celery and
redis-py. Workers (`obsq worker`) trace themselves.

In code: `ObsqInstrumentor().instrument()` before the Clients are made.

Its base class is opentelemetry-instrumentation's, which the `otlp` extra brings (as does
any set-up that has `opentelemetry-instrument`); a plain install of obsq has the API only.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

try:
    from opentelemetry.instrumentation.instrumentor import (  # type: ignore[attr-defined]
        BaseInstrumentor,
    )
    from opentelemetry.instrumentation.utils import unwrap
    from wrapt import wrap_function_wrapper
except ImportError as exc:
    raise ImportError(f"obsq's instrumentor needs opentelemetry-instrumentation ({exc}): "
                      "pip install 'obsq[otlp]'") from exc

from obsq.observability.instrument import instrument_client
from obsq.producer.client import Client


def _instrumented_init(init: Any, client: Client, args: Any, kwargs: Any) -> None:
    init(*args, **kwargs)
    instrument_client(client)


class ObsqInstrumentor(BaseInstrumentor):
    """Instruments each Client as it is made (instrument_client); `uninstrument()` stops it
    for the Clients made after."""

    def instrumentation_dependencies(self) -> Collection[str]:
        return ()  # obsq instruments itself: no other library's version to check

    def _instrument(self, **kwargs: Any) -> None:
        wrap_function_wrapper(Client, "__init__", _instrumented_init)

    def _uninstrument(self, **kwargs: Any) -> None:
        unwrap(Client, "__init__")
