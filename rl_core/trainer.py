"""The trainer: stream → optimizer batches → loss → step → in-flight weight broadcast.

`python -m rl_core trainer --run-dir DIR --servers URL[,URL] [--resume]` (started by
`run`). Every optimizer step:

1. read `trainer.samples_per_step` samples from the durable stream (in stream order);
2. pack them into micro-batches of at most `trainer.micro_batch_tokens` tokens, run
   the loss on each and accumulate gradients (the loss is divided by the number of
   sequences of the whole batch, so the split does not change the gradient);
3. take the optimizer step (version v → v + 1) and broadcast the new weights to every
   server *without stopping generation*: servers swap weights between decode steps and
   tag later tokens with the new version (PipelineRL's in-flight update);
4. publish `DIR/trainer_progress.json` = {version, consumed}: the actor throttles on it
   so that no token is trained more than `actor.max_lag` versions after it was sampled.

Checkpoints (`checkpoints/step_NNNNNN`, `checkpoints/latest`) hold the weights, the
optimizer and the stream position, so `--resume` neither loses nor repeats a sample.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from rl_core.config import RunConfig, load_config
from rl_core.contracts import RolloutSample, TrainerBackend
from rl_core.loss import effective_sample_size, pack_micro_batches, policy_loss
from rl_core.metrics import METRICS_FILE, JsonlSink, MetricsSink
from rl_core.stream import StreamReader, open_reader

PROGRESS_FILE = "trainer_progress.json"
STOP_FILE = "STOP"  # written by the launcher (max_wall_time_s): finish at the next step boundary
CHECKPOINTS_DIR = "checkpoints"
CHECKPOINT_STATE_FILE = "trainer_state.json"


# --- small shared helpers (the actor and the launcher use them too) ----------------


def write_json_atomic(path: str | Path, data: dict[str, Any]) -> None:
    """Write-then-rename: a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)


def read_progress(run_dir: str | Path) -> dict[str, Any] | None:
    """The trainer's published progress, or None before the trainer is ready."""
    try:
        return json.loads((Path(run_dir) / PROGRESS_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    link = Path(run_dir) / CHECKPOINTS_DIR / "latest"
    return link.resolve() if link.exists() else None


def stream_redis_url(config: RunConfig, run_dir: str | Path) -> str:
    """The Redis URL of the run's stream: the private server's socket when embedded."""
    if config.stream.redis_embedded:
        return f"unix://{(Path(run_dir) / 'redis' / 'redis.sock').resolve()}"
    return config.stream.redis_url


# --- backend choice ----------------------------------------------------------------


def make_backend(config: RunConfig, model_path: str | Path) -> TrainerBackend:
    t = config.trainer
    if t.backend == "deepspeed":
        # Imported lazily: DeepSpeed is a GPU extra, absent from CPU installs.
        from rl_core.deepspeed_backend import DeepSpeedBackend

        return DeepSpeedBackend(config=config, model_path=str(model_path))
    from rl_core.torch_backend import TorchBackend

    return TorchBackend(
        model_path,
        device=t.device,
        dtype=config.model.dtype,
        lr=t.lr,
        weight_decay=t.weight_decay,
        warmup_steps=t.warmup_steps,
        schedule=t.schedule,
        total_steps=t.max_steps,
        grad_clip=t.grad_clip,
        reference_model=t.kl_coef > 0,
    )


# --- one optimizer step ------------------------------------------------------------


@dataclass
class StepStats:
    loss: float
    entropy: float
    ess: float
    kl: float
    clip_fraction: float
    lag_mean: float
    lag_max: int
    num_tokens: int
    num_samples: int


def train_step(backend: TrainerBackend, samples: list[RolloutSample], config: RunConfig) -> tuple[StepStats, dict[str, float]]:
    """Gradient accumulation over packed micro-batches, then one optimizer step."""
    t = config.trainer
    version = backend.version
    total_loss = total_entropy = total_w = total_w2 = total_kl = 0.0
    total_tokens = clipped = 0
    lag_sum = 0
    lag_max = 0
    for batch in pack_micro_batches(samples, t.micro_batch_tokens):
        logprobs, entropy = backend.token_logprobs(batch.input_ids, None, batch.position_ids)
        reference = None
        if t.kl_coef > 0:
            reference = backend.reference_logprobs(batch.input_ids, batch.position_ids)  # type: ignore[attr-defined]
        out = policy_loss(
            logprobs, batch, num_sequences_in_step=len(samples), kind=t.loss, is_truncation=t.is_truncation,
            clip_eps=t.clip_eps, entropy=entropy, reference_logprobs=reference, kl_coef=t.kl_coef,
        )
        backend.backward(out.loss)
        lags = (version - batch.token_versions)[batch.loss_mask]
        lag_sum += int(lags.sum())
        lag_max = max(lag_max, int(lags.max()))
        total_loss += float(out.loss.detach())
        total_entropy += out.sum_entropy
        total_w += out.sum_weights
        total_w2 += out.sum_weights_sq
        total_kl += out.sum_kl
        total_tokens += out.num_tokens
        clipped += out.num_clipped
    step_info = backend.optimizer_step()
    tokens = max(1, total_tokens)
    stats = StepStats(
        loss=total_loss, entropy=total_entropy / tokens, ess=effective_sample_size(total_w, total_w2, total_tokens),
        kl=total_kl / tokens, clip_fraction=clipped / tokens, lag_mean=lag_sum / tokens, lag_max=lag_max,
        num_tokens=total_tokens, num_samples=len(samples),
    )
    return stats, step_info


# --- the loop ----------------------------------------------------------------------


class Trainer:
    def __init__(
        self,
        config: RunConfig,
        run_dir: str | Path,
        backend: TrainerBackend,
        reader: StreamReader,
        sink: MetricsSink,
        broadcaster: Any = None,
    ) -> None:
        self.config = config
        self.run_dir = Path(run_dir)
        self.backend = backend
        self.reader = reader
        self.sink = sink
        self.broadcaster = broadcaster
        self.consumed = 0  # samples taken from the stream (trained or dropped)
        self.dropped_stale = 0

    def resume(self, checkpoint: Path) -> None:
        state = json.loads((checkpoint / CHECKPOINT_STATE_FILE).read_text())
        self.backend.load_checkpoint(str(checkpoint))
        self.reader.seek(state["stream_position"])
        self.consumed = int(state["consumed"])
        self.dropped_stale = int(state.get("dropped_stale", 0))

    def publish(self, done: bool = False) -> None:
        write_json_atomic(self.run_dir / PROGRESS_FILE, {
            "version": self.backend.version, "consumed": self.consumed, "done": done,
            "max_steps": self.config.trainer.max_steps, "t": time.time(),
        })

    def broadcast(self) -> dict[str, float]:
        if self.broadcaster is None:
            return {}
        return dict(self.broadcaster.broadcast(self.backend.parameters_for_broadcast(), self.backend.version) or {})

    def stop_requested(self) -> bool:
        return (self.run_dir / STOP_FILE).exists()

    def next_batch(self) -> list[RolloutSample] | None:
        """`samples_per_step` samples in stream order, or None if a stop was requested
        while waiting. A sample whose tokens would be trained more than `max_lag`
        versions late is dropped (only a resumed run can see one: samples written
        before the crash by weights the checkpoint lacks)."""
        wanted = self.config.trainer.samples_per_step
        batch: list[RolloutSample] = []
        start = (self.reader.position(), self.consumed, self.dropped_stale)
        while len(batch) < wanted:
            if self.stop_requested():
                # A partial batch is not trained: rewind, so the checkpoint's position is
                # before these samples and a resumed run trains them.
                self.reader.seek(start[0])
                self.consumed, self.dropped_stale = start[1], start[2]
                return None
            for sample in self.reader.read(wanted - len(batch), timeout_s=1.0):
                self.consumed += 1
                if self.backend.version - min(sample.token_versions, default=self.backend.version) > self.config.actor.max_lag:
                    self.dropped_stale += 1
                    continue
                batch.append(sample)
        return batch

    def save_checkpoint(self) -> Path:
        root = self.run_dir / CHECKPOINTS_DIR
        root.mkdir(parents=True, exist_ok=True)
        name = f"step_{self.backend.version:06d}"
        staging = root / f".{name}.tmp"
        if staging.exists():
            import shutil

            shutil.rmtree(staging)
        self.backend.save_checkpoint(str(staging))
        (staging / CHECKPOINT_STATE_FILE).write_text(json.dumps({
            "version": self.backend.version,
            "stream_position": self.reader.position(),
            "consumed": self.consumed,
            "dropped_stale": self.dropped_stale,
            "t": time.time(),
        }, indent=2) + "\n")
        final = root / name
        if final.exists():
            import shutil

            shutil.rmtree(final)
        os.replace(staging, final)
        # `latest` is a relative symlink swapped atomically: usable as a model path.
        tmp_link = root / ".latest.tmp"
        if tmp_link.is_symlink() or tmp_link.exists():
            tmp_link.unlink()
        os.symlink(name, tmp_link)
        os.replace(tmp_link, root / "latest")
        return final

    def run(self) -> None:
        t = self.config.trainer
        if self.backend.version > 0:
            # Resumed: the servers started from the checkpoint's weights but not its version.
            self.broadcast()
        self.publish()
        last_end = time.monotonic()
        while self.backend.version < t.max_steps and not self.stop_requested():
            samples = self.next_batch()
            if samples is None:
                break
            started = time.monotonic()
            stats, step_info = train_step(self.backend, samples, self.config)
            train_s = time.monotonic() - started
            sync = self.broadcast()
            self.publish()
            now = time.monotonic()
            elapsed = max(1e-9, now - last_end)
            last_end = now
            version = self.backend.version
            metrics = {
                "train/loss": stats.loss,
                "train/grad_norm": step_info.get("grad_norm", float("nan")),
                "train/lr": step_info.get("lr", float("nan")),
                "train/entropy": stats.entropy,
                "train/ess": stats.ess,
                "train/clip_fraction": stats.clip_fraction,
                "train/samples_per_s": stats.num_samples / elapsed,
                "train/tokens_per_s": stats.num_tokens / elapsed,
                "train/step_s": train_s,
                "train/reward_mean": sum(sample.reward for sample in samples) / len(samples),
                "train/samples_consumed": float(self.consumed),
                "train/dropped_stale": float(self.dropped_stale),
                "policy_lag/mean": stats.lag_mean,
                "policy_lag/max": float(stats.lag_max),
                "weights/version": float(version),
                "weights/update_pause_s": float(sync.get("weights/update_pause_s", 0.0)),
            }
            if t.kl_coef > 0:
                metrics["train/kl"] = stats.kl
            for key, value in sync.items():
                metrics.setdefault(key, float(value))
            self.sink.log(version, metrics)
            if t.checkpoint_every and version % t.checkpoint_every == 0 and version < t.max_steps:
                self.save_checkpoint()
        self.save_checkpoint()
        self.publish(done=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_core trainer", description="Trainer of a run (started by `run`).")
    parser.add_argument("--run-dir", required=True, help="Run directory with config.yaml.")
    parser.add_argument("--servers", default="", help="Comma-separated server base URLs to broadcast weights to.")
    parser.add_argument("--model", default=None, help="Initial weights (default: config model.path).")
    parser.add_argument("--resume", action="store_true", help="Continue from checkpoints/latest.")
    args = parser.parse_args(argv)

    run_dir = Path(args.run_dir)
    config = load_config(run_dir / "config.yaml")
    torch.set_num_threads(config.trainer.threads)
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    checkpoint = latest_checkpoint(run_dir) if args.resume else None
    if args.resume and checkpoint is None:
        print(f"trainer: --resume but {run_dir / CHECKPOINTS_DIR / 'latest'} does not exist", file=sys.stderr)
        return 2
    backend = make_backend(config, args.model or config.model.path)
    reader = open_reader(config.stream.kind, run_dir, stream_redis_url(config, run_dir))
    sink = JsonlSink(run_dir / METRICS_FILE)
    broadcaster = None
    servers = [url for url in args.servers.split(",") if url]
    if servers:
        from rl_core.weight_sync import WeightBroadcaster

        broadcaster = WeightBroadcaster(servers, backend="gloo")
        broadcaster.connect()
    trainer = Trainer(config, run_dir, backend, reader, sink, broadcaster)
    if checkpoint is not None:
        trainer.resume(checkpoint)
        print(f"trainer: resumed from {checkpoint} at version {backend.version}", flush=True)
    try:
        trainer.run()
    finally:
        if broadcaster is not None:
            broadcaster.close()
        reader.close()
        sink.close()
    print(f"trainer: finished at version {backend.version}", flush=True)
    return 0
