"""The run directory (`--out DIR`): the one owner of its layout, its records and how they are written.

The processes of a run (launcher, servers, trainer ranks, actor) and the platform's worker
meet only through files in DIR. Their names, the typed records of the JSON files that are
rewritten in place (`status.json`, `trainer_progress.json`), the atomic write those need and
the line a server prints once it is ready all live here, so that a reader and its writer
cannot drift apart. docs/ARCHITECTURE.md has the table of every file.

Imports neither torch nor Django: the actor, `workers/` and the platform use it too.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from rl_core.config.files import load_config

if TYPE_CHECKING:
    from rl_core.config.run_config import RunConfig, StreamConfig

# --- layout (paths relative to DIR) -----------------------------------------------------

CONFIG_FILE = "config.yaml"  # the resolved config: every process of the run reads it (`load_run_config`)
SUBMITTED_CONFIG_FILE = "submitted_config.yaml"  # the platform worker's copy of what was submitted
STATUS_FILE = "status.json"  # launcher → worker: `RunStatusRecord`
STOP_FILE = "STOP"  # launcher → trainer: finish at the next step boundary (max_wall_time_s)
PROGRESS_FILE = "trainer_progress.json"  # trainer rank 0 → actor, launcher: `TrainerProgress`
SERVERS_FILE = "servers.json"  # launcher → trainer, actor: `ServerList`, once every server is ready
METRICS_FILE = "metrics.jsonl"
EVALS_FILE = "evals.jsonl"
EVAL_DIR = "eval"  # per-problem results: eval/step_XXXXXX_<bench>.jsonl
STREAM_DIR = "stream"
STREAM_FILE = "rollouts.jsonl"
ROLLOUTS_FILE = f"{STREAM_DIR}/{STREAM_FILE}"  # the actor's file stream (contracts.RolloutSample lines)
DISCARDED_FILE = "discarded.jsonl"
# The actor's samples that were not trained, each with its `discarded` reason (contracts.RolloutSample
# lines, of the steps the rollout viewer keeps only): always a file, whatever `stream.kind` is.
DISCARDED_ROLLOUTS_FILE = f"{STREAM_DIR}/{DISCARDED_FILE}"
CHECKPOINTS_DIR = "checkpoints"
LATEST_CHECKPOINT_LINK = "latest"
CHECKPOINT_STATE_FILE = "trainer_state.json"  # inside each checkpoint directory
SHARDS_FILE = "trainer_shards.jsonl"
RESUMES_FILE = "resumes.jsonl"
LOGS_DIR = "logs"
REDIS_DIR = "redis"  # the embedded Redis server's data, log and socket
REDIS_SOCKET_FILE = "redis.sock"  # inside REDIS_DIR
REDIS_LOG_FILE = "redis.log"  # inside REDIS_DIR
# Inside REDIS_DIR, mode 0600: a cluster run's Redis password (its server asks for it on the unix
# socket too), for the platform worker's rollout tail; the roles get it from their environment.
REDIS_PASSWORD_FILE = "password"
CLUSTER_FILE = "cluster.json"  # launcher of a cluster run → platform worker: `ClusterRecord` (which role runs where)
TRAIN_LOGPROBS_FILE = "train_logprobs.jsonl"  # trainer ranks → worker: per-token logprobs at training time
TENSORBOARD_DIR = "tensorboard"  # launcher's metric mirror (monitoring.mirror.sinks: tensorboard)
WANDB_DIR = "wandb"  # launcher's metric mirror (monitoring.mirror.sinks: wandb); W&B names it itself under DIR
WANDB_RUN_ID_FILE = "wandb_run_id"  # the W&B run id of the mirror, so a resumed run continues that W&B run
HEARTBEATS_DIR = "heartbeats"  # trainer ranks, actor → launcher's watchdog: heartbeats/<role>, rewritten every few seconds
PROVENANCE_FILE = "provenance.jsonl"  # launcher → worker: one `provenance.ProvenanceRecord` per launch (code, packages, host, command)
TIMELINE_DIR = "timeline"  # every role → run page's Timeline: timeline/<lane>.jsonl, spans (rundir/timeline.py)


def heartbeat_path(run_dir: str | Path, role: str) -> Path:
    """`heartbeats/<role>`: rewritten by the role's heartbeat thread (rl_core/launch/watchdog.py)."""
    return Path(run_dir) / HEARTBEATS_DIR / role


def timeline_path(run_dir: str | Path, lane: str) -> Path:
    """`timeline/<lane>.jsonl`: one process's spans (`rundir/timeline.py`), lane = its child name."""
    return Path(run_dir) / TIMELINE_DIR / f"{lane}.jsonl"


def log_path(run_dir: str | Path, process: str) -> Path:
    """`logs/<process>.log`: stdout and stderr of one child of the launcher."""
    return Path(run_dir) / LOGS_DIR / f"{process}.log"


# A checkpoint directory is `checkpoints/step_NNNNNN` (the trainer's version after that step,
# zero-padded so names sort by step); `checkpoints/latest` is a relative symlink to the newest.
_CHECKPOINT_PREFIX = "step_"
_CHECKPOINT_NAME_RE = re.compile(r"step_([0-9]{1,12})")


def checkpoint_dir_name(step: int) -> str:
    """The name of the checkpoint directory of `step` inside `checkpoints/`."""
    return f"{_CHECKPOINT_PREFIX}{step:06d}"


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint directory's name (`checkpoint_dir_name`'s inverse), None for any
    other name (`latest`, a staging `.step_...tmp`, a stray file)."""
    match = _CHECKPOINT_NAME_RE.fullmatch(name)
    return int(match.group(1)) if match else None


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR / checkpoint_dir_name(step)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    link = Path(run_dir) / CHECKPOINTS_DIR / LATEST_CHECKPOINT_LINK
    return link.resolve() if link.exists() else None


def redis_socket(run_dir: str | Path) -> Path:
    return (Path(run_dir) / REDIS_DIR / REDIS_SOCKET_FILE).resolve()


def stream_redis_url(stream: StreamConfig, run_dir: str | Path) -> str:
    """The Redis URL of the run's stream (`stream.kind: redis`): the private server's socket when
    embedded. The actor writes, the trainer and the platform's supervisor read there."""
    if stream.redis_embedded:
        return f"unix://{redis_socket(run_dir)}"
    return stream.redis_url


# --- the server's ready line ----------------------------------------------------------
# A server (reference or vLLM) prints it on stdout once it accepts connections; the launcher
# reads it from the server's log to learn the URL (the port may have been chosen by the OS).

READY_PREFIX = "INFLIGHT_SERVER_READY"


def ready_line(url: str) -> str:
    return f"{READY_PREFIX} {url}"


def parse_ready_line(line: str) -> str | None:
    """The URL of a ready line, None for any other line."""
    parts = line.split()
    if len(parts) >= 2 and parts[0] == READY_PREFIX:
        return parts[1]
    return None


# --- records rewritten in place -------------------------------------------------------

RunState = Literal["starting", "running", "succeeded", "failed", "cancelled"]
FINAL_STATES: tuple[RunState, ...] = ("succeeded", "failed", "cancelled")

# Why a run ended, beside its state: `succeeded` alone hid a run its wall-time budget stopped at
# step 16 of 1000. The launcher writes the first five; `lost` is the platform's (its worker died).
EndedReason = Literal["max_steps", "wall_time", "cancelled", "failed", "hung", "lost"]
ENDED_REASONS: dict[str, str] = {
    "max_steps": "finished its steps",
    "wall_time": "stopped by its wall-time budget",
    "cancelled": "cancelled",
    "failed": "failed",
    "hung": "failed: a role stopped answering",
    "lost": "lost with its worker",
}


def ended_sentence(reason: str | None, step: int | None = None, max_steps: int | None = None,
                   max_wall_time_s: float | None = None, cause: str | None = None) -> str:
    """Why a run ended, in words: the run page, the API's `ended`, both CLIs and status.json's
    `ended_detail` say the same sentence. `cause`: what failed, in a few words (the error's first
    clause, e.g. "server0 stopped answering"). "" for a run that has not ended."""
    if not reason:
        return ""
    sentence = ENDED_REASONS.get(reason, reason)
    if cause and reason in ("failed", "hung"):
        sentence = f"failed: {cause}"
    if reason == "wall_time" and max_wall_time_s is not None:
        sentence += f" (max_wall_time_s {max_wall_time_s:g} s)"
    if step is not None and reason in ("max_steps", "wall_time", "cancelled", "failed", "hung"):
        sentence += f" at step {step}" + (f" of {max_steps}" if max_steps else "")
    return sentence


class RunStatusRecord(BaseModel):
    """`status.json`, written by the launcher at each change of state."""

    state: RunState
    error: str | None = None
    pid: int | None = None
    updated: float | None = None
    # What a `starting` run waits for, in words (a cluster run's placement group): the platform
    # shows it beside the status, so a run that waits for machines says so.
    detail: str | None = None
    # Set with a final state: why the run ended (`EndedReason`) and that in words with its step
    # (`ended_sentence`), e.g. "stopped by its wall-time budget (max_wall_time_s 60 s) at step 16 of 1000".
    ended_reason: EndedReason | None = None
    ended_detail: str | None = None


class ClusterRole(BaseModel):
    """One process of a cluster run: where it runs."""

    role: str  # the launcher's child name: server<i>, trainer, trainer<r>, actor
    node: int  # its bundle (node index of cluster.nodes)
    address: str  # the node's address on the cluster network
    pid: int | None = None  # its pid on that node


class ClusterRecord(BaseModel):
    """`cluster.json`, written by the launcher of a cluster run once every role started."""

    placement_wait_s: float
    roles: list[ClusterRole]


class TrainerProgress(BaseModel):
    """`trainer_progress.json`, published by trainer rank 0 after each step: the actor keeps
    the lag bound on `version` and `consumed`, the launcher and the actor end on `done`."""

    version: int
    consumed: int
    done: bool = False
    max_steps: int | None = None
    t: float | None = None


class ServerList(BaseModel):
    """`servers.json`: the inference servers' base URLs, written once all are ready. The
    launcher starts the trainer and the actor while the servers load (their imports and model
    load overlap the servers'); they read the URLs here when they need them."""

    urls: list[str]


Record = TypeVar("Record", bound=BaseModel)


def write_json_atomic(path: str | Path, data: dict) -> None:
    """Write-then-rename: a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)


def _read_record(path: Path, model: type[Record]) -> Record | None:
    """The record, or None when the file is missing, half-written by a non-atomic writer, or
    not this record (then the reader asks again later, as for a file not written yet)."""
    try:
        return model.model_validate_json(path.read_bytes())
    except (FileNotFoundError, ValidationError, ValueError):
        return None


def write_status(run_dir: str | Path, state: RunState, error: str | None = None, detail: str | None = None,
                 ended_reason: EndedReason | None = None, ended_detail: str | None = None) -> None:
    record = RunStatusRecord(state=state, error=error, pid=os.getpid(), updated=time.time(), detail=detail,
                             ended_reason=ended_reason, ended_detail=ended_detail)
    write_json_atomic(Path(run_dir) / STATUS_FILE, record.model_dump(mode="json"))


def read_status(run_dir: str | Path) -> RunStatusRecord | None:
    return _read_record(Path(run_dir) / STATUS_FILE, RunStatusRecord)


def read_cluster(run_dir: str | Path) -> ClusterRecord | None:
    return _read_record(Path(run_dir) / CLUSTER_FILE, ClusterRecord)


def write_progress(run_dir: str | Path, progress: TrainerProgress) -> None:
    write_json_atomic(Path(run_dir) / PROGRESS_FILE, progress.model_dump(mode="json"))


def read_progress(run_dir: str | Path) -> TrainerProgress | None:
    """The trainer's published progress, or None before the trainer is ready."""
    return _read_record(Path(run_dir) / PROGRESS_FILE, TrainerProgress)


# --- the stop request -----------------------------------------------------------------


def request_stop(run_dir: str | Path, reason: str) -> None:
    (Path(run_dir) / STOP_FILE).write_text(f"{reason}\n")


# Longer than the launcher's wait for its servers (launcher.SERVER_START_TIMEOUT_S): the
# launcher gives up first and stops the waiting processes itself.
SERVERS_WAIT_S = 600.0


def write_servers(run_dir: str | Path, urls: list[str]) -> None:
    write_json_atomic(Path(run_dir) / SERVERS_FILE, ServerList(urls=urls).model_dump())


def wait_for_servers(run_dir: str | Path, timeout_s: float, poll_s: float = 0.05) -> list[str]:
    """The servers' URLs once the launcher wrote them; TimeoutError after `timeout_s` (the
    launcher gives up on servers earlier and stops this process, so that is a launcher bug)."""
    deadline = time.monotonic() + timeout_s
    while (record := _read_record(Path(run_dir) / SERVERS_FILE, ServerList)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {SERVERS_FILE} in {run_dir} after {timeout_s:.0f} s")
        time.sleep(poll_s)
    return record.urls


def stop_requested(run_dir: str | Path) -> bool:
    return (Path(run_dir) / STOP_FILE).exists()


def clear_previous_attempt(run_dir: str | Path) -> None:
    """Before the children start: a progress file or stop request left by an earlier attempt
    (a resume) must not be read as this one's (the actor would not wait for the new trainer),
    nor the old servers' addresses."""
    for name in (PROGRESS_FILE, STOP_FILE, SERVERS_FILE, CLUSTER_FILE):
        (Path(run_dir) / name).unlink(missing_ok=True)
    for beat in (Path(run_dir) / HEARTBEATS_DIR).glob("*"):  # an old attempt's beats are not this one's answers
        beat.unlink(missing_ok=True)


def load_run_config(run_dir: str | Path) -> RunConfig:
    """The resolved config of a run (`DIR/config.yaml`, written by the launcher): every process
    a run starts (servers, actor, trainer ranks) reads its settings from here."""
    return load_config(Path(run_dir) / CONFIG_FILE)


# The address of the node a role runs on, as the other nodes reach it (set by the launcher on a
# cluster run, rl_core/cluster/ray_placement.py); the weight group's TCPStore listens there.
ADVERTISED_ADDRESS_ENV = "INFLIGHT_ADVERTISED_ADDRESS"
