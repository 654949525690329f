"""One optimizer step of the product's trainer (`trainer.train_step` on the backend a run
builds, `trainer.make_backend`) at a real model shape: torch or DeepSpeed ZeRO, any device.

The batch is synthetic (random token ids, advantages +1/-1, one group per prompt): the step's
cost depends on token counts and the model, not on what the tokens say. The first step is a
warm-up (allocator, kernels, DeepSpeed's buckets); the next `--steps` are timed, the device
synchronised before each clock reading.

    .venv/bin/python bench/trainer_step.py [--backend torch|deepspeed] [--zero-stage 2]
        [--shape qwen2.5-0.5b] [--device cuda] [--dtype bfloat16] [--samples 16] [--smoke]

Ends with `RESULT trainer_step_s <s>` and `RESULT trainer_step_tokens_per_s <tokens/s>` (and the
device's peak memory on a GPU). `--smoke`: the tiny shape, 4 short samples, one timed step.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time

import torch

import benchlib  # noqa: F401  (first: it puts the checkout on sys.path)

from rl_core.config.run_config import RunConfig  # noqa: E402
from rl_core.common.contracts import RolloutSample  # noqa: E402
from rl_core.models.model_shapes import add_model_shape_args, bench_dtype, model_for_bench  # noqa: E402
from rl_core.trainer.loop import make_backend, train_step  # noqa: E402


def synthetic_batch(count: int, prompt_tokens: int, completion_tokens: int, vocab: int, seed: int) -> list[RolloutSample]:
    rng = random.Random(seed)
    samples = []
    for index in range(count):
        completion = [rng.randrange(3, vocab) for _ in range(completion_tokens)]
        advantage = 1.0 if index % 2 == 0 else -1.0
        samples.append(RolloutSample(
            sample_id=f"s{seed}-{index}", group_id=f"g{seed}-{index // 2}", prompt_id=f"p{index // 2}",
            prompt_token_ids=[rng.randrange(3, vocab) for _ in range(prompt_tokens)], completion_token_ids=completion,
            behaviour_logprobs=[-5.0] * completion_tokens, token_versions=[0] * completion_tokens,
            reward=max(0.0, advantage), success=advantage > 0, advantage=advantage,
        ))
    return samples


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_shape_args(parser, default_shape="qwen2.5-0.5b")
    parser.add_argument("--backend", default="torch", choices=["torch", "deepspeed"])
    parser.add_argument("--zero-stage", type=int, default=2, choices=[0, 1, 2, 3])
    parser.add_argument("--samples", type=int, default=16, help="Samples per step (the batch).")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--completion-tokens", type=int, default=256)
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=3, help="Timed steps after the warm-up step.")
    parser.add_argument("--smoke", action="store_true", help="The tiny shape, 4 samples of 16+16 tokens, one timed step.")
    args = parser.parse_args()
    if args.smoke:
        args.shape, args.samples, args.prompt_tokens, args.completion_tokens, args.steps = "tiny", 4, 16, 16, 1
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)

    with tempfile.TemporaryDirectory(prefix="inflight-trainer-step-") as scratch:
        model_dir = model_for_bench(args, scratch)
        config = RunConfig.model_validate({
            "model": {"path": str(model_dir), "dtype": bench_dtype(args), "build_tiny_if_missing": False},
            "trainer": {"backend": args.backend, "zero_stage": args.zero_stage, "device": args.device,
                        "gpus": 1 if device.type == "cuda" else 0, "samples_per_step": args.samples,
                        "micro_batch_tokens": args.micro_batch_tokens, "lr": 1e-6, "warmup_steps": 0,
                        "max_steps": args.steps + 1},
        })
        started = time.perf_counter()
        backend = make_backend(config, model_dir)
        load_s = time.perf_counter() - started
        from transformers import AutoConfig

        vocab = min(AutoConfig.from_pretrained(model_dir).vocab_size, 1024)  # ids the tiny tokenizer has
        train_step(backend, synthetic_batch(args.samples, args.prompt_tokens, args.completion_tokens, vocab, 0), config)
        synchronize(device)
        times, tokens = [], []
        for step in range(1, args.steps + 1):
            batch = synthetic_batch(args.samples, args.prompt_tokens, args.completion_tokens, vocab, step)
            started = time.perf_counter()
            stats, _ = train_step(backend, batch, config)
            synchronize(device)
            times.append(time.perf_counter() - started)
            tokens.append(stats.num_tokens)
    what = f"{args.backend}{f' ZeRO-{args.zero_stage}' if args.backend == 'deepspeed' else ''}"
    print(f"model: {args.model or args.shape}, {bench_dtype(args)} on {args.device}; trainer {what}; backend built in "
          f"{load_s:.1f} s; {args.samples} samples of {args.prompt_tokens}+{args.completion_tokens} tokens")
    print(f"{'step':>4} {'seconds':>9} {'trained tokens':>15}")
    for index, (seconds, count) in enumerate(zip(times, tokens), start=1):
        print(f"{index:>4} {seconds:>9.3f} {count:>15}")
    step_s = statistics.median(times)
    print(f"RESULT trainer_step_s {step_s:.3f}")
    print(f"RESULT trainer_step_tokens_per_s {statistics.median(tokens) / step_s:.1f}")
    if device.type == "cuda":
        print(f"RESULT trainer_step_peak_gpu_gib {torch.cuda.max_memory_allocated(device) / 2**30:.2f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
