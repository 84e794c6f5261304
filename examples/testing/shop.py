"""A small shop's tasks, the App that test_tasks.py tests: a welcome email through a mail
server that is sometimes down, a reminder sent a day after a cart is left, payments that
wait for the bank, a nightly report, and page views counted in batches."""

from __future__ import annotations

from typing import Any

import obsq

app = obsq.App(namespace="shop")

# What the handlers did, for the tests to read (a real app would send mail, charge cards...).
sent: list[dict[str, Any]] = []
mail_server = {"down_for": 0}  # the next this many sends fail
cleared: set[str] = set()  # orders the bank has cleared


@app.task("email:welcome", max_retry=5)  # default backoff: 2 s, 4 s, 8 s... with jitter
async def send_welcome(task: obsq.Task) -> None:
    if mail_server["down_for"] > 0:
        mail_server["down_for"] -= 1
        raise ConnectionError("mail server unreachable")
    sent.append({"kind": "welcome", "to": task.payload["to"], "attempt": task.retry_count})


@app.task("email:cart-reminder")
async def remind(task: obsq.Task) -> None:
    sent.append({"kind": "reminder", "to": task.payload["to"]})


@app.task("payment:capture", max_retry=50)
async def capture(task: obsq.Task) -> str:
    if task.payload["order"] not in cleared:  # not yet: look again in 10 minutes
        task.retry_in(600)
    sent.append({"kind": "receipt", "order": task.payload["order"]})
    return "captured"


@app.task("report:nightly")
async def nightly_report(task: obsq.Task) -> None:
    sent.append({"kind": "report", "fire": task.id})


@app.task("stats:views")
async def store_views(task: obsq.Task) -> None:
    sent.append({"kind": "views", "page": task.payload["page"], "count": task.payload["count"]})


async def count_views(group: str, tasks: list[obsq.Task]) -> tuple[str, dict[str, Any]]:
    return "stats:views", {"page": group, "count": len(tasks)}


app.periodic("0 3 * * *", "report:nightly", timezone="Europe/Paris")
app.aggregate("view:", count_views, max_delay=60, grace_period=10)


async def tag(task: obsq.Task, call_next: Any) -> Any:  # middleware runs in tests too
    task.context["tagged"] = True
    return await call_next(task)

app.use(tag)
