"""Evaluation: metrics arithmetic, run-dir layout, a real engine, a real HTTP server, the CLI."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from rl_core.config.benchmarks import BENCHMARKS
from rl_core.common.contracts import GenerationResult, SamplingParams
from rl_core.evaluation.evaluator import PROMPT_TEMPLATES, EvalError, engine_generate, evaluate, load_benchmark, write_report
from rl_core.envs.problems import Problem

PROBLEMS = [Problem(id=f"p{i}", problem=f"Compute {i} + {i}.", answer=str(2 * i)) for i in range(4)]


def scripted_generate(answers_by_problem: dict[str, list[str]]):
    """A generate function that replays fixed responses: it tests the scoring and
    aggregation arithmetic exactly (the real engine is exercised in the tests below)."""
    calls: list[tuple[list[dict], SamplingParams, int]] = []

    async def generate(messages: list[dict], sampling: SamplingParams, n: int) -> list[GenerationResult]:
        calls.append((messages, sampling, n))
        problem_text = messages[-1]["content"]
        texts = answers_by_problem[problem_text][:n]
        return [
            GenerationResult(request_id=f"r{j}", prompt_token_ids=[1], token_ids=[2], logprobs=[-0.1],
                             token_versions=[3 + (j % 2)], finish_reason="stop", text=text)
            for j, text in enumerate(texts)
        ]

    return generate, calls


def test_mean_pass_and_stderr_are_computed_per_problem() -> None:
    # Correct counts per problem out of k=4: 4, 2, 0, 1 (one sample has no box, one is \frac form).
    responses = {
        "Compute 0 + 0.": ["\\boxed{0}"] * 4,
        "Compute 1 + 1.": ["\\boxed{2}", "\\boxed{\\frac{4}{2}}", "\\boxed{3}", "two"],
        "Compute 2 + 2.": ["\\boxed{5}"] * 4,
        "Compute 3 + 3.": ["\\boxed{6}", "\\boxed{7}", "no idea", "\\boxed{}"],
    }
    generate, calls = scripted_generate(responses)
    report = asyncio.run(evaluate("synthetic", generate, k=4, problems=PROBLEMS, sampling=SamplingParams(temperature=0.7)))
    means = [1.0, 0.5, 0.0, 0.25]
    assert [r.mean for r in report.results] == means
    assert report.mean_at_k == pytest.approx(sum(means) / 4)
    assert report.pass_at_k == pytest.approx(0.75)
    mean = sum(means) / 4
    assert report.stderr == pytest.approx(math.sqrt(sum((m - mean) ** 2 for m in means) / 3 / 4))
    assert report.num_problems == 4 and report.num_samples == 16 and report.policy_versions == [3, 4]
    assert report.results[1].extracted == ["2", "\\frac{4}{2}", "3", None]
    # Every problem asked for k samples, with the tiny template and a per-problem seed.
    assert all(n == 4 for _, _, n in calls)
    assert calls[0][0][0] == {"role": "system", "content": PROMPT_TEMPLATES["tiny"].system}
    assert len({params.seed for _, params, _ in calls}) == 4
    assert all(params.temperature == 0.7 for _, params, _ in calls)


def test_write_report_follows_the_run_dir_layout(tmp_path: Path) -> None:
    generate, _ = scripted_generate({p.problem: [f"\\boxed{{{p.answer}}}", "\\boxed{-1}"] for p in PROBLEMS})
    report = asyncio.run(evaluate("synthetic", generate, k=2, problems=PROBLEMS))
    write_report(tmp_path, 10, report)
    write_report(tmp_path, 20, report)
    lines = [json.loads(line) for line in (tmp_path / "evals.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [10, 20]
    first = lines[0]
    assert first["results_file"] == "eval/step_000010_synthetic.jsonl"
    assert {"t", "step", "benchmark", "k", "mean_at_k", "pass_at_k", "stderr", "num_problems", "num_samples",
            "policy_versions", "results_file"} <= set(first)
    assert first["mean_at_k"] == 0.5 and first["pass_at_k"] == 1.0 and first["num_samples"] == 8
    rows = [json.loads(line) for line in (tmp_path / first["results_file"]).read_text().splitlines()]
    assert [row["problem_id"] for row in rows] == ["p0", "p1", "p2", "p3"]
    assert rows[1] == {"problem_id": "p1", "problem": "Compute 1 + 1.", "answer": "2", "samples": ["\\boxed{2}", "\\boxed{-1}"],
                       "extracted": ["2", "-1"], "verdicts": [True, False], "mean": 0.5, "pass": True,
                       "skipped": None}
    assert set(report.metrics()) == {"eval/synthetic/mean_at_k", "eval/synthetic/pass_at_k",
                                     "eval/synthetic/stderr", "eval/synthetic/timed_out", "eval/synthetic/skipped_too_long"}


def test_timed_out_checks_score_zero_and_are_counted() -> None:
    generate, _ = scripted_generate({PROBLEMS[1].problem: ["\\boxed{9^{9^{9^{9}}}}", "\\boxed{2}"]})
    report = asyncio.run(evaluate("synthetic", generate, k=2, problems=[PROBLEMS[1]], reward_timeout_s=1.0))
    assert report.results[0].verdicts == [False, True]
    assert report.timed_out == 1 and report.summary()["timed_out"] == 1


def test_benchmarks_load_from_the_shared_data(shared_data_dir: Path) -> None:
    assert len(load_benchmark("math500", shared_data_dir)) == 500
    assert len(load_benchmark("aime24", shared_data_dir)) == 30
    assert len(load_benchmark("aime25", shared_data_dir)) == 30
    assert len(load_benchmark("gsm8k", shared_data_dir, max_problems=10)) == 10
    assert BENCHMARKS["aime24"].default_k == 16 and BENCHMARKS["math500"].default_k == 4
    with pytest.raises(EvalError, match="unknown benchmark 'mathx'"):
        load_benchmark("mathx", shared_data_dir)
    with pytest.raises(EvalError, match="data file not found"):
        load_benchmark("math500", shared_data_dir / "nowhere")


def test_evaluate_with_the_reference_engine(untrained_tiny_model: Path, shared_data_dir: Path) -> None:
    from rl_core.inference.engine import ReferenceEngine

    engine = ReferenceEngine.from_pretrained(untrained_tiny_model)
    engine.start()
    try:
        generate = engine_generate(engine)
        sampling = SamplingParams(temperature=1.0, max_new_tokens=8, seed=5)
        first = asyncio.run(evaluate("math500", generate, k=2, sampling=sampling, max_problems=3, data_dir=shared_data_dir))
        again = asyncio.run(evaluate("math500", generate, k=2, sampling=sampling, max_problems=3, data_dir=shared_data_dir))
    finally:
        engine.stop()
    assert first.num_problems == 3 and first.num_samples == 6
    assert all(len(r.samples) == 2 and len(r.verdicts) == 2 for r in first.results)
    assert first.mean_at_k == 0.0  # random weights do not solve MATH-500
    assert first.policy_versions == [0]
    # Seeded per problem: the same samples whatever order requests finish in.
    assert [r.samples for r in first.results] == [r.samples for r in again.results]


def test_a_problem_too_long_for_the_engine_is_skipped_counted_and_reported(untrained_tiny_model: Path, tmp_path: Path) -> None:
    """One problem whose prompt + max_new_tokens exceeds the engine's context must not sink the
    evaluation: it is skipped (said per problem and in the summary) and the rest is scored."""
    from rl_core.inference.engine import EngineConfig, ReferenceEngine

    long_problem = Problem(id="long", problem="Compute 1 + 1. " * 80, answer="2")
    problems = [PROBLEMS[0], long_problem, PROBLEMS[1], PROBLEMS[2]]
    engine = ReferenceEngine.from_pretrained(untrained_tiny_model, config=EngineConfig(max_seq_len=160))
    engine.start()
    try:
        report = asyncio.run(evaluate("synthetic", engine_generate(engine), k=2, problems=problems,
                                      sampling=SamplingParams(temperature=1.0, max_new_tokens=8, seed=3)))
    finally:
        engine.stop()
    assert [r.problem_id for r in report.results] == ["p0", "long", "p1", "p2"]
    skipped = report.results[1]
    assert skipped.skipped == "too_long" and skipped.samples == [] and skipped.verdicts == []
    assert all(r.skipped is None and len(r.samples) == 2 for r in report.results if r.problem_id != "long")
    # The aggregates are over the scored problems; the skipped one is counted apart.
    assert report.num_problems == 3 and report.num_samples == 6
    summary = report.summary()
    assert summary["skipped_too_long"] == 1 and summary["num_problems"] == 3
    assert report.metrics()["eval/synthetic/skipped_too_long"] == 1.0
    line = write_report(tmp_path, 0, report)
    assert line["skipped_too_long"] == 1
    rows = {row["problem_id"]: row for row in map(json.loads, (tmp_path / line["results_file"]).read_text().splitlines())}
    assert rows["long"]["skipped"] == "too_long" and rows["long"]["samples"] == []
    assert rows["p0"]["skipped"] is None


def test_a_server_refusing_a_too_long_prompt_skips_that_problem_only() -> None:
    """Through inference servers (a run's periodic eval), the engine's refusal arrives as the
    client's ServerError 400 with the contract's message; any other failure still fails the eval."""
    from rl_core.inference.client import ServerError

    responses = {p.problem: [f"\\boxed{{{p.answer}}}"] * 2 for p in PROBLEMS}
    replay, _ = scripted_generate(responses)

    def generate_refusing(message: str, status: int):
        async def generate(messages: list[dict], sampling: SamplingParams, n: int) -> list[GenerationResult]:
            if messages[-1]["content"] == PROBLEMS[2].problem:
                raise ServerError("http://127.0.0.1:1", f"POST /v1/chat/completions -> {status}: {message}", status)
            return await replay(messages, sampling, n)

        return generate

    too_long = "prompt (667 tokens) + max_new_tokens (512) exceeds the engine's max_seq_len 1024"
    report = asyncio.run(evaluate("synthetic", generate_refusing(too_long, 400), k=2, problems=PROBLEMS))
    assert [r.skipped for r in report.results] == [None, None, "too_long", None]
    assert report.mean_at_k == 1.0 and report.pass_at_k == 1.0 and report.summary()["skipped_too_long"] == 1
    with pytest.raises(ServerError, match="engine step failed"):
        asyncio.run(evaluate("synthetic", generate_refusing("engine step failed", 500), k=2, problems=PROBLEMS))


def test_cli_prints_the_score_and_writes_per_problem_jsonl(untrained_tiny_model: Path, shared_data_dir: Path, tmp_path: Path, repo_root: Path) -> None:
    out = tmp_path / "gsm8k.jsonl"
    command = [sys.executable, "-m", "rl_core", "eval", "--model", str(untrained_tiny_model), "--benchmark", "gsm8k",
               "--k", "2", "--max-problems", "2", "--max-new-tokens", "6", "--out", str(out), "--data-dir", str(shared_data_dir)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=repo_root, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["benchmark"] == "gsm8k" and summary["num_samples"] == 4 and summary["k"] == 2
    assert "mean@2" in done.stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [row["problem_id"] for row in rows] == ["gsm8k-test-0", "gsm8k-test-1"]
    bad = subprocess.run([sys.executable, "-m", "rl_core", "eval", "--model", str(untrained_tiny_model), "--benchmark", "nope"],
                         capture_output=True, text=True, cwd=repo_root, timeout=120)
    assert bad.returncode == 2 and "unknown 'nope'" in bad.stderr


def test_evaluate_through_a_real_inference_server(untrained_tiny_model: Path, shared_data_dir: Path, tmp_path: Path, repo_root: Path) -> None:
    from rl_core.inference.client import InferenceClient
    from rl_core.rundir.layout import parse_ready_line

    server = subprocess.Popen(
        [sys.executable, "-m", "rl_core", "serve", "--model", str(untrained_tiny_model), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=repo_root,
    )
    try:
        url = None
        assert server.stdout is not None
        for line in server.stdout:  # the server prints its URL once it listens
            url = parse_ready_line(line)
            if url is not None:
                break
        assert url and url.startswith("http://127.0.0.1:")

        async def run() -> object:
            async with InferenceClient(url) as client:
                return await evaluate("aime24", client.generate, k=3, max_problems=2, data_dir=shared_data_dir,
                                      sampling=SamplingParams(temperature=1.0, max_new_tokens=5, seed=1))

        report = asyncio.run(run())
        assert report.num_problems == 2 and report.num_samples == 6
        assert report.results[0].problem_id == "2024-I-1" and report.policy_versions == [0]
        # The CLI's --server path writes the same per-problem file.
        out = tmp_path / "aime.jsonl"
        done = subprocess.run([sys.executable, "-m", "rl_core", "eval", "--server", url, "--benchmark", "aime24", "--k", "2",
                               "--max-problems", "1", "--max-new-tokens", "4", "--out", str(out), "--data-dir", str(shared_data_dir)],
                              capture_output=True, text=True, cwd=repo_root, timeout=300)
        assert done.returncode == 0, done.stderr
        assert json.loads(out.read_text())["problem_id"] == "2024-I-1"
    finally:
        server.terminate()
        server.wait(timeout=30)
