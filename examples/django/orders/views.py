from functools import partial

from django.db import transaction
from django.http import HttpRequest, JsonResponse

from orders.models import Order
from orders.tasks import charge, send_receipt


def place_order(request: HttpRequest) -> JsonResponse:
    with transaction.atomic():
        order = Order.objects.create(email=request.POST["email"],
                                     total_cents=int(request.POST["total_cents"]))
        # enqueued once the order is committed, never for an order rolled back: a worker
        # that starts at once finds it in the database
        transaction.on_commit(partial(charge.enqueue, order.pk))
        transaction.on_commit(partial(send_receipt.enqueue, order.pk))
    return JsonResponse({"order": order.pk}, status=201)
