"""Metrics sinks: one interface, real sinks behind it.

The run writes `DIR/metrics.jsonl`, one JSON object per line with `t` (unix
seconds), `step` (trainer step) and metric keys. The platform's worker tails
that same file, so the file is also the durable buffer: nothing logged is lost
if the platform is briefly away.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Mapping, Protocol

from rl_core.common.jsonl_tail import JsonlTail
from rl_core.common import metric_names as mn
from rl_core.rundir.layout import METRICS_FILE, TENSORBOARD_DIR, WANDB_RUN_ID_FILE

if TYPE_CHECKING:
    from rl_core.config.monitoring import MirrorConfig


class MetricsSink(Protocol):
    def log(self, step: int, metrics: Mapping[str, float], t: float | None = None) -> None: ...

    def close(self) -> None: ...


def _clean(metrics: Mapping[str, float]) -> dict[str, float]:
    # JSON has no NaN/inf; a non-finite value is dropped rather than poisoning the line.
    out: dict[str, float] = {}
    for key, value in metrics.items():
        value = float(value)
        if math.isfinite(value):
            out[key] = value
    return out


# `nonfinite/<metric>: 1.0` in a metrics.jsonl line: <metric> was NaN or infinite at that step.
NONFINITE_PREFIX = "nonfinite/"


def nonfinite_keys(metrics: Mapping[str, float]) -> list[str]:
    return sorted(key for key, value in metrics.items() if not math.isfinite(float(value)))


class JsonlSink:
    """Appends lines and flushes each one: a reader tailing the file sees whole lines."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = open(self.path, "a", encoding="utf-8")
        self._lock = threading.Lock()

    def log(self, step: int, metrics: Mapping[str, float], t: float | None = None) -> None:
        record = {"t": time.time() if t is None else t, "step": int(step), **_clean(metrics)}
        for key in nonfinite_keys(metrics):
            # JSON has no NaN, but a NaN loss is the first sign of a diverged run: it is kept
            # as a numeric flag `nonfinite/<name>: 1` (every reader of the file sees numbers only).
            record[NONFINITE_PREFIX + key] = 1.0
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


class ConsoleSink:
    """A one-line progress bar with the key figures (stderr, overwritten in place on a TTY)."""

    KEYS = (mn.ROLLOUT_SUCCESS_MEAN, mn.ROLLOUT_REWARD_MEAN, mn.POLICY_LAG_MAX, mn.WEIGHTS_VERSION, mn.ROLLOUT_TOKENS_PER_S, mn.TRAIN_LOSS)

    def __init__(self, total_steps: int, stream: IO[str] | None = None) -> None:
        self.total_steps = total_steps
        self.stream = stream or sys.stderr
        self.latest: dict[str, float] = {}
        self.started = time.time()

    def log(self, step: int, metrics: Mapping[str, float], t: float | None = None) -> None:
        self.latest.update(_clean(metrics))
        done = min(step, self.total_steps)
        width = 24
        filled = int(width * done / max(1, self.total_steps))
        figures = " ".join(f"{key.split('/')[0][:7]}={self.latest[key]:.3g}" for key in self.KEYS if key in self.latest)
        line = f"[{'#' * filled}{'.' * (width - filled)}] step {done}/{self.total_steps} {time.time() - self.started:5.0f}s {figures}"
        end = "\r" if self.stream.isatty() else "\n"
        self.stream.write(line + end)
        self.stream.flush()

    def close(self) -> None:
        if self.stream.isatty():
            self.stream.write("\n")


class MultiSink:
    def __init__(self, *sinks: MetricsSink) -> None:
        self.sinks = list(sinks)

    def log(self, step: int, metrics: Mapping[str, float], t: float | None = None) -> None:
        t = time.time() if t is None else t
        for sink in self.sinks:
            sink.log(step, metrics, t)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()


# --- mirrors: W&B and TensorBoard copies of metrics.jsonl ---------------------------------
#
# metrics.jsonl stays the source of truth. A mirror is fed by the launcher, which tails that
# file on a thread of its own (`MetricsMirror`), so every line any process of the run writes is
# mirrored once, in one W&B run / one TensorBoard log, and no process that trains or samples
# ever waits on W&B or TensorBoard. A mirror that fails is logged once and dropped.

MIRROR_FIELD = "monitoring.mirror.sinks"
# The module each mirror imports, and the pip name that provides it.
MIRROR_PACKAGES = {"wandb": ("wandb", "wandb"), "tensorboard": ("tensorboard", "tensorboard")}
# W&B's own x axis must only grow, but lines reach metrics.jsonl out of step order (an
# evaluation logs at the step it started): every W&B metric is charted against this one.
WANDB_STEP_KEY = "trainer_step"

logger = logging.getLogger(__name__)


class MirrorUnavailable(RuntimeError):
    """A configured mirror's package is not installed; the message names the field."""


def check_mirror_sinks(sinks: list[str]) -> None:
    """Raises MirrorUnavailable before anything starts if a named mirror cannot be imported."""
    for name in sinks:
        module, package = MIRROR_PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise MirrorUnavailable(
                f"{MIRROR_FIELD}: '{name}' but {package} is not installed "
                f"(pip install 'inflight[mirror]', or remove '{name}' from {MIRROR_FIELD})"
            )


def wandb_run_id(run_dir: str | Path) -> str:
    """The W&B run id of this Inflight run: made on the first start and kept in the run directory,
    so `--resume` (or the platform's resume) continues the same W&B run, as `wandb.init(id=...,
    resume="allow")` does for a training script that restarts, instead of starting a new one."""
    path = Path(run_dir) / WANDB_RUN_ID_FILE
    kept = path.read_text().strip() if path.is_file() else ""
    if kept:
        return kept
    run_id = uuid.uuid4().hex[:16]  # W&B ids: letters and digits, unique within the project
    path.write_text(run_id + "\n")
    return run_id


class WandbSink:
    """One W&B run; `mode="offline"` writes only under `directory/wandb/` (`wandb sync` it later).
    With `run_id`, a run of that id is continued where it exists (W&B's resume="allow")."""

    def __init__(self, directory: str | Path, project: str, mode: str = "offline", name: str | None = None,
                 config: Mapping[str, Any] | None = None, run_id: str | None = None) -> None:
        import wandb

        self._run = wandb.init(
            project=project, dir=str(directory), mode=mode, name=name, config=dict(config or {}),
            id=run_id, resume="allow" if run_id else None,
            # The run's own console and system sampling belong to the launcher, not to W&B.
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        self._run.define_metric(WANDB_STEP_KEY)
        self._run.define_metric("*", step_metric=WANDB_STEP_KEY)

    @property
    def run_dir(self) -> Path:
        """The offline run's directory (holds `run-<id>.wandb`)."""
        return Path(self._run.dir).parent

    def log(self, step: int, metrics: Mapping[str, float], t: float | None = None) -> None:
        self._run.log({WANDB_STEP_KEY: int(step), **_clean(metrics)})

    def close(self) -> None:
        import wandb

        self._run.finish()
        # finish() returns before W&B's service has written the run's file (the offline
        # `.wandb` stays at its header for ~1 s); teardown waits for the service to exit. The
        # launcher holds a single W&B run, so ending the process's W&B service is what it wants.
        wandb.teardown()


class TensorBoardSink:
    """Scalars as TensorBoard event files in `log_dir`, written with tensorboard's own writer
    (not torch's SummaryWriter: the launcher that feeds mirrors imports no torch)."""

    def __init__(self, log_dir: str | Path) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = Event, Summary
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(log_dir), flush_secs=5)

    def log(self, step: int, metrics: Mapping[str, float], t: float | None = None) -> None:
        values = [self._summary.Value(tag=key, simple_value=value) for key, value in _clean(metrics).items()]
        if values:
            self._writer.add_event(self._event(
                wall_time=time.time() if t is None else t, step=int(step), summary=self._summary(value=values)
            ))

    def close(self) -> None:
        self._writer.close()


class _Guarded:
    """A mirror that is logged once and dropped on its first failure (never raises)."""

    def __init__(self, name: str, sink: MetricsSink | None) -> None:
        self.name, self.sink = name, sink

    def fail(self, what: str, exc: BaseException) -> None:
        logger.warning("metrics mirror %s: %s failed (%r); mirroring to it stops, metrics.jsonl is unaffected",
                       self.name, what, exc)
        self.sink = None

    def log(self, step: int, metrics: Mapping[str, float], t: float | None = None) -> None:
        if self.sink is None:
            return
        try:
            self.sink.log(step, metrics, t)
        except Exception as exc:  # noqa: BLE001 - a mirror must never stop the run
            self.fail("log", exc)

    def close(self) -> None:
        if self.sink is not None:
            try:
                self.sink.close()
            except Exception as exc:  # noqa: BLE001
                self.fail("close", exc)


def open_mirror(name: str, run_dir: Path, mirror: MirrorConfig, run_name: str = "run",
                run_config: Mapping[str, Any] | None = None) -> MetricsSink:
    if name == "wandb":
        return WandbSink(run_dir, mirror.wandb_project, mirror.wandb_mode, run_name, run_config, wandb_run_id(run_dir))
    if name == "tensorboard":
        return TensorBoardSink(run_dir / TENSORBOARD_DIR)
    raise ValueError(f"{MIRROR_FIELD}: unknown mirror {name!r}")


class MetricsMirror:
    """Tails `DIR/metrics.jsonl` on a daemon thread and copies each complete line to the
    configured mirrors. `from_end` skips the lines already there (a resume: the earlier attempt
    mirrored them). `close()` copies what is left, then closes the mirrors (bounded wait)."""

    def __init__(self, run_dir: str | Path, mirror: MirrorConfig, run_name: str = "run",
                 run_config: Mapping[str, Any] | None = None, from_end: bool = False, poll_s: float = 1.0,
                 opener: Any = open_mirror) -> None:
        self.run_dir = Path(run_dir)
        self._tail = JsonlTail(self.run_dir / METRICS_FILE)
        while from_end:  # move past the lines already there (peek reads 16 MB at a time)
            before = self._tail.offset
            _records, offset, line_no = self._tail.peek(max_lines=10**9)
            self._tail.commit(offset, line_no)
            from_end = offset != before
        self._names = list(dict.fromkeys(mirror.sinks))
        self._open = lambda name: opener(name, self.run_dir, mirror, run_name, run_config)
        self.mirrors: list[_Guarded] = []
        self.lines = 0
        self._poll_s = poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics-mirror", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        # Opened here, not in the launcher's thread: wandb.init takes seconds.
        for name in self._names:
            guarded = _Guarded(name, None)
            try:
                guarded.sink = self._open(name)
            except Exception as exc:  # noqa: BLE001
                guarded.fail("start", exc)
            self.mirrors.append(guarded)
        while True:
            stopping = self._stop.wait(self._poll_s)
            self._copy()
            if stopping:
                break
        for guarded in self.mirrors:
            guarded.close()

    def _copy(self) -> None:
        while True:
            try:
                records, offset, line_no = self._tail.peek(max_lines=2000)
            except OSError as exc:
                logger.warning("metrics mirror: cannot read %s (%r)", self._tail.path, exc)
                return
            for _line_no, record in records:
                step = int(record.pop("step", 0))
                t = record.pop("t", None)
                numbers = {key: value for key, value in record.items() if isinstance(value, (int, float))}
                for guarded in self.mirrors:
                    guarded.log(step, numbers, t)
                self.lines += 1
            self._tail.commit(offset, line_no)
            if not records:
                return

    def close(self, timeout_s: float = 60.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            logger.warning("metrics mirror: still closing after %.0f s; left behind", timeout_s)
