"""The reference engine's settings and what it needs from a speculative drafter
(kept apart from `inference/engine.py` so that module stays about the decode loop)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from rl_core.config.run_config import RunConfig


# What `ReferenceEngine.stats()` counts (server.py exports them as Prometheus metrics).
ENGINE_COUNTERS = (
    "requests_submitted", "requests_finished", "requests_aborted", "prompt_tokens", "prompt_tokens_shared",
    "generated_tokens", "steps", "spec_drafted_tokens", "spec_accepted_tokens", "spec_verify_steps",
    "weight_updates", "last_update_pause_s", "decode_rows_shared", "prompt_tokens_retained",
)


class Drafter(Protocol):
    """What the engine needs from a speculative drafter (HistoSpec in `inference/speculation.py`)."""

    def draft(self, history_key: str, generated_token_ids: list[int], max_tokens: int) -> list[int]: ...

    def add_response(self, history_key: str, token_ids: list[int]) -> None: ...


@dataclass
class EngineConfig:
    max_batch_size: int = field(default=64, metadata={"help": "Most sequences decoded together (KV-cache slots)."})
    max_seq_len: int | None = field(
        default=None,
        metadata={"help": "Longest prompt+response per sequence; None = min(model max positions, 4096)."},
    )
    initial_cache_len: int = field(
        default=256, metadata={"help": "Positions preallocated per slot at start; doubled on demand up to max_seq_len."}
    )
    max_prefill_tokens: int = field(
        default=4096, metadata={"help": "Prompt tokens admitted per step at most (at least one request always is)."}
    )
    seed: int = field(default=0, metadata={"help": "Seeds the sampling of requests that bring no seed of their own."})
    initial_draft_len: int = field(default=2, metadata={"help": "Speculation: draft length a request starts with."})
    max_draft_len: int = field(default=16, metadata={"help": "Speculation: draft length cap (doubled on full acceptance)."})
    spec_step_token_budget: int | None = field(
        default=None,
        metadata={"help": "Speculation: drafted tokens per step at most, shared evenly by the running sequences "
                  "(0 = no cap). None: `forward_overhead_tokens` on a CPU, where a forward's cost grows with every "
                  "token it is fed so a draft only pays where it saves a step's fixed overhead (a short batch); "
                  "no cap on a GPU, where a decode step is memory-bound and verifying a draft is nearly free."},
    )
    forward_overhead_tokens: int = field(
        default=16,
        metadata={"help": "Cost of one extra forward pass, in padded tokens: rows of different widths run in "
                  "separate forwards when padding them together would cost more than this (see width_groups)."},
    )
    retained_sequences: int = field(
        default=16,
        metadata={"help": "Finished sequences whose K/V stay cached (in as many extra slots, the least recently "
                  "used overwritten first) so that a request continuing one — a tool call's next turn, whose prompt "
                  "is the turn's prompt + tokens + the tool's output — copies them instead of prefilling them again. "
                  "Only K/V computed at the current weights are copied. 0: none kept."},
    )
    share_identical_decodes: bool = field(
        default=True,
        metadata={"help": "Decode sequences with the same prompt and tokens so far (admitted in the same step) "
                  "with one forward row, each sampling its own token from it (shared_decode.py)."},
    )


def engine_config_for(config: RunConfig, server_index: int = 0) -> EngineConfig:
    """The one mapping from a run's config to the engine settings of its server `server_index`
    (each server seeds requests without a seed of their own differently)."""
    inference, histospec = config.inference, config.accelerations.histospec
    return EngineConfig(
        max_batch_size=inference.max_batch_size,
        max_seq_len=inference.max_seq_len,
        initial_cache_len=inference.initial_cache_len,
        max_prefill_tokens=inference.max_prefill_tokens,
        seed=config.seed + server_index,
        initial_draft_len=histospec.initial_draft_len,
        max_draft_len=histospec.max_draft_len,
        spec_step_token_budget=inference.spec_step_token_budget,
        forward_overhead_tokens=inference.forward_overhead_tokens,
        share_identical_decodes=inference.share_identical_decodes,
        retained_sequences=inference.retained_sequences,
    )
