"""The Celery app through which the platform queues runs (queues `cpu` and `gpu`).

It lives here, not in `workers/`, so that dependencies point one way: `workers/` imports the
platform (`inflight.runs.services`), the platform never imports `workers/`. A web process
uses this app only to send `EXECUTE_RUN_TASK` by name; `workers/celery_app.py` is the same
app plus what only a worker process needs (task discovery, heartbeats).

Configured from Django settings (`CELERY_*`), never Celery's default app, which a web process
would otherwise use (and which would try amqp://localhost). The settings are read lazily, on
first use, so importing this module does not require Django to be set up yet.
"""

from __future__ import annotations

from celery import Celery
from kombu import Queue

EXECUTE_RUN_TASK = "inflight.execute_run"

app = Celery("inflight")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_queues = (Queue("cpu"), Queue("gpu"))
app.conf.task_default_queue = "cpu"
app.conf.broker_connection_retry_on_startup = True
# acks_late: a message is acknowledged when its run ends, so a run that a dead worker had
# taken but not started is handed to another worker once the visibility timeout passes. A
# run lasting longer than that may be redelivered while it runs: `services.claim_run` then
# finds it no longer queued and the second delivery does nothing.
app.conf.broker_transport_options = {"visibility_timeout": 600}
