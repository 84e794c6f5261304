"""Typed tasks: a handler declares its payload type in `obsq.Task[...]` and its result type
in its return annotation, and producers enqueue it by the handler itself, so a type
checker (mypy, pyright) checks the payload, the options and the use of the result.

Run a worker for it from the repository root:

    obsq worker examples.typed_tasks:app
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TypedDict

import obsq

app = obsq.App(namespace=os.environ.get("OBSQ_NAMESPACE", "obsq"))


@dataclass
class Email:  # a dataclass payload: stored as JSON, read back as an Email
    to: str
    subject: str
    body: str = ""


class Sent(TypedDict):  # a TypedDict result (a dataclass or a pydantic model work too)
    to: str
    message_id: str


@app.task("email:send", max_retry=5, timeout=30)
async def send_email(task: obsq.Task[Email]) -> Sent:
    email = task.payload  # an Email
    return {"to": email.to, "message_id": f"<{task.id}@mail.example.com>"}


@app.task("invoice:total")
def invoice_total(task: obsq.Task[list[float]]) -> float:  # a plain handler, typed the same
    return sum(task.payload)


async def send_welcome(client: obsq.Client, to: str) -> str:
    info = await client.enqueue(send_email, Email(to=to, subject="Welcome"),
                                retention=3600)  # info: obsq.TaskInfo[Sent]
    sent = await client.result(info, timeout=30)  # sent: Sent
    return sent["message_id"]


def total(client: obsq.SyncClient, amounts: list[float]) -> float:
    info = client.enqueue(invoice_total, amounts, retention=60, priority=5)
    return client.result(info, timeout=30)  # a float
