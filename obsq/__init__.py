"""obsq: a Redis task queue and worker for Python, built for Kubernetes and made to be
watched. The package is in layers, each importing only those below it (DESIGN.md section 2
draws them): cli, ops/, observability/, inspection/, engine/, producer/, app, broker/, task."""

import importlib
from typing import TYPE_CHECKING

from obsq._version import __version__
from obsq.app import (
    AggregationHook,
    App,
    CallNext,
    FlowHook,
    Middleware,
    OutcomeHook,
    ProducerHook,
    RecoveryHook,
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
    TaskFailed,
    TaskNotFound,
    TaskRunning,
    TaskTimeout,
    TaskTooLarge,
    UnknownTaskType,
)
from obsq.flow import FlowInfo, StepFailure, chain, chord
from obsq.producer.client import Client
from obsq.producer.enqueue import sync_safe
from obsq.producer.flow_client import ClientFlows
from obsq.schedule import Schedule, ScheduleInfo
from obsq.settings import WorkerSettings
from obsq.task import Job, Task, TaskInfo, TaskMessage

if TYPE_CHECKING:
    from obsq.inspection.inspector import Inspector
    from obsq.producer.sync_client import SyncClient

# What a worker process never uses is imported on first use: a worker's memory is smaller
# by their code (tests/bench/run.py's peak RSS).
_ON_FIRST_USE = {"Inspector": "obsq.inspection.inspector",
                 "SyncClient": "obsq.producer.sync_client"}


def __getattr__(name: str) -> object:
    if name in _ON_FIRST_USE:
        return getattr(importlib.import_module(_ON_FIRST_USE[name]), name)
    raise AttributeError(f"module 'obsq' has no attribute {name!r}")

__all__ = [
    "AggregationHook", "App", "BrokerError", "BrokerTimeout", "CallNext", "Client", "ClientFlows",
    "ConfigurationError", "DuplicateTask", "FlowCancelled", "FlowFailed", "FlowHook", "FlowInfo",
    "HandlerCrashed", "Inspector", "Job", "Middleware", "ObsqError", "OutcomeHook", "PayloadError",
    "ProducerHook", "QueueNotFound", "RecoveryHook", "RedisErrorHook", "RefusalHook",
    "ResultTimeout", "Retry", "Route", "Schedule", "ScheduleInfo", "SkipRetry", "StartupError",
    "StepFailure", "StuckHook", "SyncClient", "Task", "TaskCancelled", "TaskFailed", "TaskInfo",
    "TaskMessage", "TaskNotFound", "TaskRunning", "TaskTimeout", "TaskTooLarge", "ThrottleHook",
    "UnknownTaskType", "Worker", "WorkerSettings", "__version__", "chain", "chord",
    "on_child_start", "sync_safe",
]
