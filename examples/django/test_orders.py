"""The shop's tasks through a real worker: obsq.testing runs `obsq.django:app` in the test on
a private Redis, the `tasks` fixture (conftest.py) points TASKS at it, and the test drives the
shop as a browser and the views would."""

from __future__ import annotations

from django.test import AsyncClient
from orders.models import Order
from orders.tasks import CardDeclined, charge, sync_stock

from obsq.testing import Environment


async def test_an_order_is_charged_and_receipted_once_committed(tasks: Environment) -> None:
    response = await AsyncClient().post("/orders/", {"email": "ada@example.com",
                                                     "total_cents": 4200})
    assert response.status_code == 201
    await tasks.drain()  # the worker ran what the commit enqueued
    order = await Order.objects.aget(pk=response.json()["order"])
    assert order.paid
    assert order.receipt_sent_at is not None


async def test_a_declined_card_fails_the_task_with_its_error(tasks: Environment) -> None:
    order = await Order.objects.acreate(email="bob@example.com", total_cents=500_000)
    result = await charge.aenqueue(order.pk)
    await tasks.drain()
    await result.arefresh()
    assert result.status == "FAILED"
    assert result.errors[0].exception_class is CardDeclined
    assert "over the limit" in result.errors[0].traceback
    assert not (await Order.objects.aget(pk=order.pk)).paid


async def test_a_retried_task_knows_its_attempt(tasks: Environment) -> None:
    result = await sync_stock.aenqueue("slow-42")
    await tasks.advance(60)  # the first attempt fails; its retry runs after its backoff
    await result.arefresh()
    assert result.status == "SUCCESSFUL"
    assert result.return_value == {"sku": "slow-42", "attempt": 2, "task": result.id}
