"""obsq: a Redis task queue and worker for Python, built for Kubernetes and made to be
watched. The package is in layers, each importing only those below it (DESIGN.md section 2
draws them): cli, ops/, observability/, inspection/, engine/, producer/, app, broker/, task.

Each public name is imported at its first use (`__getattr__`, from the module _PUBLIC says):
`import obsq` loads nothing else, a producer never loads the engine, a worker never loads
the Inspector nor the SyncClient, and the pytest plugin (obsq.pytest_plugin), which pytest
loads into every test run of a project that installs obsq, costs nothing until a test asks
for its fixtures. The imports under TYPE_CHECKING give type checkers the same names
(tests/test_architecture.py checks that they, _PUBLIC and __all__ agree)."""

import importlib
from typing import TYPE_CHECKING

from obsq._version import __version__

if TYPE_CHECKING:
    from obsq.app import (
        AggregationHook,
        App,
        CallNext,
        FlowHook,
        Middleware,
        OutcomeHook,
        ProducerHook,
        RecoveryHook,
        RecycleHook,
        RedisErrorHook,
        RefusalHook,
        Route,
        StuckHook,
        ThrottleHook,
    )
    from obsq.engine.pools.child import on_child_start
    from obsq.engine.worker import Worker
    from obsq.errors import (
        BrokerError,
        BrokerTimeout,
        ConfigurationError,
        DuplicateTask,
        FlowCancelled,
        FlowFailed,
        HandlerCrashed,
        ObsqError,
        PayloadError,
        QueueNotFound,
        ResultTimeout,
        Retry,
        SkipRetry,
        StartupError,
        TaskCancelled,
        TaskExpired,
        TaskFailed,
        TaskNotFound,
        TaskRunning,
        TaskTimeout,
        TaskTooLarge,
        UnknownTaskType,
    )
    from obsq.flow import FlowInfo, StepFailure, chain, chord
    from obsq.inspection.inspector import Inspector
    from obsq.producer.client import Client
    from obsq.producer.enqueue import sync_safe
    from obsq.producer.flow_client import ClientFlows
    from obsq.producer.sync_client import SyncClient
    from obsq.schedule import Schedule, ScheduleInfo
    from obsq.settings import WorkerSettings
    from obsq.task import Job, Task, TaskInfo, TaskMessage

_PUBLIC = {
    "obsq.app": ("AggregationHook", "App", "CallNext", "FlowHook", "Middleware", "OutcomeHook",
                 "ProducerHook", "RecoveryHook", "RecycleHook", "RedisErrorHook", "RefusalHook",
                 "Route",
                 "StuckHook", "ThrottleHook"),
    "obsq.engine.pools.child": ("on_child_start",),
    "obsq.engine.worker": ("Worker",),
    "obsq.errors": ("BrokerError", "BrokerTimeout", "ConfigurationError", "DuplicateTask",
                    "FlowCancelled", "FlowFailed", "HandlerCrashed", "ObsqError",
                    "PayloadError", "QueueNotFound", "ResultTimeout", "Retry", "SkipRetry",
                    "StartupError", "TaskCancelled", "TaskExpired", "TaskFailed",
                    "TaskNotFound", "TaskRunning", "TaskTimeout", "TaskTooLarge",
                    "UnknownTaskType"),
    "obsq.flow": ("FlowInfo", "StepFailure", "chain", "chord"),
    "obsq.inspection.inspector": ("Inspector",),
    "obsq.producer.client": ("Client",),
    "obsq.producer.enqueue": ("sync_safe",),
    "obsq.producer.flow_client": ("ClientFlows",),
    "obsq.producer.sync_client": ("SyncClient",),
    "obsq.schedule": ("Schedule", "ScheduleInfo"),
    "obsq.settings": ("WorkerSettings",),
    "obsq.task": ("Job", "Task", "TaskInfo", "TaskMessage"),
}
_MODULE_OF = {name: module for module, names in _PUBLIC.items() for name in names}


def __getattr__(name: str) -> object:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'obsq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # found directly from now on
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})


__all__ = [
    "AggregationHook", "App", "BrokerError", "BrokerTimeout", "CallNext", "Client", "ClientFlows",
    "ConfigurationError", "DuplicateTask", "FlowCancelled", "FlowFailed", "FlowHook", "FlowInfo",
    "HandlerCrashed", "Inspector", "Job", "Middleware", "ObsqError", "OutcomeHook", "PayloadError",
    "ProducerHook", "QueueNotFound", "RecoveryHook", "RecycleHook", "RedisErrorHook",
    "RefusalHook",
    "ResultTimeout", "Retry", "Route", "Schedule", "ScheduleInfo", "SkipRetry", "StartupError",
    "StepFailure", "StuckHook", "SyncClient", "Task", "TaskCancelled", "TaskExpired",
    "TaskFailed", "TaskInfo",
    "TaskMessage", "TaskNotFound", "TaskRunning", "TaskTimeout", "TaskTooLarge", "ThrottleHook",
    "UnknownTaskType", "Worker", "WorkerSettings", "__version__", "chain", "chord",
    "on_child_start", "sync_safe",
]
