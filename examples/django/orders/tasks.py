"""The shop's tasks: plain functions under Django's @task. `task.enqueue(...)` writes them to
Redis; `obsq worker obsq.django:app` runs them."""

from django.utils import timezone

from orders.models import Order

try:
    from django.tasks import task  # Django 6
except ImportError:
    from django_tasks import task  # Django 5.2 with the django-tasks package


class CardDeclined(Exception):
    pass


@task
def send_receipt(order_id: int) -> str:
    order = Order.objects.get(pk=order_id)  # committed before the enqueue: views.py
    order.receipt_sent_at = timezone.now()
    order.save(update_fields=["receipt_sent_at"])
    return f"receipt for order {order.pk} sent to {order.email}"


@task(queue_name="payments", priority=50)  # obsq priority 7 in the queue "payments"
def charge(order_id: int) -> int:
    order = Order.objects.get(pk=order_id)
    if order.total_cents > 100_000:
        raise CardDeclined(f"order {order.pk}: {order.total_cents} cents is over the limit")
    Order.objects.filter(pk=order_id).update(paid=True)
    return order.total_cents


@task(takes_context=True, backend="retried")
def sync_stock(context, sku: str) -> dict:
    """context.attempt counts the runs: 2 is the first retry (the backend's max_retry)."""
    if context.attempt == 1 and sku.startswith("slow-"):
        raise ConnectionError("the warehouse did not answer in time")
    return {"sku": sku, "attempt": context.attempt, "task": context.task_result.id}
