"""Evaluation: benchmarks, mean@k / pass@k with a standard error, per-problem results.

The core (`evaluate`) only needs an async `generate(messages, sampling, n)`
returning `n` `GenerationResult`s, so the same code scores a model in-process
(`engine_generate`, the reference engine) or through inference servers during
a run (`rl_core.inference.client.InferenceClient.generate` has exactly that signature).

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

import asyncio
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Mapping

from rl_core.config.benchmarks import BENCHMARKS, Benchmark
from rl_core.config.run_config import DEFAULT_SHARED_DATA_DIR, EvalConfig, TaskConfig
from rl_core.common.contracts import EVAL_PRIORITY, TOOL_TOKEN_VERSION, GenerationResult, SamplingParams
from rl_core.envs.rewards import RewardResult, VerifierPool, score_many
from rl_core.rundir.layout import EVAL_DIR, EVALS_FILE
from rl_core.envs.problems import MATH_SYSTEM_PROMPT, Problem, load_jsonl_problems, load_task

if TYPE_CHECKING:
    from rl_core.envs.environments import Environment
    from rl_core.envs.trajectories import ContinueFn, TrajectoryRunner

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
    # Per sample: whether it called a tool; None where the env has no tool (not recorded).
    samples_used_tool: list[bool] | None = None

    @property
    def used_tool(self) -> bool | None:
        """Whether any of its samples called a tool (None: a single-turn env, not recorded)."""
        return None if self.samples_used_tool is None else any(self.samples_used_tool)

    @property
    def mean(self) -> float:
        return sum(self.verdicts) / len(self.verdicts) if self.verdicts else 0.0

    @property
    def passed(self) -> bool:
        return any(self.verdicts)

    def to_json(self) -> dict[str, Any]:
        line = {
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
        if self.samples_used_tool is not None:  # a tool env's evaluation; a single-turn line stays as it was
            line.update(used_tool=self.used_tool, samples_used_tool=self.samples_used_tool)
        return line


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
    runner: TrajectoryRunner | None = None,
    continue_turn: ContinueFn | None = None,
    env: Environment | None = None,
) -> EvalReport:
    """Sample `k` responses per problem through `generate`, grade them, and aggregate. With a
    `runner` (a multi-turn env) each response is continued into its trajectory through
    `continue_turn` (tool calls, further turns) and graded on what the model wrote; `env`
    grades instead of math-verify directly (a custom env's reward)."""
    if runner is not None and continue_turn is None:
        raise EvalError("evaluate: a trajectory runner needs continue_turn (how a trajectory's next turn is generated)")
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
                stop=runner.env.stop_texts(0) if runner is not None else [],  # a first turn stops where its call ends
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
        answers = texts
        used_tool: list[bool] | None = None
        versions = {v for output in outputs for v in output.token_versions}
        truncated = sum(output.finish_reason == "length" for output in outputs)
        if runner is not None:
            assert continue_turn is not None
            trajectories = await asyncio.gather(*(runner.complete(output, continue_turn, params) for output in outputs))
            # The sample shown is the whole transcript (tool output included); the answer is
            # looked for in what the model wrote.
            texts = [runner.codec.decode(t.token_ids) for t in trajectories]
            answers = [t.model_text for t in trajectories]
            used_tool = [t.tool_calls > 0 for t in trajectories]
            versions = {v for t in trajectories for v in t.token_versions if v != TOOL_TOKEN_VERSION}
            truncated = sum(t.finish_reason == "length" for t in trajectories)
        # Grading runs math-verify in worker processes; keep the event loop free meanwhile.
        if env is not None:
            graded: list[RewardResult] = await asyncio.to_thread(env.score, problem, answers)
        else:
            graded = await asyncio.to_thread(score_many, [(text, problem.answer) for text in answers], reward_timeout_s, pool)
        return ProblemResult(
            problem_id=problem.id,
            problem=problem.problem,
            answer=problem.answer,
            samples=texts,
            extracted=[g.extracted for g in graded],
            verdicts=[g.success for g in graded],
            timed_out=sum(g.timed_out for g in graded),
            policy_versions=sorted(versions),
            truncated=truncated,
            samples_used_tool=used_tool,
        )

    results = await asyncio.gather(*(one(problem) for problem in problems))
    return EvalReport(benchmark=benchmark, k=k, results=list(results), seconds=time.monotonic() - started)


def engine_generate(engine: Any) -> GenerateFn:
    """A `generate` over an in-process `rl_core.inference.engine.ReferenceEngine` (started by the caller)."""
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
    runner: TrajectoryRunner | None = None,
    continue_turn: ContinueFn | None = None,
) -> dict[str, float]:
    """Every benchmark of a run's `eval` section at one trainer step; returns the metrics logged.
    A multi-turn run's `runner` lets the policy use its tool there too (graded by math-verify: a
    benchmark's answers are math, whatever reward the run trains on)."""
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
            runner=runner,
            continue_turn=continue_turn,
        )
        write_report(run_dir, step, report, metrics_sink)
        metrics.update(report.metrics())
    return metrics
