"""Typed tasks on a real Redis: a handler's `obsq.Task[P]` payload type and its result type
(obsq/payloads.py). Payloads of each kind make the round trip and reach the handler as P;
one that cannot become P is refused at enqueue with nothing written; a stored one that no
longer decodes into P (a deploy changed the type) ends dead, no retry spent."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Literal, TypedDict

import pydantic
import pytest

import obsq

from .helpers import namespace_keys


@dataclass
class Address:
    city: str
    zip: str | None = None


@dataclass
class Customer:
    name: str
    tags: list[str] = field(default_factory=list)
    address: Address | None = None


class Line(TypedDict):
    sku: str
    quantity: int


class Order(pydantic.BaseModel):
    id: int
    state: Literal["new", "paid"]
    lines: list[str]


@dataclass
class Receipt:
    total: float
    who: str


@dataclass
class Renamed:  # the type after a deploy renamed a field
    full_name: str


def _register(app: obsq.App, seen: list[object]) -> None:
    @app.task("customer:greet", max_retry=3, queue="people")
    async def greet(task: obsq.Task[Customer]) -> Receipt:
        seen.append(task.payload)
        return Receipt(total=1.5, who=task.payload.name)

    @app.task("line:add")
    def add_line(task: obsq.Task[Line]) -> int:  # a plain handler: in the thread pool
        seen.append(task.payload)
        return task.payload["quantity"] * 2

    @app.task("order:pay")
    async def pay(task: obsq.Task[Order]) -> Order:
        seen.append(task.payload)
        return task.payload.model_copy(update={"state": "paid"})

    @app.task("renamed", max_retry=5)
    async def renamed(task: obsq.Task[Renamed]) -> None:
        seen.append(task.payload)


async def test_payloads_of_each_kind_reach_the_handler_as_their_type(
        app, client, start_worker) -> None:
    seen: list[object] = []
    _register(app, seen)
    greet, add_line, pay = (app.route(t).handler for t in ("customer:greet", "line:add",
                                                           "order:pay"))
    await start_worker()
    customer = Customer("Ada", ["vip"], Address("Paris"))
    receipt = await client.result(await client.enqueue(greet, customer, retention=60),
                                  timeout=15)
    assert receipt == Receipt(total=1.5, who="Ada") and seen[-1] == customer
    assert isinstance(seen[-1], Customer) and isinstance(seen[-1].address, Address)
    # a dict given for a dataclass becomes it, checked the same way
    info = await client.enqueue(greet, {"name": "Bob"}, retention=60)
    assert (await client.result(info, timeout=15)).who == "Bob"
    assert seen[-1] == Customer("Bob")

    doubled = await client.result(await client.enqueue(
        add_line, Line(sku="a-1", quantity=3), retention=60), timeout=15)
    assert doubled == 6 and seen[-1] == {"sku": "a-1", "quantity": 3}

    order = Order(id=7, state="new", lines=["a-1"])
    paid = await client.result(await client.enqueue(pay, order, retention=60), timeout=15)
    assert isinstance(seen[-1], Order) and seen[-1] == order
    assert isinstance(paid, Order) and paid.state == "paid"
    # the string form, through a Client with the App: checked and decoded the same way
    info = await client.enqueue("order:pay", {"id": 8, "state": "new", "lines": []},
                                retention=60)
    assert (await client.result(info.id, timeout=15))["state"] == "paid"  # JSON: no type
    assert isinstance(seen[-1], Order) and seen[-1].id == 8


async def test_a_job_and_a_sync_client_take_the_handler_too(
        app, client, start_worker, redis_url, namespace) -> None:
    seen: list[object] = []
    _register(app, seen)
    greet = app.route("customer:greet").handler
    await start_worker()
    [info] = await client.enqueue_many([obsq.Job(greet, Customer("Cy"), retention=60)])
    assert await client.result(info, timeout=15) == Receipt(total=1.5, who="Cy")

    def send() -> tuple[str, Receipt]:
        with obsq.SyncClient(redis_url, namespace=namespace) as sync:  # no App: by handler
            info = sync.enqueue(greet, Customer("Di"), retention=60)
            return info.queue, sync.result(info, timeout=15)
    # the route's queue without the App, its payload checked and its result read back
    assert await asyncio.to_thread(send) == ("people", Receipt(total=1.5, who="Di"))


@pytest.mark.parametrize(("task_type", "payload", "problem"), [
    ("customer:greet", {"nom": "Ada"}, "Customer misses 'name'"),
    ("customer:greet", Address("Paris"), "expected an object for Customer"),
    ("customer:greet", {"name": "Ada", "tags": [1]}, "tags[0]: expected str, got int 1"),
    ("line:add", {"sku": "a", "quantity": "3"}, "quantity: expected int"),
    ("line:add", {"sku": "a", "quantity": 3, "price": 2}, "Line has no field 'price'"),
    ("order:pay", {"id": 1, "state": "lost", "lines": []}, "state"),
])
async def test_a_payload_that_cannot_become_the_type_is_refused_with_nothing_written(
        app, client, client_without_app, raw_redis, namespace, task_type, payload,
        problem) -> None:
    _register(app, [])
    refused: list[Exception] = []
    client.on_refusal(lambda job, error: refused.append(error))
    handler = app.route(task_type).handler
    with pytest.raises(obsq.PayloadError, match="cannot become") as by_handler:
        await client.enqueue(handler, payload)
    assert problem in str(by_handler.value)
    with pytest.raises(obsq.PayloadError, match="cannot become"):  # the handler knows its type
        await client_without_app.enqueue(handler, payload)
    with pytest.raises(obsq.PayloadError):  # by its type name, through the App
        await client.enqueue(task_type, payload)
    with pytest.raises(obsq.PayloadError):  # one refused job refuses the batch
        await client.enqueue_many([obsq.Job("line:add", {"sku": "a", "quantity": 1}),
                                   obsq.Job(task_type, payload)])
    assert len(refused) == 3 and all(isinstance(e, obsq.PayloadError) for e in refused)
    assert namespace_keys(raw_redis, namespace) == []


async def test_a_stored_payload_that_no_longer_decodes_ends_dead_without_retries(
        app, client_without_app, start_worker) -> None:
    seen: list[object] = []
    _register(app, seen)
    await start_worker()
    # written before the deploy that renamed `name` to `full_name` (a producer of the old
    # code: it has no App, so nothing checks the payload before the worker)
    info = await client_without_app.enqueue("renamed", {"name": "Ada"}, retention=60)
    with pytest.raises(obsq.TaskFailed):
        await client_without_app.result(info, timeout=15)
    state = await client_without_app.info(info.id)
    assert isinstance(state, obsq.TaskInfo)
    assert state.state == "dead" and state.retry_count == 0
    assert state.error is not None and state.error.startswith("PayloadError: ")
    assert "does not decode into Renamed" in state.error and "misses 'full_name'" in state.error
    assert seen == []  # the handler never ran


def test_a_handler_whose_payload_type_does_not_resolve_is_refused_at_registration() -> None:
    app = obsq.App("t")

    @dataclass
    class Local:  # not at the top level of the module: get_type_hints cannot see it
        x: int

    with pytest.raises(TypeError, match="do not resolve"):
        @app.task("local")
        def handler(task: obsq.Task[Local]) -> None: ...


def test_a_handler_for_a_prefix_is_enqueued_by_its_type_name() -> None:
    app = obsq.App("t")

    @app.task("report:")
    def report(task: obsq.Task) -> None: ...

    with pytest.raises(TypeError, match="enqueue it by the type name"):
        obsq.Job(report, None)
    with pytest.raises(TypeError, match="not a handler registered"):
        obsq.Job(print, None)
