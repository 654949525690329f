"""The actor's samples that are never trained, kept for the rollout viewer with why.

The stream carries only what the trainer trains; a researcher reading the viewer also wants what
the actor threw away (a dropped zero-advantage group, an aborted response), so those go to their
own file, `stream/discarded.jsonl` (`layout.DISCARDED_ROLLOUTS_FILE`), as `RolloutSample` lines
with `discarded` set (`contracts.ACTOR_DISCARD_REASONS`) and `metadata["stream_line"]`: the stream's
length when the sample was discarded, i.e. the line it would have had, which gives it the step
the viewer files it under.

Bounded like the viewer's store: only samples of steps that are multiples of
`monitoring.rollouts.keep_every_n_steps` are written (the platform keeps no other step), as the
trainer's `train_records` does. The file is opened on the first such sample, so a run that
discards nothing has none.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rl_core.common.contracts import ACTOR_DISCARD_REASONS, RolloutSample
from rl_core.config.run_config import RunConfig
from rl_core.rundir.layout import DISCARDED_FILE
from rl_core.rundir.stream import FileStreamWriter


class DiscardedSamples:
    def __init__(self, run_dir: str | Path, samples_per_step: int, keep_every_n_steps: int) -> None:
        self.run_dir = Path(run_dir)
        self.samples_per_step = max(1, samples_per_step)
        self.keep_every = max(1, keep_every_n_steps)
        self._writer: FileStreamWriter | None = None
        self.written = 0  # samples this actor wrote to the file (tests, metrics)

    @classmethod
    def from_config(cls, config: RunConfig, run_dir: str | Path) -> DiscardedSamples:
        return cls(run_dir, config.trainer.samples_per_step, config.monitoring.rollouts.keep_every_n_steps)

    def step_at(self, stream_line: int) -> int:
        """The step a sample written at `stream_line` would train at (the platform's `step_of_line`)."""
        return stream_line // self.samples_per_step + 1

    def record(self, samples: list[tuple[RolloutSample, str]], stream_line: int) -> None:
        """Write `samples` (each with its reason) as discarded at stream position `stream_line`."""
        if not samples or self.step_at(stream_line) % self.keep_every != 0:
            return
        lines = []
        for sample, reason in samples:
            if reason not in ACTOR_DISCARD_REASONS:
                raise ValueError(f"not an actor's discard reason: {reason!r}; one of {', '.join(ACTOR_DISCARD_REASONS)}")
            lines.append(replace(sample, discarded=reason, metadata={**sample.metadata, "stream_line": stream_line}))
        if self._writer is None:
            self._writer = FileStreamWriter(self.run_dir, DISCARDED_FILE)
        self._writer.append(lines)
        self.written += len(lines)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
