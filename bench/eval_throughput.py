"""Evaluation throughput: the reference engine vs a plain HF `generate()` loop, same run.

Both paths run the same evaluation — `--benchmark` (default `synthetic`, the tiny
model's held-out arithmetic set; `math500` etc. work too), `--k` samples per
problem, the same sampling settings — on the tiny model, grade with the same
math-verify rewards, and are timed wall-clock, one after the other:

- engine: `rl_core.evaluation.evaluator.evaluate` over `ReferenceEngine` (continuous batching:
  a finished sequence's slot is refilled at the next step);
- HF: the usual static-batch loop — chat-template `--batch-size // k` problems,
  `model.generate(num_return_sequences=k)`, wait for the longest, repeat.

Both get one torch thread (the box has 2 shared cores). Real parts throughout;
nothing is synthesised. Prints a table, then

    RESULT eval_problems_per_s_engine <x>
    RESULT eval_problems_per_s_hf <y>
    RESULT eval_speedup_vs_hf <x / y>

    .venv/bin/python bench/eval_throughput.py      # ~2-5 min on the 2-core CPU sandbox (--smoke: seconds)
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

import torch

from benchlib import REPO_ROOT, parse_bench_args, tiny_or_given_model  # noqa: E402  (first: it puts the checkout on sys.path)

from rl_core.config.run_config import DEFAULT_TINY_MODEL_DIR  # noqa: E402
from rl_core.common.contracts import SamplingParams  # noqa: E402
from rl_core.evaluation.evaluator import PROMPT_TEMPLATES, engine_generate, evaluate, get_benchmark, load_benchmark  # noqa: E402
from rl_core.envs.rewards import score_many  # noqa: E402


def run_engine(model_dir: Path, benchmark: str, problems, k: int, sampling: SamplingParams, batch_size: int) -> tuple[float, float]:
    from rl_core.inference.engine import EngineConfig, ReferenceEngine

    engine = ReferenceEngine.from_pretrained(model_dir, config=EngineConfig(max_batch_size=batch_size, seed=0))
    engine.start()
    try:
        started = time.perf_counter()
        report = asyncio.run(
            evaluate(benchmark, engine_generate(engine), k=k, sampling=sampling, problems=problems, concurrency=max(1, batch_size // k) * 2)
        )
        seconds = time.perf_counter() - started
    finally:
        engine.stop()
    return seconds, report.mean_at_k


def run_hf(model_dir: Path, benchmark: str, problems, k: int, sampling: SamplingParams, batch_size: int) -> tuple[float, float]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    template = PROMPT_TEMPLATES[get_benchmark(benchmark).template]
    per_batch = max(1, batch_size // k)
    torch.manual_seed(0)
    started = time.perf_counter()
    correct = 0
    for start in range(0, len(problems), per_batch):
        chunk = problems[start : start + per_batch]
        encoded = tokenizer.apply_chat_template(
            [template.messages(p) for p in chunk], add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True
        )
        with torch.no_grad():
            output = model.generate(
                **encoded,
                do_sample=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                max_new_tokens=sampling.max_new_tokens,
                num_return_sequences=k,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
        texts = tokenizer.batch_decode(output[:, encoded["input_ids"].shape[1] :], skip_special_tokens=True)
        answers = [p.answer for p in chunk for _ in range(k)]  # generate() repeats each prompt k times in a row
        correct += sum(r.success for r in score_many(list(zip(texts, answers))))
    seconds = time.perf_counter() - started
    return seconds, correct / (len(problems) * k)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(REPO_ROOT / DEFAULT_TINY_MODEL_DIR), help="Model dir (the tiny model is built there if missing).")
    parser.add_argument("--benchmark", default="synthetic")
    parser.add_argument("--problems", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=64, help="Sequences decoded together (engine slots / HF batch).")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--data-dir", default=str(REPO_ROOT.parent / "shared" / "data"))
    args = parse_bench_args(parser, smoke={"problems": 8, "k": 2, "batch_size": 16, "max_new_tokens": 16})
    torch.set_num_threads(1)

    model_dir = tiny_or_given_model(args.model)
    problems = load_benchmark(args.benchmark, args.data_dir, args.problems)
    sampling = SamplingParams(temperature=args.temperature, top_p=1.0, max_new_tokens=args.max_new_tokens, seed=0)
    score_many([("\\boxed{\\frac{1}{2}}", "0.5")])  # start the verifier worker outside the timings

    engine_s, engine_acc = run_engine(model_dir, args.benchmark, problems, args.k, sampling, args.batch_size)
    hf_s, hf_acc = run_hf(model_dir, args.benchmark, problems, args.k, sampling, args.batch_size)

    n = len(problems)
    print(f"benchmark={args.benchmark} problems={n} k={args.k} batch={args.batch_size} max_new_tokens={args.max_new_tokens} T={args.temperature}")
    print(f"{'path':<10}{'seconds':>10}{'problems/s':>12}{'mean@k':>9}")
    print(f"{'engine':<10}{engine_s:>10.2f}{n / engine_s:>12.2f}{engine_acc:>9.3f}")
    print(f"{'hf':<10}{hf_s:>10.2f}{n / hf_s:>12.2f}{hf_acc:>9.3f}")
    print(f"RESULT eval_problems_per_s_engine {n / engine_s:.3f}")
    print(f"RESULT eval_problems_per_s_hf {n / hf_s:.3f}")
    print(f"RESULT eval_speedup_vs_hf {hf_s / engine_s:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
