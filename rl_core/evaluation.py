"""Evaluation: benchmarks, mean@k / pass@k with a standard error, per-problem results.

The core (`evaluate`) only needs an async `generate(messages, sampling, n)`
returning `n` `GenerationResult`s, so the same code scores a model in-process
(`engine_generate`, the reference engine) or through inference servers during
a run (`rl_core.client.InferenceClient.generate` has exactly that signature).

Per problem, k samples are drawn and graded with `rewards.score_many`:
mean@k is the mean over problems of the fraction correct, pass@k the fraction
of problems with at least one correct sample, and the standard error is that
of mean@k across problems (sample std of per-problem means / sqrt(problems)).
A problem whose prompt plus the token budget does not fit the engine's context is
skipped, not fatal: its per-problem line says `"skipped": "too_long"`, the summary
counts it (`skipped_too_long`), and the aggregates are over the problems scored.
`write_report` lays the results out as docs/ARCHITECTURE.md says:
`DIR/evals.jsonl` (one line per step and benchmark) and
`DIR/eval/step_XXXXXX_<bench>.jsonl` (one line per problem).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping

from rl_core.config import DEFAULT_SHARED_DATA_DIR, EvalConfig, TaskConfig
from rl_core.contracts import EVAL_PRIORITY, GenerationResult, SamplingParams
from rl_core.rewards import RewardResult, VerifierPool, score_many
from rl_core.run_dir import EVAL_DIR, EVALS_FILE
from rl_core.tasks import MATH_SYSTEM_PROMPT, Problem, load_jsonl_problems, load_task

GenerateFn = Callable[[list[dict[str, str]], SamplingParams, int], Awaitable[list[GenerationResult]]]


@dataclass(frozen=True)
class PromptTemplate:
    """How a problem becomes chat messages: an optional system message and a user-message format."""

    system: str | None = None
    user: str = "{problem}"

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        messages = [{"role": "system", "content": self.system}] if self.system else []
        messages.append({"role": "user", "content": self.user.format(problem=problem.problem)})
        return messages


# The common math-eval chat forms; `system` is the default (Qwen2.5-Math style).
PROMPT_TEMPLATES: dict[str, PromptTemplate] = {
    "system": PromptTemplate(system=MATH_SYSTEM_PROMPT),
    "user": PromptTemplate(user="{problem}\n" + MATH_SYSTEM_PROMPT),
    "plain": PromptTemplate(),
    "tiny": PromptTemplate(system=TaskConfig().system_prompt),  # what the tiny model was warm-started on
}


@dataclass(frozen=True)
class Benchmark:
    name: str
    path: str | None  # relative to the data dir; None = built in (synthetic)
    default_k: int
    template: str = "system"


BENCHMARKS: dict[str, Benchmark] = {
    "math500": Benchmark("math500", "math500/test.jsonl", default_k=4),
    "aime24": Benchmark("aime24", "aime24/test.jsonl", default_k=16),
    "aime25": Benchmark("aime25", "aime25/test.jsonl", default_k=16),
    "gsm8k": Benchmark("gsm8k", "gsm8k/test.jsonl", default_k=4),
    # The held-out arithmetic set of the default synthetic task: the tiny model's own benchmark.
    "synthetic": Benchmark("synthetic", None, default_k=4, template="tiny"),
}


# The name the task's held-out set is evaluated and reported under (evals.jsonl's `benchmark`,
# `eval/step_XXXXXX_heldout.jsonl`): the run's own held-out problems, not a file benchmark.
HELDOUT_BENCHMARK = "heldout"


class EvalError(ValueError):
    """Unknown benchmark, missing data, bad k: the message says which."""


# How every engine behind the inference contract refuses a request that does not fit its
# context (reference: engine_sampling.check_request; vLLM: vllm_engine.VllmEngine.submit);
# a server returns it as a 400 (tests/rl_core/test_engine_contract.py pins it for both).
PROMPT_TOO_LONG_MARKER = "exceeds the engine's max_seq_len"


class PromptTooLong(EvalError):
    """The problem's prompt + max_new_tokens does not fit the engine's context."""


def is_prompt_too_long(exc: BaseException) -> bool:
    """Whether a `generate` failure is the engine refusing a prompt too long for its context
    (in process: a ValueError; through a server: the client's ServerError with status 400)."""
    if isinstance(exc, PromptTooLong):
        return True
    status = getattr(exc, "status", None)
    return isinstance(exc, (ValueError, RuntimeError)) and status in (None, 400) and PROMPT_TOO_LONG_MARKER in str(exc)


def get_benchmark(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise EvalError(f"unknown benchmark {name!r}; known: {', '.join(sorted(BENCHMARKS))}")
    return BENCHMARKS[name]


def load_benchmark(name: str, data_dir: str | Path = DEFAULT_SHARED_DATA_DIR, max_problems: int | None = None) -> list[Problem]:
    benchmark = get_benchmark(name)
    if benchmark.path is None:
        problems = load_task(TaskConfig()).heldout
    else:
        path = Path(data_dir) / benchmark.path
        if not path.is_file():
            raise EvalError(f"benchmark {name}: data file not found at {path} (set eval.data_dir / --data-dir)")
        problems = load_jsonl_problems(path)
    return problems[:max_problems] if max_problems else problems


def default_k(name: str, overrides: Mapping[str, int] | None = None) -> int:
    if overrides and name in overrides:
        return int(overrides[name])
    return get_benchmark(name).default_k


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


@dataclass
class ProblemResult:
    problem_id: str
    answer: str
    samples: list[str]
    extracted: list[str | None]
    verdicts: list[bool]
    timed_out: int = 0
    policy_versions: list[int] = field(default_factory=list)
    truncated: int = 0  # samples that hit max_new_tokens
    skipped: str | None = None  # "too_long": not sampled, left out of the aggregates
    problem: str = ""  # the statement asked: the platform shows it beside the samples, not only the id

    @property
    def mean(self) -> float:
        return sum(self.verdicts) / len(self.verdicts) if self.verdicts else 0.0

    @property
    def passed(self) -> bool:
        return any(self.verdicts)

    def to_json(self) -> dict[str, Any]:
        return {
            "problem_id": self.problem_id,
            "problem": self.problem,
            "answer": self.answer,
            "samples": self.samples,
            "extracted": self.extracted,
            "verdicts": self.verdicts,
            "mean": self.mean,
            "pass": self.passed,
            "skipped": self.skipped,
        }


@dataclass
class EvalReport:
    benchmark: str
    k: int
    results: list[ProblemResult]  # every problem, skipped ones included, in benchmark order
    seconds: float = 0.0

    @property
    def scored(self) -> list[ProblemResult]:
        return [r for r in self.results if r.skipped is None]

    @property
    def skipped_too_long(self) -> int:
        return sum(r.skipped == "too_long" for r in self.results)

    @property
    def num_problems(self) -> int:
        """Problems scored (skipped ones are counted apart)."""
        return len(self.scored)

    @property
    def num_samples(self) -> int:
        return sum(len(r.verdicts) for r in self.results)

    @property
    def mean_at_k(self) -> float:
        scored = self.scored
        return sum(r.mean for r in scored) / len(scored) if scored else 0.0

    @property
    def pass_at_k(self) -> float:
        scored = self.scored
        return sum(r.passed for r in scored) / len(scored) if scored else 0.0

    @property
    def stderr(self) -> float:
        """Standard error of mean@k over problems (0 with fewer than two problems)."""
        n = self.num_problems
        if n < 2:
            return 0.0
        mean = self.mean_at_k
        variance = sum((r.mean - mean) ** 2 for r in self.scored) / (n - 1)
        return math.sqrt(variance / n)

    @property
    def timed_out(self) -> int:
        return sum(r.timed_out for r in self.results)

    @property
    def policy_versions(self) -> list[int]:
        return sorted({v for r in self.results for v in r.policy_versions})

    def metrics(self) -> dict[str, float]:
        """The keys the metrics stream carries for this benchmark."""
        prefix = f"eval/{self.benchmark}"
        return {
            f"{prefix}/mean_at_k": self.mean_at_k,
            f"{prefix}/pass_at_k": self.pass_at_k,
            f"{prefix}/stderr": self.stderr,
            f"{prefix}/timed_out": float(self.timed_out),
            f"{prefix}/skipped_too_long": float(self.skipped_too_long),
        }

    def summary(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "k": self.k,
            "mean_at_k": self.mean_at_k,
            "pass_at_k": self.pass_at_k,
            "stderr": self.stderr,
            "num_problems": self.num_problems,
            "num_samples": self.num_samples,
            "timed_out": self.timed_out,
            "truncated": sum(r.truncated for r in self.results),
            "skipped_too_long": self.skipped_too_long,
            "policy_versions": self.policy_versions,
            "seconds": round(self.seconds, 3),
        }


# ---------------------------------------------------------------------------
# The core
# ---------------------------------------------------------------------------


def problem_seed(seed: int, problem_id: str) -> int:
    """A per-problem sampling seed that does not depend on the order problems finish in."""
    digest = hashlib.sha256(f"{seed}:{problem_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


async def evaluate(
    benchmark: str,
    generate: GenerateFn,
    *,
    k: int | None = None,
    sampling: SamplingParams | None = None,
    max_problems: int | None = None,
    problems: list[Problem] | None = None,
    data_dir: str | Path = DEFAULT_SHARED_DATA_DIR,
    template: PromptTemplate | None = None,
    reward_timeout_s: float = 5.0,
    concurrency: int = 32,
    seed: int = 0,
    pool: VerifierPool | None = None,
) -> EvalReport:
    """Sample `k` responses per problem through `generate`, grade them, and aggregate."""
    k = k if k is not None else default_k(benchmark)
    if k < 1:
        raise EvalError(f"k must be >= 1, got {k}")
    sampling = sampling or SamplingParams()
    problems = problems if problems is not None else load_benchmark(benchmark, data_dir, max_problems)
    if max_problems:
        problems = problems[:max_problems]
    template = template or PROMPT_TEMPLATES[get_benchmark(benchmark).template if benchmark in BENCHMARKS else "system"]
    started = time.monotonic()
    # Bounded fan-out: enough problems in flight to fill the engine's batch, not the whole set at once.
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(problem: Problem) -> ProblemResult:
        async with gate:
            params = SamplingParams(
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_new_tokens=sampling.max_new_tokens,
                stop_token_ids=list(sampling.stop_token_ids),
                seed=problem_seed(seed if sampling.seed is None else sampling.seed, problem.id),
                priority=EVAL_PRIORITY,
            )
            try:
                outputs = await generate(template.messages(problem), params, k)
            except Exception as exc:
                if not is_prompt_too_long(exc):
                    raise
                # Does not fit the model's context: counted and reported, not fatal.
                return ProblemResult(problem_id=problem.id, answer=problem.answer, samples=[], extracted=[],
                                     verdicts=[], skipped="too_long", problem=problem.problem)
        if len(outputs) != k:
            raise EvalError(f"generate returned {len(outputs)} samples for {problem.id!r}, expected {k}")
        texts = [output.text for output in outputs]
        # Grading runs math-verify in worker processes; keep the event loop free meanwhile.
        graded: list[RewardResult] = await asyncio.to_thread(
            score_many, [(text, problem.answer) for text in texts], reward_timeout_s, pool
        )
        return ProblemResult(
            problem_id=problem.id,
            problem=problem.problem,
            answer=problem.answer,
            samples=texts,
            extracted=[g.extracted for g in graded],
            verdicts=[g.success for g in graded],
            timed_out=sum(g.timed_out for g in graded),
            policy_versions=sorted({v for output in outputs for v in output.token_versions}),
            truncated=sum(output.finish_reason == "length" for output in outputs),
        )

    results = await asyncio.gather(*(one(problem) for problem in problems))
    return EvalReport(benchmark=benchmark, k=k, results=list(results), seconds=time.monotonic() - started)


def engine_generate(engine: Any) -> GenerateFn:
    """A `generate` over an in-process `rl_core.engine.ReferenceEngine` (started by the caller)."""
    tokenizer = engine.tokenizer

    async def generate(messages: list[dict[str, str]], sampling: SamplingParams, n: int) -> list[GenerationResult]:
        prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))
        if len(prompt) + sampling.max_new_tokens > engine.max_seq_len:  # before any of the n is submitted
            raise PromptTooLong(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({sampling.max_new_tokens}) {PROMPT_TOO_LONG_MARKER} {engine.max_seq_len}"
            )
        futures = []
        for index in range(n):
            params = replace(sampling, stop_token_ids=list(sampling.stop_token_ids),
                             seed=None if sampling.seed is None else (sampling.seed + index) & 0xFFFFFFFF)
            futures.append(asyncio.wrap_future(engine.submit(prompt, params)))
        return list(await asyncio.gather(*futures))

    return generate


# ---------------------------------------------------------------------------
# Writing results (run directory layout of docs/ARCHITECTURE.md)
# ---------------------------------------------------------------------------


def results_file_name(step: int, benchmark: str) -> str:
    return f"{EVAL_DIR}/step_{step:06d}_{benchmark}.jsonl"


def write_problem_results(path: str | Path, report: EvalReport) -> Path:
    """One JSON line per problem; written to a temp file and renamed, so readers never see half."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(staging, "w", encoding="utf-8") as handle:
        for result in report.results:
            handle.write(json.dumps(result.to_json(), ensure_ascii=False) + "\n")
    os.replace(staging, path)
    return path


def write_report(run_dir: str | Path, step: int, report: EvalReport, metrics_sink: Any | None = None) -> dict[str, Any]:
    """Write the per-problem file, then append the summary line to `evals.jsonl` (and log metrics)."""
    run_dir = Path(run_dir)
    relative = results_file_name(step, report.benchmark)
    write_problem_results(run_dir / relative, report)
    line = {"t": time.time(), "step": int(step), **report.summary(), "results_file": relative}
    encoded = (json.dumps(line) + "\n").encode()
    # One write on an O_APPEND descriptor: concurrent writers never interleave inside a line.
    descriptor = os.open(run_dir / EVALS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, encoded)
    finally:
        os.close(descriptor)
    if metrics_sink is not None:
        metrics_sink.log(step, report.metrics())
    return line


async def run_benchmarks(
    eval_config: EvalConfig,
    generate: GenerateFn,
    *,
    step: int,
    run_dir: str | Path,
    sampling: SamplingParams,
    seed: int = 0,
    reward_timeout_s: float = 5.0,
    metrics_sink: Any | None = None,
) -> dict[str, float]:
    """Every benchmark of a run's `eval` section at one trainer step; returns the metrics logged."""
    metrics: dict[str, float] = {}
    params = SamplingParams(
        temperature=sampling.temperature if eval_config.temperature is None else eval_config.temperature,
        top_p=sampling.top_p,
        max_new_tokens=eval_config.max_new_tokens or sampling.max_new_tokens,
        stop_token_ids=list(sampling.stop_token_ids),
        seed=seed,
    )
    for name in eval_config.benchmarks:
        report = await evaluate(
            name,
            generate,
            k=default_k(name, eval_config.k),
            sampling=params,
            max_problems=eval_config.max_problems,
            data_dir=eval_config.data_dir,
            reward_timeout_s=reward_timeout_s,
            seed=seed,
        )
        write_report(run_dir, step, report, metrics_sink)
        metrics.update(report.metrics())
    return metrics


# ---------------------------------------------------------------------------
# CLI: python -m rl_core eval --model DIR --benchmark math500
# ---------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rl_core eval", description="Evaluate a model on a math benchmark.")
    parser.add_argument("--model", help="HF model directory (in-process reference engine).")
    parser.add_argument("--server", help="Instead of --model: base URL of a running inference server (http://127.0.0.1:PORT).")
    parser.add_argument("--benchmark", required=True, help=f"One of: {', '.join(sorted(BENCHMARKS))}.")
    parser.add_argument("--k", type=int, help="Samples per problem (default: aime 16, others 4).")
    parser.add_argument("--max-problems", type=int, help="Only the first N problems.")
    parser.add_argument("--out", help="Per-problem JSONL output file, or a folder to write <model>-<benchmark>.jsonl into "
                        "(default var/eval/).")
    parser.add_argument("--temperature", type=float, default=1.0, help="Sampling temperature (default 1.0).")
    parser.add_argument("--top-p", type=float, default=1.0, help="Nucleus mass (default 1.0).")
    parser.add_argument("--max-new-tokens", type=int, default=512, help="Token budget per sample (default 512).")
    parser.add_argument("--template", choices=sorted(PROMPT_TEMPLATES), help="Prompt template (default: the benchmark's).")
    parser.add_argument("--data-dir", default=DEFAULT_SHARED_DATA_DIR, help=f"Benchmark data folder (default {DEFAULT_SHARED_DATA_DIR}).")
    parser.add_argument("--seed", type=int, default=0, help="Sampling seed.")
    parser.add_argument("--device", default="cpu", help="Torch device for --model.")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="Parameter dtype for --model.")
    parser.add_argument("--max-batch-size", type=int, default=64, help="Engine batch size for --model.")
    parser.add_argument("--threads", type=int, default=1, help="torch threads for --model on CPU.")
    parser.add_argument("--reward-timeout", type=float, default=5.0, help="Seconds per math-verify check (a timeout scores 0).")
    return parser


def _validate_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if bool(args.model) == bool(args.server):
        parser.error("give exactly one of --model DIR or --server URL")
    if args.benchmark not in BENCHMARKS:
        parser.error(f"--benchmark: unknown {args.benchmark!r}; known: {', '.join(sorted(BENCHMARKS))}")
    if args.k is not None and args.k < 1:
        parser.error("--k must be >= 1")
    if args.max_problems is not None and args.max_problems < 1:
        parser.error("--max-problems must be >= 1")
    if args.max_new_tokens < 1:
        parser.error("--max-new-tokens must be >= 1")
    if args.temperature < 0 or not 0 < args.top_p <= 1:
        parser.error("--temperature must be >= 0 and --top-p in (0, 1]")
    if args.model and not (Path(args.model) / "config.json").is_file():
        parser.error(f"--model: {args.model} is not an HF model directory (no config.json)")
    # Checked before the evaluation, which may take hours: a results path that cannot be written.
    out = results_path(args)
    if out.is_dir():
        parser.error(f"--out: {out} is a folder")
    blocking = next((parent for parent in out.parents if parent.exists()), None)
    if blocking is not None and not blocking.is_dir():
        parser.error(f"--out: {blocking} is a file, not a folder")


def results_path(args: argparse.Namespace) -> Path:
    """Where the CLI writes the per-problem lines: --out itself, or `<model>-<benchmark>.jsonl`
    inside it when it is a folder (existing, or written with a trailing slash), else in var/eval/."""
    file_name = f"{Path(args.model).name if args.model else 'server'}-{args.benchmark}.jsonl"
    if not args.out:
        return Path("var") / "eval" / file_name
    out = Path(args.out)
    if out.is_dir() or args.out.endswith(("/", os.sep)):
        return out / file_name
    return out


async def _evaluate_cli(args: argparse.Namespace) -> EvalReport:
    sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed)
    template = PROMPT_TEMPLATES[args.template] if args.template else None
    common = dict(k=args.k, sampling=sampling, max_problems=args.max_problems, data_dir=args.data_dir,
                  template=template, reward_timeout_s=args.reward_timeout, seed=args.seed)
    if args.server:
        from rl_core.client import InferenceClient

        async with InferenceClient(args.server) as client:
            return await evaluate(args.benchmark, client.generate, **common)
    import torch

    from rl_core.engine import EngineConfig, ReferenceEngine

    torch.set_num_threads(args.threads)
    engine = ReferenceEngine.from_pretrained(
        args.model, device=args.device, dtype=args.dtype, config=EngineConfig(max_batch_size=args.max_batch_size, seed=args.seed)
    )
    engine.start()
    try:
        return await evaluate(args.benchmark, engine_generate(engine), concurrency=max(1, args.max_batch_size), **common)
    finally:
        engine.stop()


def main(argv: list[str]) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _validate_args(parser, args)
    try:
        report = asyncio.run(_evaluate_cli(args))
    except EvalError as exc:
        print(f"eval: {exc}", file=sys.stderr)
        return 2
    out = results_path(args)
    write_problem_results(out, report)
    summary = report.summary()
    print(
        f"{args.benchmark}: mean@{report.k} = {report.mean_at_k:.4f} ± {report.stderr:.4f}, pass@{report.k} = "
        f"{report.pass_at_k:.4f} ({report.num_problems} problems, {report.num_samples} samples, "
        f"{report.timed_out} timed out, {report.skipped_too_long} skipped as too long for the model's context, "
        f"{report.seconds:.1f}s)"
    )
    print(json.dumps({**summary, "results_file": str(out)}))
    return 0
