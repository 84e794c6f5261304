"""obsq: a Redis task queue and worker for Python, built for Kubernetes and made to be
watched. The package is in layers, each importing only those below it (DESIGN.md section 2
draws them): cli, ops/, observability/, inspection/, engine/, producer/, app, broker/, task."""

from obsq._version import __version__
from obsq.app import App, Route
from obsq.engine.worker import Worker
from obsq.errors import (
    BrokerError,
    BrokerTimeout,
    ConfigurationError,
    DuplicateTask,
    FlowFailed,
    HandlerCrashed,
    ObsqError,
    PayloadError,
    QueueNotFound,
    ResultTimeout,
    Retry,
    SkipRetry,
    TaskCancelled,
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
from obsq.producer.sync_client import SyncClient
from obsq.task import Job, Task, TaskInfo, TaskMessage

__all__ = [
    "App", "BrokerError", "BrokerTimeout", "Client", "ConfigurationError", "DuplicateTask",
    "FlowFailed", "FlowInfo", "HandlerCrashed", "Inspector", "Job", "ObsqError", "PayloadError",
    "QueueNotFound", "ResultTimeout", "Retry", "Route", "SkipRetry", "StepFailure",
    "SyncClient", "Task", "TaskCancelled", "TaskFailed", "TaskInfo", "TaskMessage",
    "TaskNotFound", "TaskRunning", "TaskTimeout", "TaskTooLarge", "UnknownTaskType", "Worker",
    "__version__", "chain", "chord",
]
