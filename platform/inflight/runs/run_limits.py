"""Resource limits of a submitted run, so that one user cannot take every worker.

Bounds (settings, README's table), each refusal naming the field and the limit:
- active runs per user (queued, starting, running, cancelling): INFLIGHT_MAX_ACTIVE_RUNS_PER_USER;
- `trainer.max_steps` <= INFLIGHT_MAX_STEPS;
- `max_wall_time_s` <= INFLIGHT_MAX_WALL_TIME_S (a run without one gets that limit);
- processes (inference servers + trainer ranks) <= INFLIGHT_MAX_PROCESSES;
- CPU threads (servers x threads_per_server + ranks x trainer.threads) <= INFLIGHT_MAX_THREADS
  and <= the CPUs of the largest worker of the run's queue;
- GPUs: the run must fit on the largest GPU worker (`rl_core.cluster.placement.check_placement`);
- sequences held at once <= INFLIGHT_MAX_SAMPLES_PER_STEP: `trainer.samples_per_step` (one step's
  samples, all in the trainer's memory before it trains), `actor.groups_in_flight` x
  `actor.group_size` (requests queued at the servers), `inference.max_batch_size` (KV slots a
  server preallocates), `task.heldout_size` x `eval.heldout_k` (one held-out evaluation);
- problems a synthetic task generates at start (`task.train_size`, `task.heldout_size`)
  <= INFLIGHT_MAX_TASK_PROBLEMS, and no more than its operands allow;
- a cluster run (`cluster.enabled`, queue `cluster`) fits the Ray cluster its workers report:
  `cluster.nodes` <= alive nodes, and each node's bundle fits a node of its own;
- a step needs no more prompts than the task has: `trainer.samples_per_step` / `actor.group_size`
  <= the synthetic task's training prompts (a math_jsonl file is read on the worker only, where
  the engine says the same at start).
What workers have comes from their heartbeats: the ones alive now, else the last ones known.
With no worker known for the queue only the operator's limits apply.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from inflight.runs.models import ACTIVE_STATUSES, Run, RunQueue, RunStatus, Worker
from rl_core.config.run_config import RunConfig
from rl_core.cluster.placement import PlacementError, check_placement
from rl_core.envs.problems import synthetic_train_count


def queue_capacity(queue: str) -> dict[str, int] | None:
    """The largest CPU count and GPU count among the queue's workers (alive ones if any)."""
    workers = list(Worker.objects.filter(queues__contains=[queue]))
    if not workers:
        return None
    cutoff = timezone.now() - timedelta(seconds=settings.INFLIGHT_WORKER_LOST_AFTER_S)
    alive = [worker for worker in workers if worker.last_heartbeat >= cutoff]
    pool = alive or workers
    return {"cpus": max(worker.cpu_count for worker in pool), "gpus": max(len(worker.gpus or []) for worker in pool)}


def run_queue(config: RunConfig) -> str:
    """The Celery queue of a run: `cluster` for a run across machines, else `gpu` or `cpu`."""
    if config.cluster.enabled:
        return RunQueue.CLUSTER
    return RunQueue.GPU if config.needs_gpu else RunQueue.CPU


def cluster_inventory() -> list[dict[str, Any]] | None:
    """The alive Ray nodes that the `cluster` workers saw at their last heartbeat (alive workers
    first), or None when no `cluster` worker reported a cluster."""
    workers = [worker for worker in Worker.objects.filter(queues__contains=[RunQueue.CLUSTER]) if worker.cluster_nodes]
    if not workers:
        return None
    cutoff = timezone.now() - timedelta(seconds=settings.INFLIGHT_WORKER_LOST_AFTER_S)
    alive = [worker for worker in workers if worker.last_heartbeat >= cutoff]
    newest = max(alive or workers, key=lambda worker: worker.last_heartbeat)
    return [node for node in newest.cluster_nodes if isinstance(node, dict) and node.get("alive")]


def cluster_errors(config: RunConfig) -> list[tuple[str, str]]:
    """(field, message) for a cluster request the reporting cluster cannot hold: more nodes than
    are alive, or a node's bundle (its processes' CPUs and GPUs) larger than every free node."""
    from rl_core.cluster.layout import ClusterError, node_bundles, plan_cluster_run

    if config.cluster.ray_address != "auto":
        # The `cluster` workers join their own cluster (RAY_ADDRESS and its token are theirs): a run
        # naming another address would have a worker's token sent wherever its owner points it.
        return [("cluster.ray_address", "runs submitted to the platform use the cluster of its `cluster` workers: leave it 'auto'")]
    try:
        _placement, slots = plan_cluster_run(config)
    except ClusterError as exc:
        return [("cluster.nodes", str(exc))]
    nodes = cluster_inventory()
    if nodes is None:
        return []  # no cluster reported yet: the placement group's timeout will say what is missing
    if config.cluster.nodes > len(nodes):
        return [("cluster.nodes", f"{config.cluster.nodes} nodes asked; the Ray cluster has {len(nodes)} alive node(s) "
                 "(Workers page)")]
    # Largest bundles onto the largest nodes: each bundle needs a node of its own (STRICT_SPREAD).
    bundles = sorted(node_bundles(config, slots), key=lambda b: (b.get("GPU", 0.0), b["CPU"]), reverse=True)
    free = sorted(nodes, key=lambda n: (float(n.get("gpus", 0)), float(n.get("cpus", 0))), reverse=True)
    for index, (bundle, node) in enumerate(zip(bundles, free)):
        if bundle.get("GPU", 0.0) > float(node.get("gpus", 0)):
            return [("cluster.nodes", f"a node must hold {bundle.get('GPU', 0):g} GPU(s); the cluster's nodes have at most "
                     f"{float(free[0].get('gpus', 0)):g} each")]
        if bundle["CPU"] > float(node.get("cpus", 0)):
            return [("cluster.cpus_per_process", f"node {index} of the request needs {bundle['CPU']:g} CPUs "
                     f"(its processes x cluster.cpus_per_process); the cluster's node {index + 1} by size has {float(node.get('cpus', 0)):g}")]
    return []


def active_run_count(owner: AbstractBaseUser) -> int:
    return Run.objects.filter(owner=owner, status__in=[RunStatus.QUEUED, *ACTIVE_STATUSES]).count()


def limit_errors(owner: AbstractBaseUser, config: RunConfig) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """(errors keyed by field, values the platform fills in) for a run `owner` submits."""
    errors: dict[str, list[str]] = {}
    filled: dict[str, Any] = {}

    def refuse(field: str, message: str) -> None:
        errors.setdefault(field, []).append(message)

    if config.trainer.max_steps > settings.INFLIGHT_MAX_STEPS:
        refuse("trainer.max_steps", f"at most {settings.INFLIGHT_MAX_STEPS} steps on this platform (INFLIGHT_MAX_STEPS)")
    wall = settings.INFLIGHT_MAX_WALL_TIME_S
    if config.max_wall_time_s is None:
        filled["max_wall_time_s"] = wall
    elif config.max_wall_time_s > wall:
        refuse("max_wall_time_s", f"at most {wall:g} s on this platform (INFLIGHT_MAX_WALL_TIME_S)")

    inference, trainer = config.inference, config.trainer
    on_gpu = trainer.device.startswith("cuda")
    ranks = (trainer.gpus or 1) if on_gpu else trainer.cpu_ranks
    processes = inference.num_servers + ranks
    if processes > settings.INFLIGHT_MAX_PROCESSES:
        refuse("inference.num_servers", f"{inference.num_servers} servers + {ranks} trainer ranks = {processes} processes; "
               f"at most {settings.INFLIGHT_MAX_PROCESSES} (INFLIGHT_MAX_PROCESSES)")

    queue = run_queue(config)
    # A cluster run's processes spread over the Ray cluster's nodes: its own check, not one worker's size.
    capacity = None if queue == RunQueue.CLUSTER else queue_capacity(queue)
    threads = inference.num_servers * inference.threads_per_server + ranks * trainer.threads
    max_threads = settings.INFLIGHT_MAX_THREADS
    source = "INFLIGHT_MAX_THREADS"
    if capacity is not None and 0 < capacity["cpus"] < max_threads:
        max_threads, source = capacity["cpus"], f"the largest '{queue}' worker has {capacity['cpus']} CPUs"
    if threads > max_threads:
        refuse("trainer.threads", f"{threads} CPU threads (servers x threads_per_server + ranks x trainer.threads); "
               f"at most {max_threads} ({source})")

    if config.needs_gpu and capacity is not None:
        try:
            check_placement(config, capacity["gpus"])
        except PlacementError as exc:
            refuse("inference.num_servers", f"{exc} (the largest '{queue}' worker has {capacity['gpus']} GPUs)")
    for field, message in size_errors(config):
        refuse(field, message)
    if config.cluster.enabled:
        for field, message in cluster_errors(config):
            refuse(field, message)
    return errors, filled


def size_errors(config: RunConfig) -> list[tuple[str, str]]:
    """(field, message) for each size no worker can hold or the task cannot fill (module docstring)."""
    problems: list[tuple[str, str]] = []
    most = settings.INFLIGHT_MAX_SAMPLES_PER_STEP
    limit = f"at most {most} (INFLIGHT_MAX_SAMPLES_PER_STEP)"
    trainer, actor, task = config.trainer, config.actor, config.task
    if trainer.samples_per_step > most:
        problems.append(("trainer.samples_per_step", f"{trainer.samples_per_step} samples in one step; {limit}"))
    in_flight = actor.groups_in_flight * actor.group_size
    if in_flight > most:
        problems.append(("actor.groups_in_flight", f"{actor.groups_in_flight} groups x {actor.group_size} attempts = "
                         f"{in_flight} sequences in flight; {limit}"))
    if config.inference.max_batch_size > most:
        problems.append(("inference.max_batch_size", f"{config.inference.max_batch_size} sequences per server batch; {limit}"))
    heldout_samples = task.heldout_size * config.eval.heldout_k
    if heldout_samples > most:
        problems.append(("task.heldout_size", f"{task.heldout_size} held-out problems x {config.eval.heldout_k} samples "
                         f"(eval.heldout_k) = {heldout_samples} sequences per evaluation; {limit}"))
    if task.kind != "synthetic":
        return problems
    most_problems = settings.INFLIGHT_MAX_TASK_PROBLEMS
    for field, count in (("task.train_size", task.train_size), ("task.heldout_size", task.heldout_size)):
        if count > most_problems:
            problems.append((field, f"{count} synthetic problems; at most {most_problems} (INFLIGHT_MAX_TASK_PROBLEMS)"))
    train_prompts = synthetic_train_count(task)
    if train_prompts < 1:
        problems.append(("task.heldout_size", f"the operands {task.min_operand}..{task.max_operand} x {task.num_terms} terms "
                         f"leave no training problem beside {task.heldout_size} held-out ones (raise task.max_operand)"))
    else:
        prompts_per_step = -(-trainer.samples_per_step // actor.group_size)
        if prompts_per_step > train_prompts:
            problems.append(("trainer.samples_per_step", f"{trainer.samples_per_step} samples of {actor.group_size} attempts "
                             f"need {prompts_per_step} prompts per step; the task has {train_prompts} training prompts "
                             "(task.train_size, capped by its operands)"))
    return problems


def active_runs_error(owner: AbstractBaseUser) -> str | None:
    """Why `owner` may not submit another run now, or None. Call with the owner's row locked."""
    limit = settings.INFLIGHT_MAX_ACTIVE_RUNS_PER_USER
    count = active_run_count(owner)
    if limit > 0 and count >= limit:
        return (f"you have {count} runs queued or running; the limit is {limit} per user "
                "(INFLIGHT_MAX_ACTIVE_RUNS_PER_USER): wait for one to end or cancel one")
    return None
