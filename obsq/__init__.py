"""obsq: a Redis task queue and worker for Python, built for Kubernetes and made to be
watched. Read the package top-down: task, app, client, broker, worker, maintenance,
scheduler, observability, cli."""

from obsq._version import __version__
from obsq.app import App, Route
from obsq.client import Client
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
from obsq.inspector import Inspector
from obsq.sync_client import SyncClient
from obsq.task import Job, Task, TaskInfo, TaskMessage
from obsq.worker import Worker

__all__ = [
    "App", "BrokerError", "BrokerTimeout", "Client", "ConfigurationError", "DuplicateTask",
    "FlowFailed", "FlowInfo", "HandlerCrashed", "Inspector", "Job", "ObsqError", "PayloadError",
    "QueueNotFound", "ResultTimeout", "Retry", "Route", "SkipRetry", "StepFailure",
    "SyncClient", "Task", "TaskCancelled", "TaskFailed", "TaskInfo", "TaskMessage",
    "TaskNotFound", "TaskRunning", "TaskTimeout", "TaskTooLarge", "UnknownTaskType", "Worker",
    "__version__", "chain", "chord",
]
