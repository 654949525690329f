"""`python -m rl_core eval --model DIR --benchmark math500`: a model (in process, or a running
server) scored on a benchmark, per-problem lines written, the summary printed."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from rl_core.config.benchmarks import BENCHMARKS
from rl_core.config.run_config import DEFAULT_SHARED_DATA_DIR
from rl_core.common.contracts import SamplingParams
from rl_core.evaluation.evaluator import PROMPT_TEMPLATES, EvalError, EvalReport, engine_generate, evaluate, write_problem_results


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
        from rl_core.inference.client import InferenceClient

        async with InferenceClient(args.server) as client:
            return await evaluate(args.benchmark, client.generate, **common)
    import torch

    from rl_core.inference.engine import EngineConfig, ReferenceEngine

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
