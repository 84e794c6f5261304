from django.db import models


class Order(models.Model):
    email = models.EmailField()
    total_cents = models.PositiveIntegerField()
    paid = models.BooleanField(default=False)
    receipt_sent_at = models.DateTimeField(null=True)
