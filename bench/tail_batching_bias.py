"""What tail batching's selection does to the training data: success of the responses it keeps.

Tail batching keeps the first responses (and prompts) to finish. Where a response's length and its
reward are related, that is a biased sample of the policy. The tiny model is such a case: its warm
start either blurts a quick `\\boxed{guess}` (short, rarely right) or works the sum out (longer,
mostly right), so first finishers are more often guesses.

Measured on real samples (reference engine, tiny model, T=1, the demo's 48-token budget): for
`--prompts` training prompts, 2 x G responses each, all decoding together so that finish order is
length order. Three samples of the same data, each scored with the real reward:

- plain: the first G responses launched of every prompt (what is trained without tail batching);
- response-level (RollPacker's 1.25x responses): the first G of ceil(1.25 G) to finish;
- prompt-level (1.25x prompts): in rounds of ceil(1.25 B) prompts, the B prompts whose group of G
  finishes first train that group; the others train later on a fresh group (their second G).

    .venv/bin/python bench/tail_batching_bias.py      # ~2 min on the 2-core CPU sandbox (--smoke: seconds)

Ends with `RESULT tail_bias_plain_success`, `RESULT tail_bias_response_level_success`,
`RESULT tail_bias_prompt_level_success`, and the mean lengths of the first two.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from pathlib import Path

import torch

from benchlib import REPO_ROOT, parse_bench_args, tiny_or_given_model  # noqa: E402  (first: it puts the checkout on sys.path)

from rl_core.config.run_config import DEFAULT_TINY_MODEL_DIR, TaskConfig  # noqa: E402
from rl_core.common.contracts import SamplingParams  # noqa: E402
from rl_core.inference.engine import EngineConfig, ReferenceEngine  # noqa: E402
from rl_core.envs.rewards import score_many  # noqa: E402
from rl_core.envs.problems import load_task  # noqa: E402


def sample_groups(model_dir: Path, prompts: int, per_prompt: int, max_new_tokens: int) -> tuple[list[list[float]], list[list[int]]]:
    """Success and token count of `per_prompt` sampled responses for each of `prompts` training problems."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    data = load_task(TaskConfig(seed=0))
    problems = data.train[:prompts]
    with ReferenceEngine(model, tokenizer, config=EngineConfig(max_batch_size=128)) as engine:
        futures = []
        for index, problem in enumerate(problems):
            prompt = list(tokenizer.apply_chat_template(data.messages(problem), add_generation_prompt=True, tokenize=True, return_dict=False))
            params = [SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens, seed=1000 * index + j) for j in range(per_prompt)]
            futures.append([engine.submit(prompt, p) for p in params])
        results = [[future.result(timeout=1200) for future in group] for group in futures]
    successes, lengths = [], []
    for problem, group in zip(problems, results):
        scores = score_many([(result.text, problem.answer) for result in group], 5.0)
        successes.append([float(score.success) for score in scores])
        lengths.append([len(result.token_ids) for result in group])
    return successes, lengths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(REPO_ROOT / DEFAULT_TINY_MODEL_DIR), help="HF model dir (tiny model built if missing).")
    parser.add_argument("--prompts", type=int, default=160, help="Training prompts sampled.")
    parser.add_argument("--group-size", type=int, default=8, help="Responses trained per prompt (G).")
    parser.add_argument("--batch-prompts", type=int, default=8, help="Prompts per trained batch (B).")
    parser.add_argument("--overprovision", type=float, default=1.25, help="RollPacker's factor, for responses and prompts.")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=2)
    args = parse_bench_args(parser, {"prompts": 4, "group_size": 2, "batch_prompts": 2, "max_new_tokens": 16}, argv)
    torch.set_num_threads(args.threads)
    model_dir = tiny_or_given_model(args.model)
    group, launched = args.group_size, math.ceil(args.group_size * args.overprovision)
    successes, lengths = sample_groups(model_dir, args.prompts, 2 * group, args.max_new_tokens)

    plain = [s for row in successes for s in row[:group]]
    plain_len = [n for row in lengths for n in row[:group]]
    first_finished = [sorted(range(launched), key=lambda i, row=row: (row[i], i))[:group] for row in lengths]
    response_level = [successes[p][i] for p, kept in enumerate(first_finished) for i in kept]
    response_len = [lengths[p][i] for p, kept in enumerate(first_finished) for i in kept]
    prompt_level: list[float] = []
    round_size = math.ceil(args.batch_prompts * args.overprovision)
    for start in range(0, len(successes), round_size):
        members = list(range(start, min(start + round_size, len(successes))))
        kept = set(sorted(members, key=lambda p: (max(lengths[p][:group]), p))[: args.batch_prompts])
        for p in members:
            prompt_level += successes[p][:group] if p in kept else successes[p][group : 2 * group]

    print(f"\nTail batching's selection on {model_dir.name}: {args.prompts} prompts, G={group}, B={args.batch_prompts}, "
          f"over-provision {args.overprovision}x, T=1, max_new_tokens={args.max_new_tokens}")
    print(f"{'trained sample':<48}{'success':>9}{'mean tokens':>13}")
    print(f"{'plain (first G launched)':<48}{statistics.mean(plain):>9.3f}{statistics.mean(plain_len):>13.1f}")
    print(f"{f'response-level (first {group} of {launched} finished)':<48}{statistics.mean(response_level):>9.3f}{statistics.mean(response_len):>13.1f}")
    print(f"{f'prompt-level ({args.batch_prompts} of {round_size} prompts, fresh group later)':<48}{statistics.mean(prompt_level):>9.3f}")
    print("One binomial standard error of a success here is about "
          f"{math.sqrt(0.25 / len(plain)):.3f}.")
    print(f"RESULT tail_bias_plain_success {statistics.mean(plain):.3f}")
    print(f"RESULT tail_bias_response_level_success {statistics.mean(response_level):.3f}")
    print(f"RESULT tail_bias_prompt_level_success {statistics.mean(prompt_level):.3f}")
    print(f"RESULT tail_bias_plain_tokens {statistics.mean(plain_len):.1f}")
    print(f"RESULT tail_bias_response_level_tokens {statistics.mean(response_len):.1f}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    sys.exit(main())
