"""The trainer: stream → optimizer batches → loss → step → in-flight weight broadcast.

`python -m rl_core trainer --run-dir DIR --servers URL[,URL] [--resume]` (started by
`run`). Every optimizer step:

1. read `trainer.samples_per_step` samples from the durable stream (in stream order);
2. pack them into micro-batches of at most `trainer.micro_batch_tokens` tokens, run
   the loss on each and accumulate gradients (the loss is divided by the number of
   sequences of the whole batch, so the split does not change the gradient; samples
   whose gradient is exactly zero, advantage 0 without a KL penalty, count in that
   number but are not computed, and the step's statistics cover the computed tokens);
3. take the optimizer step (version v → v + 1) and broadcast the new weights to every
   server *without stopping generation*: servers swap weights between decode steps and
   tag later tokens with the new version (PipelineRL's in-flight update);
4. publish `DIR/trainer_progress.json` = {version, consumed}: the actor throttles on it
   so that no token is trained more than `actor.max_lag` versions after it was sampled.

Checkpoints (`checkpoints/step_NNNNNN`, `checkpoints/latest`) hold the weights, the
optimizer and the stream position, so `--resume` neither loses nor repeats a sample.

Several ranks (DeepSpeed data parallelism, started by the launcher with RANK/WORLD_SIZE):
every rank reads the same batch from the stream and trains its share of it
(`shard_for_rank`); every rank runs as many micro-batches as the busiest one, because
ZeRO-3 gathers parameters collectively in each forward and backward; all ranks agree on
when to stop; rank 0 alone publishes progress, logs metrics (reduced over the ranks),
broadcasts the gathered weights to the servers and finalises checkpoints, while the
other ranks take part in the gathers. `DIR/trainer_shards.jsonl` records which samples
each rank trained at each step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rl_core.config.run_config import RunConfig
from rl_core.common.contracts import RolloutSample, TrainerBackend
from rl_core.common import metric_names as mn
from rl_core.trainer.loss import pack_micro_batches, samples_with_gradient, scoring_temperature
from rl_core.trainer.losses import LossSettings, LossTotals, effective_sample_size, m2po_keep_masks, policy_loss, step_normaliser
from rl_core.rundir.metrics import JsonlSink, MetricsSink, MultiSink
from rl_core.common.processes import freeze_startup_objects
from rl_core.rundir.heartbeats import start_trainer_heartbeat, trainer_rank_name
from rl_core.rundir.timeline import TimelineWriter, TrainerTimeline
from rl_core.rundir.layout import (
    CHECKPOINT_STATE_FILE,
    CHECKPOINTS_DIR,
    LATEST_CHECKPOINT_LINK,
    METRICS_FILE,
    SHARDS_FILE,
    TrainerProgress,
    checkpoint_dir_name,
    latest_checkpoint,
    load_run_config,
    stop_requested,
    stream_redis_url,
    write_progress,
)
from rl_core.rundir.role_args import role_parser, role_servers
from rl_core.rundir.stream import StreamReader, open_reader
from rl_core.trainer.train_records import TrainRecords

LAG_HISTOGRAM_BINS = 9  # policy_lag/share/0 .. /7 and /8+ on the run page


# --- backend choice ----------------------------------------------------------------


def make_backend(config: RunConfig, model_path: str | Path) -> TrainerBackend:
    """Every backend is built from the run's config and the initial weights."""
    if config.trainer.backend == "deepspeed":
        # Imported lazily: DeepSpeed is a GPU extra, absent from CPU installs.
        from rl_core.trainer.deepspeed_backend import DeepSpeedBackend

        return DeepSpeedBackend.from_config(config, model_path)
    from rl_core.trainer.torch_backend import TorchBackend

    return TorchBackend.from_config(config, model_path)


# --- ranks ------------------------------------------------------------------------


@dataclass
class TrainerRanks:
    """This process's place among the trainer's data-parallel ranks: torch.distributed's
    default group (DeepSpeed initialised it from RANK/WORLD_SIZE), or one rank alone."""

    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")  # NCCL reduces CUDA tensors, gloo CPU ones

    @classmethod
    def from_backend(cls, backend: TrainerBackend) -> TrainerRanks:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return cls()
        return cls(dist.get_rank(), dist.get_world_size(), torch.device(getattr(backend, "device", "cpu")))

    def reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """Element-wise sum (or max) of `values` over the ranks."""
        if self.world_size == 1:
            return list(values)
        import torch.distributed as dist

        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX if op == "max" else dist.ReduceOp.SUM)
        return tensor.tolist()

    def any(self, flag: bool) -> bool:
        """True on every rank if it is true on any rank."""
        return self.reduce([float(flag)], "max")[0] > 0

    def barrier(self) -> None:
        self.reduce([0.0])


def shard_for_rank(samples: list[RolloutSample], rank: int, world_size: int) -> list[RolloutSample]:
    """This rank's share of an optimizer batch: longest sample first to the rank with the
    fewest tokens so far (ties to the lower rank), so ranks get about equal compute.
    Deterministic: every rank computes the same split of the same list. Stream order is
    kept within a share."""
    if world_size == 1:
        return list(samples)
    loads = [0] * world_size
    owner = [0] * len(samples)
    for index in sorted(range(len(samples)), key=lambda i: (-samples[i].num_tokens, i)):
        target = min(range(world_size), key=lambda r: (loads[r], r))
        owner[index] = target
        loads[target] += samples[index].num_tokens
    return [sample for sample, who in zip(samples, owner) if who == rank]


def _padding_micro_batch(backend: TrainerBackend, with_reference: bool) -> None:
    """A forward and backward that changes no gradient: keeps this rank in step with
    ranks that have more micro-batches (ZeRO-3's parameter gathers are collective)."""
    input_ids = torch.zeros((1, 2), dtype=torch.long)
    position_ids = torch.arange(2).unsqueeze(0)
    logprobs, _ = backend.token_logprobs(input_ids, None, position_ids)
    if with_reference:
        backend.reference_logprobs(input_ids, None, position_ids)
    backend.backward(logprobs.sum() * 0.0)


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
    lag_counts: list[int]  # trained tokens at lag 0, 1, ..., LAG_HISTOGRAM_BINS - 1 (the last bin: that lag or more)
    num_tokens: int
    num_samples: int
    rank_sample_ids: list[str] | None = None  # the samples this rank trained (its share)
    loss_metrics: dict[str, float] = field(default_factory=dict)  # the objective's own (losses.LossTotals)
    optimizer_started: float = 0.0  # unix time the optimizer step began (the Timeline's forward/backward end)


def train_step(
    backend: TrainerBackend, samples: list[RolloutSample], config: RunConfig, ranks: TrainerRanks | None = None,
    records: TrainRecords | None = None,
) -> tuple[StepStats, dict[str, float]]:
    """Gradient accumulation over packed micro-batches, then one optimizer step.

    With several ranks, `samples` is the whole batch (the same on every rank); this rank
    trains its share and the returned stats cover the whole batch."""
    t = config.trainer
    ranks = ranks or TrainerRanks()
    version = backend.version
    share = shard_for_rank(samples, ranks.rank, ranks.world_size)
    # Zero-advantage samples count in the normalisation below but are not computed.
    trained = samples_with_gradient(share, t.kl_coef)
    micro_batches = pack_micro_batches(
        trained, t.micro_batch_tokens, t.packed_row_tokens(), share_prefixes=t.share_completion_prefixes)
    padding = int(ranks.reduce([float(len(micro_batches))], "max")[0]) - len(micro_batches)
    # Sequences or tokens of the whole batch (losses.step_normaliser), this rank's share of them.
    settings = LossSettings.from_config(config)
    normaliser = step_normaliser(settings, samples, ranks.world_size)
    temperature = scoring_temperature(config.sampling.temperature)
    keep_masks = None
    if settings.kind == "m2po":  # its mask depends on the whole batch's log ratios
        keep_masks = m2po_keep_masks(backend, micro_batches, padding, temperature, settings.m2po_tau, ranks.reduce,
                                     ranks.rank, ranks.world_size)
    totals = LossTotals()
    total_loss = total_entropy = total_w = total_w2 = total_kl = 0.0
    total_tokens = clipped = 0
    lag_sum = 0
    lag_max = 0
    lag_counts = torch.zeros(LAG_HISTOGRAM_BINS, dtype=torch.long)
    for index, batch in enumerate(micro_batches):
        layout = (batch.attention_mask, batch.position_ids)
        logprobs, entropy = backend.token_logprobs(
            batch.input_ids, *layout, temperature, batch.logit_source, batch.packed_layout, batch.target_ids)
        if records is not None:  # the viewer's importance ratios (references only; written after the step)
            records.capture(batch, logprobs, trained)
        reference = None
        if t.kl_coef > 0:
            reference = backend.reference_logprobs(
                batch.input_ids, *layout, temperature, batch.logit_source, batch.packed_layout, batch.target_ids)
        out = policy_loss(logprobs, batch, normaliser, settings, entropy, reference,
                          None if keep_masks is None else keep_masks[index])
        totals.add(out)
        backend.backward(out.loss)
        lags = (version - batch.token_versions)[batch.loss_mask]  # trained tokens only: never a tool token's -1
        lag_sum += int(lags.sum())
        lag_max = max(lag_max, int(lags.max()) if lags.numel() else 0)
        lag_counts += torch.bincount(lags.clamp(0, LAG_HISTOGRAM_BINS - 1), minlength=LAG_HISTOGRAM_BINS)
        total_loss += float(out.loss.detach())
        total_entropy += out.sum_entropy
        total_w += out.sum_weights
        total_w2 += out.sum_weights_sq
        total_kl += out.sum_kl
        total_tokens += out.num_tokens
        clipped += out.num_clipped
    for _ in range(padding):
        _padding_micro_batch(backend, t.kl_coef > 0)
    optimizer_started = time.time()
    step_info = backend.optimizer_step()
    if ranks.world_size > 1:
        sums = ranks.reduce([total_loss, total_entropy, total_w, total_w2, total_kl, total_tokens, clipped, lag_sum,
                             *lag_counts.tolist()])
        total_loss = sums[0] / ranks.world_size  # each rank's loss was scaled up by world / N
        total_entropy, total_w, total_w2, total_kl = sums[1:5]
        total_tokens, clipped, lag_sum = (int(value) for value in sums[5:8])
        lag_counts = torch.tensor([int(value) for value in sums[8:]])
        lag_max = int(ranks.reduce([float(lag_max)], "max")[0])
        totals = totals.reduced(ranks.reduce)
    tokens = max(1, total_tokens)
    stats = StepStats(
        loss=total_loss, entropy=total_entropy / tokens, ess=effective_sample_size(total_w, total_w2, total_tokens),
        kl=total_kl / tokens, clip_fraction=clipped / tokens, lag_mean=lag_sum / tokens, lag_max=lag_max,
        lag_counts=lag_counts.tolist(), num_tokens=total_tokens, num_samples=len(samples), rank_sample_ids=[sample.sample_id for sample in share],
        loss_metrics=totals.metrics(settings), optimizer_started=optimizer_started,
    )
    return stats, step_info


def lag_shares(lag_counts: list[int]) -> dict[str, float]:
    """`policy_lag/share/<k>`: the share of this step's trained tokens sampled k versions
    earlier (the last bin, `<k>+`, holds k or more), for the run page's lag distribution."""
    total = max(1, sum(lag_counts))
    last = len(lag_counts) - 1
    return {f"policy_lag/share/{k}{'+' if k == last else ''}": count / total for k, count in enumerate(lag_counts)}


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
        ranks: TrainerRanks | None = None,
    ) -> None:
        self.config = config
        self.run_dir = Path(run_dir)
        self.backend = backend
        self.reader = reader
        self.sink = sink
        self.broadcaster = broadcaster  # rank 0's; None on the other ranks
        self.ranks = ranks or TrainerRanks()
        self.consumed = 0  # samples taken from the stream (trained or dropped)
        self.dropped_stale = 0
        # Completion tokens dropped as stale and trained, for the dropped share of tokens.
        self.dropped_stale_tokens = 0
        self.stale_ids: list[str] = []  # dropped by the batch being read; recorded once it is trained
        self.trained_tokens = 0
        self.train_records = TrainRecords.for_run(config, self.run_dir)
        # The run page's Timeline: this rank's phases (waiting, forward/backward, optimizer, broadcast).
        self.timeline = TrainerTimeline(TimelineWriter(self.run_dir, "trainer", trainer_rank_name(self.ranks.rank)))

    def resume(self, checkpoint: Path) -> None:
        state = json.loads((checkpoint / CHECKPOINT_STATE_FILE).read_text())
        self.backend.load_checkpoint(str(checkpoint))
        self.reader.seek(state["stream_position"])
        self.consumed = int(state["consumed"])
        self.dropped_stale = int(state.get("dropped_stale", 0))
        self.dropped_stale_tokens = int(state.get("dropped_stale_tokens", 0))
        self.trained_tokens = int(state.get("trained_tokens", 0))

    def publish(self, done: bool = False) -> None:
        if self.ranks.rank != 0:
            return
        write_progress(self.run_dir, TrainerProgress(
            version=self.backend.version, consumed=self.consumed, done=done,
            max_steps=self.config.trainer.max_steps, t=time.time(),
        ))

    def broadcast(self) -> dict[str, float]:
        attached = self.broadcaster is not None
        if self.ranks.world_size > 1:
            attached = self.ranks.any(attached)
        if not attached:
            return {}
        if self.broadcaster is None:
            # Rank 0 sends; gathering full parameters is collective under ZeRO-3, so this
            # rank walks the same buckets.
            for _ in self.backend.parameters_for_broadcast():
                pass
            return {}
        return dict(self.broadcaster.broadcast(self.backend.parameters_for_broadcast(), self.backend.version) or {})

    def record_shard(self, sample_ids: list[str]) -> None:
        line = json.dumps({"step": self.backend.version, "rank": self.ranks.rank, "sample_ids": sample_ids}) + "\n"
        # One O_APPEND write per line: the ranks' lines never interleave.
        fd = os.open(self.run_dir / SHARDS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)

    def stop_requested(self) -> bool:
        return stop_requested(self.run_dir)

    def next_batch(self) -> list[RolloutSample] | None:
        """`samples_per_step` samples in stream order, or None if a stop was requested
        while waiting. A sample whose tokens would be trained more than `max_lag`
        versions late is dropped and counted (`train/dropped_stale`, with its share of
        tokens). The async actor keeps the bound at submission (`actor/lag_throttle.py`), so
        in a normal run none is; a resumed run can see some (samples written before the
        crash by weights the checkpoint lacks), as can a stream written by another actor."""
        wanted = self.config.trainer.samples_per_step
        batch: list[RolloutSample] = []
        start = self.counters()
        while len(batch) < wanted:
            if self.stop_requested():
                # A partial batch is not trained: rewind, so the checkpoint's position is
                # before these samples and a resumed run trains them.
                self.restore_counters(start)
                return None
            for sample in self.reader.read(wanted - len(batch), timeout_s=1.0):
                self.consumed += 1
                # The policy's tokens only: a tool token's version (-1) was sampled by no policy.
                if self.backend.version - min(sample.policy_versions(), default=self.backend.version) > self.config.actor.max_lag:
                    self.dropped_stale += 1
                    self.dropped_stale_tokens += len(sample.completion_token_ids)
                    self.stale_ids.append(sample.sample_id)
                    continue
                batch.append(sample)
        return batch

    def counters(self) -> tuple[int, int, int, int]:
        """The stream position and the counts that move with it (restored together on a rewind)."""
        return self.reader.position(), self.consumed, self.dropped_stale, self.dropped_stale_tokens

    def restore_counters(self, saved: tuple[int, int, int, int]) -> None:
        self.reader.seek(saved[0])
        self.consumed, self.dropped_stale, self.dropped_stale_tokens = saved[1:]
        self.stale_ids = []  # read again (and judged again) by the step that takes them

    def save_checkpoint(self) -> Path:
        root = self.run_dir / CHECKPOINTS_DIR
        root.mkdir(parents=True, exist_ok=True)
        name = checkpoint_dir_name(self.backend.version)
        staging = root / f".{name}.tmp"
        if staging.exists() and self.ranks.rank == 0:
            import shutil

            shutil.rmtree(staging)
        self.ranks.barrier()
        self.backend.save_checkpoint(str(staging))  # collective: each rank writes its optimizer shard
        # Every shard is on disk before rank 0 renames the directory and points `latest` at it.
        self.ranks.barrier()
        if self.ranks.rank != 0:
            return root / name
        (staging / CHECKPOINT_STATE_FILE).write_text(json.dumps({
            "version": self.backend.version,
            "stream_position": self.reader.position(),
            "consumed": self.consumed,
            "dropped_stale": self.dropped_stale,
            "dropped_stale_tokens": self.dropped_stale_tokens,
            "trained_tokens": self.trained_tokens,
            "t": time.time(),
        }, indent=2) + "\n")
        final = root / name
        if final.exists():
            import shutil

            shutil.rmtree(final)
        os.replace(staging, final)
        # `latest` is a relative symlink swapped atomically: usable as a model path.
        tmp_link = root / f".{LATEST_CHECKPOINT_LINK}.tmp"
        if tmp_link.is_symlink() or tmp_link.exists():
            tmp_link.unlink()
        os.symlink(name, tmp_link)
        os.replace(tmp_link, root / LATEST_CHECKPOINT_LINK)
        return final

    def run(self) -> None:
        t = self.config.trainer
        if self.backend.version > 0:
            # Resumed: the servers started from the checkpoint's weights but not its version.
            self.broadcast()
        self.publish()
        last_end = time.monotonic()
        while self.backend.version < t.max_steps and not self.ranks.any(self.stop_requested()):
            start = self.counters()
            samples = self.next_batch()
            if self.ranks.any(samples is None):
                # Every rank stops at the same step boundary; one that already had its
                # batch puts it back, so the checkpoint's stream position is before it.
                self.restore_counters(start)
                break
            assert samples is not None
            self.timeline.phase("wait")
            self.timeline.dropped_stale(self.dropped_stale - start[2])
            if self.ranks.rank == 0:  # every rank drops the same samples: one says which
                self.train_records.dropped_stale(self.stale_ids, self.backend.version + 1, self.consumed)
            self.stale_ids = []
            started = time.monotonic()
            records = self.train_records if self.train_records.wants(self.backend.version + 1) else None
            stats, step_info = train_step(self.backend, samples, self.config, self.ranks, records)
            self.timeline.phase("forward_backward", stats.optimizer_started)
            self.timeline.phase("optimizer")
            self.train_records.flush(self.backend.version, self.consumed)  # written on its own thread
            # Every run records which samples each step trained: a resume's "each sample trained
            # once" is checked from this file (single rank too: one short line per step).
            self.record_shard(stats.rank_sample_ids or [])
            train_s = time.monotonic() - started
            self.trained_tokens += stats.num_tokens
            sync = self.broadcast()
            self.publish()
            self.timeline.phase("broadcast", version=self.backend.version)
            now = time.monotonic()
            elapsed = max(1e-9, now - last_end)
            last_end = now
            version = self.backend.version
            metrics = {
                mn.TRAIN_LOSS: stats.loss,
                mn.TRAIN_GRAD_NORM: step_info.get("grad_norm", float("nan")),
                mn.TRAIN_LR: step_info.get("lr", float("nan")),
                mn.TRAIN_ENTROPY: stats.entropy,
                "train/ess": stats.ess,
                "train/clip_fraction": stats.clip_fraction,
                "train/samples_per_s": stats.num_samples / elapsed,
                "train/tokens_per_s": stats.num_tokens / elapsed,
                "train/step_s": train_s,
                mn.TRAIN_REWARD_MEAN: sum(sample.reward for sample in samples) / len(samples),
                "train/samples_consumed": float(self.consumed),
                mn.TRAIN_DROPPED_STALE: float(self.dropped_stale),
                "train/dropped_stale_token_share": self.dropped_stale_tokens
                / max(1, self.dropped_stale_tokens + self.trained_tokens),
                "policy_lag/mean": stats.lag_mean,
                mn.POLICY_LAG_MAX: float(stats.lag_max),
                **lag_shares(stats.lag_counts),
                **stats.loss_metrics,
                mn.WEIGHTS_VERSION: float(version),
                "weights/update_pause_s": float(sync.get("weights/update_pause_s", 0.0)),
            }
            if t.kl_coef > 0:
                metrics[mn.TRAIN_KL] = stats.kl
            for key, value in sync.items():
                metrics.setdefault(key, float(value))
            self.sink.log(version, metrics)
            if t.checkpoint_every and version % t.checkpoint_every == 0 and version < t.max_steps:
                self.save_checkpoint()
                self.timeline.phase("checkpoint")
        self.save_checkpoint()
        self.train_records.close()
        self.publish(done=True)


def make_weight_sender(config: RunConfig, run_dir: Path, servers: list[str], handoff: str | None, sync_backend: str) -> Any:
    """Rank 0's sender of the weights: in memory shared with the servers when they are on its
    device (`weight_handoff.SameDeviceSender`), else the process-group broadcast."""
    from rl_core.cluster.placement import choose_weight_handoff

    if (handoff or choose_weight_handoff(config)) == "same_device":
        from rl_core.weights.handoff import SameDeviceSender
        from rl_core.weights.segments import remove_run_segments, run_segment_tag

        remove_run_segments(run_dir, only_dead_owners=True)  # what a killed trainer of this run left
        return SameDeviceSender(servers, run_segment_tag(run_dir), device=config.trainer.device)
    from rl_core.weights.sync import WeightBroadcaster

    return WeightBroadcaster(servers, backend=sync_backend, streams=config.inference.weight_sync_streams)


def build_parser() -> argparse.ArgumentParser:
    """The shared role flags (rundir/role_args.py) and the trainer's own."""
    parser = role_parser("trainer", "Trainer of a run (started by `run`).", "to broadcast weights to")
    parser.add_argument("--model", default=None, help="Initial weights (default: config model.path).")
    parser.add_argument("--resume", action="store_true", help="Continue from checkpoints/latest.")
    parser.add_argument("--weight-sync-backend", default="gloo", choices=["gloo", "nccl"],
                        help="torch.distributed backend of the weight broadcast (placement.py picks it).")
    parser.add_argument("--weight-handoff", default=None, choices=["same_device", "collective"],
                        help="How weights reach the servers (default: as the run's placement picks it from "
                             "inference.weight_handoff, placement.choose_weight_handoff).")
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    run_dir = Path(args.run_dir)
    start_trainer_heartbeat(run_dir)  # the launcher's watchdog: a stopped rank stops beating
    config = load_run_config(run_dir)
    torch.set_num_threads(config.trainer.threads)
    torch.manual_seed(config.seed)
    random.seed(config.seed)
    checkpoint = latest_checkpoint(run_dir) if args.resume else None
    if args.resume and checkpoint is None:
        print(f"trainer: --resume but {run_dir / CHECKPOINTS_DIR / 'latest'} does not exist", file=sys.stderr)
        return 2
    # A multi-rank DeepSpeed backend joins the default group here (RANK/WORLD_SIZE from the launcher).
    backend = make_backend(config, args.model or config.model.path)
    ranks = TrainerRanks.from_backend(backend)
    # Every rank reads the whole stream (each takes its share of each batch).
    reader = open_reader(config.stream.kind, run_dir, stream_redis_url(config.stream, run_dir))
    # Rank 0 logs the (rank-reduced) metrics; an empty MultiSink drops the others' lines.
    sink: MetricsSink = JsonlSink(run_dir / METRICS_FILE) if ranks.rank == 0 else MultiSink()
    broadcaster = None
    servers = role_servers(args)  # the model is loaded: now the servers are needed
    if servers and ranks.rank == 0:
        broadcaster = make_weight_sender(config, run_dir, servers, args.weight_handoff, args.weight_sync_backend)
        broadcaster.connect()
    trainer = Trainer(config, run_dir, backend, reader, sink, broadcaster, ranks)
    if checkpoint is not None:
        trainer.resume(checkpoint)
        print(f"trainer: resumed from {checkpoint} at version {backend.version}", flush=True)
    freeze_startup_objects()
    try:
        trainer.run()
    finally:
        if broadcaster is not None:
            broadcaster.close()
        reader.close()
        sink.close()
    print(f"trainer: rank {ranks.rank}/{ranks.world_size} finished at version {backend.version}", flush=True)
    return 0
