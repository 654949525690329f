"""Metrics sinks: one interface, real sinks behind it.

The run writes `DIR/metrics.jsonl`, one JSON object per line with `t` (unix
seconds), `step` (trainer step) and metric keys. The platform's worker tails
that same file, so the file is also the durable buffer: nothing logged is lost
if the platform is briefly away.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from pathlib import Path
from typing import IO, Mapping, Protocol


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

    KEYS = ("success/mean", "reward/mean", "policy_lag/max", "weights/version", "rollout/tokens_per_s", "train/loss")

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


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    """All complete records of a metrics file (a torn last line is skipped)."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.endswith("\n"):
                break
            records.append(json.loads(line))
    return records
