"""The Celery app of the run workers: queues `cpu`, `gpu` and `cluster`, Django settings, heartbeats.

Start a worker (see the Makefile and docker-compose.yml):

    celery -A workers.celery_app worker -Q cpu -P threads -c 2
    celery -A workers.celery_app worker -Q gpu -P threads -c 1
    RAY_ADDRESS=HEAD:6379 RAY_AUTH_MODE=token RAY_AUTH_TOKEN=... celery -A workers.celery_app worker -Q cluster -P threads -c 4
    (on the Ray head node: its runs' launchers and its node inventory, `rl_core cluster-nodes`, join the cluster from there)

Why `-P threads`: a task only supervises its run's subprocess group (`workers/supervisor.py`)
and waits on I/O, so threads are enough; the child gets SIGTERM through PR_SET_PDEATHSIG
when the worker process dies, which is tied to the process that started it (with prefork
that would be a pool child Celery may recycle); and the heartbeat thread below lives in
the same process as the runs it vouches for, so a killed worker stops both at once.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

import django
from celery.signals import worker_ready, worker_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inflight.settings")
django.setup()

from django.conf import settings  # noqa: E402

# The platform's own app (queues, broker settings); this module adds what a worker needs.
from inflight.task_queue import app  # noqa: E402

logger = logging.getLogger(__name__)

# This process's identity for liveness: recorded in every heartbeat and on every run it claims.
# A worker restarted under the same node name (`-n demo@%h`) is a new incarnation, so it never
# vouches for the runs of the process that died.
INCARNATION = uuid.uuid4().hex

app.conf.worker_hijack_root_logger = False
app.autodiscover_tasks(["workers"], related_name="tasks", force=True)


def gpu_inventory() -> list[dict[str, object]]:
    """GPUs of this node through NVML; [] where there is no NVIDIA driver."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return []
    gpus = []
    try:
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            gpus.append(
                {
                    "index": index,
                    "name": name.decode() if isinstance(name, bytes) else str(name),
                    "memory_total_mb": int(memory.total // 2**20),
                    "memory_used_mb": int(memory.used // 2**20),
                    "utilization": int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu),
                }
            )
    finally:
        pynvml.nvmlShutdown()
    return gpus


class Heartbeat:
    """Records this worker process every `interval_s`, marks runs of silent worker processes
    `lost` (only once this process's own database access has held for the lost threshold, see
    `inflight.runs.liveness`), and once at start settles the runs a dead earlier process of this
    worker name left behind (`workers.reconcile`)."""

    def __init__(self, worker_name: str, queues: list[str], interval_s: float) -> None:
        from inflight.runs.liveness import LostRunSweeper

        self.worker_name = worker_name
        self.queues = queues
        self.interval_s = interval_s
        self.stopped = threading.Event()
        self.reconciled = False
        self.sweeper = LostRunSweeper(f"worker {worker_name}", before_sweep=self.record)
        # A worker of the `cluster` queue drives runs on a Ray cluster and reports its nodes.
        self.cluster = None
        if "cluster" in queues:
            from workers.cluster_inventory import ClusterInventory
            from workers.tasks import rl_command_prefix

            self.cluster = ClusterInventory(rl_command_prefix).start()
        self.thread = threading.Thread(target=self.loop, name="inflight-heartbeat", daemon=True)

    def record(self) -> None:
        from inflight.runs import services

        nodes, cluster_error = self.cluster.read() if self.cluster is not None else ([], "")
        services.record_heartbeat(
            self.worker_name,
            hostname=socket.gethostname(),
            queues=self.queues,
            gpus=gpu_inventory(),
            cpu_count=os.cpu_count() or 0,
            pid=os.getpid(),
            incarnation=INCARNATION,
            cluster_nodes=nodes,
            cluster_error=cluster_error,
        )

    def beat(self) -> None:
        self.sweeper.tick()
        if not self.reconciled and self.sweeper.reachable_since is not None:
            from workers.reconcile import reconcile_previous_incarnations

            try:
                reconcile_previous_incarnations(self.worker_name, INCARNATION)
                self.reconciled = True
            except Exception as exc:  # noqa: BLE001 - tried again on the next beat
                logger.warning("could not reconcile earlier runs yet: %s: %s", type(exc).__name__, exc)

    def loop(self) -> None:
        while not self.stopped.is_set():
            try:
                self.beat()
            except Exception:  # noqa: BLE001 - never let the heartbeat thread die
                logger.warning("heartbeat failed", exc_info=True)
            self.stopped.wait(self.interval_s)


_heartbeat: Heartbeat | None = None


@worker_ready.connect
def start_heartbeat(sender, **_: object) -> None:
    global _heartbeat
    queues = sorted(queue.name for queue in sender.app.amqp.queues.consume_from.values())
    _heartbeat = Heartbeat(sender.hostname, queues, settings.INFLIGHT_HEARTBEAT_INTERVAL_S)
    _heartbeat.thread.start()


@worker_shutdown.connect
def stop_heartbeat(**_: object) -> None:
    if _heartbeat is not None:
        _heartbeat.stopped.set()
