"""The example shop's settings: a plain Django project whose tasks obsq runs. What obsq needs
is TASKS; the worker (`obsq worker obsq.django:app`) reads this module too."""

import os
from pathlib import Path

import django

SECRET_KEY = "an example, not a secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "mysite.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["orders"]
if django.VERSION < (6,):
    INSTALLED_APPS.append("django_tasks")  # Django 5.2: the backport of django.tasks

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("SHOP_DATABASE", Path(__file__).parent / "shop.sqlite3"),
    }
}

# the worker reads the same variables: both sides meet in one Redis namespace
OBSQ = {
    "redis_url": os.environ.get("OBSQ_REDIS_URL", "redis://localhost:6379/0"),
    "namespace": os.environ.get("OBSQ_NAMESPACE", "shop"),
}
TASKS = {
    "default": {
        "BACKEND": "obsq.django.ObsqBackend",
        "QUEUES": ["default", "payments"],  # what `obsq worker obsq.django:app` serves
        "OPTIONS": OBSQ,
    },
    # for the tasks that may run again: up to 3 retries, after obsq's backoff (1-2 s, 2-4 s..)
    "retried": {
        "BACKEND": "obsq.django.ObsqBackend",
        "QUEUES": ["default"],
        "OPTIONS": {**OBSQ, "max_retry": 3},
    },
    # tasks written as rows of the outbox table in the enqueue's own transaction, moved to
    # Redis once committed by `obsq outbox --database-url sqlite:///shop.sqlite3`
    "outboxed": {
        "BACKEND": "obsq.django.ObsqBackend",
        "QUEUES": ["default"],
        "OPTIONS": {**OBSQ, "outbox": "default"},
    },
}
