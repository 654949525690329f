"""Reference engine vs Hugging Face `generate()` on the same mixed-length batch.

32 prompts of different lengths, each with its own token budget and the
model's EOS. Budgets are long-tailed like RL response lengths (log-uniform
16..256: many short answers, a few long ones). The engine gets every request with its own budget and batches
them continuously; HF gets the same 32 prompts as one left-padded batch with
the largest budget (its only way to serve a batch) and is credited only with
the tokens each request asked for. Same model, same process, one thread on a CPU.

    .venv/bin/python bench/engine_throughput.py [--prompts 32] [--repeats 2] [--smoke]
        [--shape tiny|125m|qwen2.5-0.5b|...] [--device cpu|cuda] [--dtype float32|bfloat16] [--model DIR]

The model is a randomly initialised `--shape` (rl_core/models/model_shapes.py) unless `--model` names
one. Both sides decode greedily; in float32 on a CPU they produce the same tokens (checked), in
bf16 or on a GPU their kernels round differently, so each is credited with its own tokens.

Ends with `RESULT engine_speedup_vs_hf <ratio>` (goal >= 2).
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rl_core.common.contracts import SamplingParams
from rl_core.inference.engine import EngineConfig, ReferenceEngine
from rl_core.models.model_io import model_dtype
from rl_core.models.model_shapes import add_model_shape_args, bench_dtype, model_for_bench


def make_workload(tokenizer, count: int, seed: int, max_budget: int = 256) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    workload = []
    for index in range(count):
        terms = " + ".join(str(rng.randint(0, 99)) for _ in range(rng.randint(1, 12)))
        messages = [{"role": "user", "content": f"Problem {index}: compute {terms}. Show your work."}]
        prompt = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"])
        workload.append((prompt, min(max_budget, int(16 * 2 ** rng.uniform(0, 4)))))
    return workload


def run_engine(engine: ReferenceEngine, workload: list[tuple[list[int], int]]) -> tuple[int, float]:
    started = time.perf_counter()
    futures = [engine.submit(prompt, SamplingParams(temperature=0.0, max_new_tokens=budget)) for prompt, budget in workload]
    tokens = sum(len(future.result().token_ids) for future in futures)
    return tokens, time.perf_counter() - started


def run_hf(model, tokenizer, workload: list[tuple[list[int], int]]) -> tuple[int, float]:
    width = max(len(prompt) for prompt, _ in workload)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    device = model.device
    input_ids = torch.tensor([[pad] * (width - len(prompt)) + prompt for prompt, _ in workload], device=device)
    attention_mask = torch.tensor([[0] * (width - len(prompt)) + [1] * len(prompt) for prompt, _ in workload], device=device)
    eos = model.generation_config.eos_token_id
    started = time.perf_counter()
    with torch.inference_mode():
        output = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, do_sample=False, pad_token_id=pad,
            max_new_tokens=max(budget for _, budget in workload),
        )
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # the clock stops when the device is done
    elapsed = time.perf_counter() - started
    tokens = 0
    for row, (_, budget) in enumerate(workload):
        generated = output[row, width:].tolist()[:budget]
        if eos in generated:
            generated = generated[: generated.index(eos) + 1]
        tokens += len(generated)
    return tokens, elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-budget", type=int, default=256, help="Cap of each request's token budget (16..256 drawn).")
    parser.add_argument("--smoke", action="store_true", help="8 prompts, one repeat, budgets capped at 48: seconds, the same code path.")
    add_model_shape_args(parser)
    args = parser.parse_args()
    if args.smoke:
        # Budgets capped at 48 tokens (16..48 drawn): the decode loop dominates the smoke's CPU, and
        # 48 still mixes short and long requests, which is what the engine's batching is measured on.
        args.prompts, args.repeats, args.max_budget = 8, 1, 48
    device, dtype = torch.device(args.device), bench_dtype(args)
    if device.type == "cpu":
        torch.set_num_threads(1)
    torch.manual_seed(0)

    with tempfile.TemporaryDirectory() as scratch:
        model_dir = model_for_bench(args, scratch)
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        hf_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=model_dtype(dtype), attn_implementation="sdpa").to(device).eval()
        engine = ReferenceEngine.from_pretrained(
            model_dir, device=args.device, dtype=dtype, config=EngineConfig(max_batch_size=args.prompts)).start()
        workload = make_workload(tokenizer, args.prompts, seed=0, max_budget=args.max_budget)
        run_engine(engine, workload[:4])  # warm-up both paths once
        run_hf(hf_model, tokenizer, workload[:4])
        rows = []
        for repeat in range(args.repeats):
            engine_tokens, engine_s = run_engine(engine, workload)
            hf_tokens, hf_s = run_hf(hf_model, tokenizer, workload)
            rows.append((repeat, engine_tokens, engine_s, hf_tokens, hf_s))
        engine.stop()

    print(f"model: {model_dir.name if args.model else args.shape}, {dtype} on {args.device}")
    print(f"{'repeat':>6} {'engine tok':>10} {'engine s':>9} {'engine tok/s':>12} {'hf tok':>7} {'hf s':>7} {'hf tok/s':>9} {'speedup':>8}")
    speedups = []
    for repeat, engine_tokens, engine_s, hf_tokens, hf_s in rows:
        speedup = (engine_tokens / engine_s) / (hf_tokens / hf_s)
        speedups.append(speedup)
        print(f"{repeat:>6} {engine_tokens:>10} {engine_s:>9.2f} {engine_tokens / engine_s:>12.1f} {hf_tokens:>7} {hf_s:>7.2f} {hf_tokens / hf_s:>9.1f} {speedup:>8.2f}")
    if device.type == "cpu" and dtype == "float32":
        assert all(row[1] == row[3] for row in rows), "engine and HF produced different token counts"
    print(f"RESULT engine_tokens_per_s {statistics.median(r[1] / r[2] for r in rows):.1f}")
    print(f"RESULT hf_generate_tokens_per_s {statistics.median(r[3] / r[4] for r in rows):.1f}")
    print(f"RESULT engine_speedup_vs_hf {statistics.median(speedups):.2f}")


if __name__ == "__main__":
    main()
