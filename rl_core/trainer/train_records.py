"""Per-token log-probabilities the trainer computed, for the rollout viewer's importance ratios.

The trainer calls `capture` on each micro-batch (it keeps references, copies nothing) and
`flush` after the optimizer step; a background thread turns the captured tensors into lines of
`DIR/train_logprobs.jsonl`:

    {"sample_id": str, "step": int, "consumed": int, "logprobs": [float, ...]}

`step` is the trainer version after the step that trained the sample, `consumed` how many
stream lines the trainer had taken by then (the platform attaches a line only once it has read
that far in the stream), `logprobs` one value per completion token, rounded to 4 decimals.
Only steps that are multiples of `monitoring.rollouts.keep_every_n_steps` are recorded: the
platform stores rollouts of those steps only (its stride is always a multiple of that).
Each rank records the samples it trained (its share); one O_APPEND write per line, so the
ranks' lines never interleave.

Rank 0 also says which stream samples it dropped as stale (past `actor.max_lag`), every one of
them (they are rare: the actor keeps the bound at submission), so the viewer marks them as not
trained:

    {"sample_id": str, "step": int, "consumed": int, "discarded": "stale"}

`step` the version the step that dropped it brought the trainer to, `consumed` as above.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from rl_core.rundir.layout import TRAIN_LOGPROBS_FILE

if TYPE_CHECKING:
    import torch

    from rl_core.config.run_config import RunConfig
    from rl_core.common.contracts import RolloutSample
    from rl_core.trainer.loss import MicroBatch

logger = logging.getLogger(__name__)

DECIMALS = 4
# One micro-batch: its logprobs [R, T], its loss mask, and (sample_id, completion length) in mask order.
Captured = tuple["torch.Tensor", "torch.Tensor", list[tuple[str, int]]]
# Steps waiting for the writer thread; past this a flush blocks (the disk cannot keep up,
# and losing records silently would make the viewer's ratios look randomly absent).
MAX_PENDING_STEPS = 8


class TrainRecords:
    def __init__(self, run_dir: str | Path, every_n_steps: int, enabled: bool = True) -> None:
        self.path = Path(run_dir) / TRAIN_LOGPROBS_FILE
        self.every_n_steps = max(1, int(every_n_steps))
        self.enabled = enabled
        self._captured: list[Captured] = []
        self._queue: queue.Queue[tuple[int, int, list[Captured]] | None] = queue.Queue(MAX_PENDING_STEPS)
        self._thread: threading.Thread | None = None
        self._failed = False

    @classmethod
    def for_run(cls, config: RunConfig, run_dir: str | Path) -> TrainRecords:
        rollouts = config.monitoring.rollouts
        return cls(run_dir, rollouts.keep_every_n_steps, rollouts.train_logprobs)

    def wants(self, step: int) -> bool:
        """Whether the step that will bring the trainer to version `step` is recorded."""
        return self.enabled and step % self.every_n_steps == 0

    def capture(self, batch: MicroBatch, logprobs: torch.Tensor, samples: Sequence[RolloutSample]) -> None:
        """`logprobs` [R, T] of a micro-batch packed from `samples`. Detached references only:
        the values are read on the writer thread (the trainer's next steps do not change them)."""
        # sample_order lists the completions in the order their tokens lie in the loss mask.
        members = [(samples[index].sample_id, len(samples[index].completion_token_ids)) for index in batch.sample_order]
        values = logprobs.detach()
        if values.untyped_storage().nbytes() > 2 * values.numel() * values.element_size():
            # A view into something larger (a backend's [B, T, V] table): holding it until the
            # writer runs would keep all of it alive. The copy is [B, T] and asynchronous on a GPU.
            values = values.clone()
        # Every completion token's value, tool tokens too (their logprob, though not trained), so a
        # record lines up with the sample's tokens.
        self._captured.append((values, batch.loss_mask if batch.term_mask is None else batch.term_mask, members))

    def flush(self, step: int, consumed: int) -> None:
        """Hand the step's captured micro-batches to the writer thread (no-op if none)."""
        if not self._captured:
            return
        captured, self._captured = self._captured, []
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="train-records", daemon=True)
            self._thread.start()
        self._queue.put((step, consumed, captured))

    def dropped_stale(self, sample_ids: Sequence[str], step: int, consumed: int) -> None:
        """Record `sample_ids` as dropped stale (written at once: a few lines, seldom). Recorded
        whatever `train_logprobs` says: it is what the viewer shows of a sample, not a ratio."""
        if not sample_ids:
            return
        from rl_core.common.contracts import DISCARD_STALE

        lines = [json.dumps({"sample_id": sample_id, "step": step, "consumed": consumed, "discarded": DISCARD_STALE},
                            separators=(",", ":")) + "\n" for sample_id in sample_ids]
        try:
            self._append(lines)
        except OSError as exc:  # the viewer's marks must never stop training
            logger.warning("train records: writing %s failed (%r); stale drops not recorded", self.path, exc)

    def close(self) -> None:
        """Write what is pending and stop the thread."""
        self._captured = []
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            if self._failed:
                continue
            try:
                self._write(*item)
            except Exception as exc:  # noqa: BLE001 - the viewer's ratios must never stop training
                self._failed = True
                logger.warning("train records: writing %s failed (%r); no more are recorded this run", self.path, exc)

    def _write(self, step: int, consumed: int, captured: list[Captured]) -> None:
        lines = []
        for logprobs, mask, members in captured:
            flat = logprobs[mask.to(logprobs.device)].float().cpu().tolist()  # row by row: sample_order's order
            if len(flat) != sum(length for _, length in members):
                raise ValueError(f"{len(flat)} trained tokens but the samples have {sum(n for _, n in members)}")
            start = 0
            for sample_id, length in members:
                values = [round(value, DECIMALS) for value in flat[start:start + length]]
                start += length
                lines.append(json.dumps({"sample_id": sample_id, "step": step, "consumed": consumed, "logprobs": values},
                                        separators=(",", ":")) + "\n")
        self._append(lines)

    def _append(self, lines: list[str]) -> None:
        """Whole lines, each one write on an O_APPEND descriptor: the stale marks (main thread) and
        the ratios (writer thread) interleave by line, never inside one."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            for line in lines:
                os.write(fd, line.encode())
        finally:
            os.close(fd)

