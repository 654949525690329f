"""A demo training step: attention by the packed layout vs by the dense mask, and completion
starts shared (a trie per group) vs laid out whole.

Every side runs the product's `trainer.train_step` on the same optimizer batches of real demo
rollouts (the tiny model answering the demo task's prompts, `actor.group_size` samples each, one
batch of `trainer.samples_per_step` per step), one thread:

- packed: `TorchBackend` as a run builds it (attention by `MicroBatch.packed_layout`, one row per
  micro-batch: `trainer.row_tokens` unset; `trainer.share_completion_prefixes` on);
- unshared: the same with `trainer.share_completion_prefixes: false` (every completion whole);
- dense: the packed side's backend attending by the 4-D mask through sdpa, with rows of
  `DEFAULT_ROW_TOKENS` (what a backend attending by the mask would do; none does any more).

Gradients are compared too (they must agree to float rounding). Prints seconds per step,
`RESULT packed_over_dense_train_step <ratio>` and `RESULT shared_over_unshared_train_step
<ratio>` (below 1: the first is faster).

    .venv/bin/python bench/packed_attention.py [--config examples/tiny-cpu.yaml] [--steps 8] [--repeats 3] [--smoke]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from itertools import islice
from pathlib import Path

from benchlib import REPO_ROOT, parse_bench_args, smoke_demo_config  # noqa: E402  (first: it puts the checkout on sys.path)

import torch  # noqa: E402

from rl_core.envs.advantages import group_advantages  # noqa: E402
from rl_core.config.run_config import DEFAULT_ROW_TOKENS  # noqa: E402
from rl_core.config.files import load_config
from rl_core.common.contracts import RolloutSample, SamplingParams  # noqa: E402
from rl_core.inference.engine import EngineConfig, ReferenceEngine  # noqa: E402
from rl_core.envs.rewards import score_answer  # noqa: E402
from rl_core.envs.problems import load_task  # noqa: E402
from rl_core.models.tiny_model import ensure_tiny_model  # noqa: E402
from rl_core.trainer.loop import make_backend, train_step  # noqa: E402


def demo_batches(config_path: Path, steps: int) -> tuple[object, list[list[RolloutSample]]]:
    config = load_config(config_path)
    model_dir = ensure_tiny_model(REPO_ROOT / config.model.path)
    config = config.model_copy(update={"model": config.model.model_copy(update={"path": str(model_dir)})})
    task = load_task(config.task)
    group, per_step = config.actor.group_size, config.trainer.samples_per_step
    engine = ReferenceEngine.from_pretrained(model_dir, config=EngineConfig(max_batch_size=per_step, seed=config.seed)).start()
    samples: list[RolloutSample] = []
    try:
        for index, problem in islice(task.train_stream(), steps * per_step // group):
            prompt = list(engine.tokenizer.apply_chat_template(task.messages(problem), add_generation_prompt=True,
                                                               tokenize=True, return_dict=False))
            sampling = SamplingParams(temperature=config.sampling.temperature, max_new_tokens=config.sampling.max_new_tokens)
            results = engine.generate([prompt] * group, sampling)
            rewards = [score_answer(result.text, problem.answer).reward for result in results]
            advantages = group_advantages(rewards, normalize_std=config.actor.advantage == "group_mean_std")
            samples += [
                RolloutSample(sample_id=f"{index}-{k}", group_id=str(index), prompt_id=problem.id, prompt_token_ids=prompt,
                              completion_token_ids=list(r.token_ids), behaviour_logprobs=list(r.logprobs),
                              token_versions=[0] * len(r.token_ids), reward=reward, success=reward > 0, advantage=advantage)
                for k, (r, reward, advantage) in enumerate(zip(results, rewards, advantages))
            ]
    finally:
        engine.stop()
    return config, [samples[i : i + per_step] for i in range(0, len(samples), per_step)]


SIDES = ("packed", "unshared", "dense")


def time_steps(config, batches: list[list[RolloutSample]], side: str) -> tuple[float, torch.Tensor]:
    dense = side == "dense"
    if dense:
        config = config.model_copy(update={"trainer": config.trainer.model_copy(update={"row_tokens": DEFAULT_ROW_TOKENS})})
    if side == "unshared":
        config = config.model_copy(update={"trainer": config.trainer.model_copy(update={"share_completion_prefixes": False})})
    backend = make_backend(config, config.model.path)
    if dense:
        backend.model.set_attn_implementation("sdpa")
    backend.optimizer_step = lambda: {}  # the same weights every step: both sides compute the same thing
    train_step(backend, batches[0], config)  # warm-up (oneDNN primitive caches)
    started = time.process_time()
    for batch in batches:
        backend.model.zero_grad(set_to_none=True)
        train_step(backend, batch, config)
    seconds = (time.process_time() - started) / len(batches)
    return seconds, torch.cat([p.grad.flatten() for p in backend.model.parameters() if p.grad is not None])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="examples/tiny-cpu.yaml", help="Run config YAML.")
    parser.add_argument("--steps", type=int, default=8, help="Optimizer batches timed per side.")
    parser.add_argument("--repeats", type=int, default=3, help="Timed passes per side, alternating (best kept).")
    args = parse_bench_args(parser, smoke={"steps": 1, "repeats": 1})
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench-packed-") as scratch:
        # --smoke: the demo's config at its smallest settings (benchlib.SMOKE_DEMO_OVERRIDES: 16 samples a step).
        config_path = smoke_demo_config(Path(scratch), REPO_ROOT / args.config) if args.smoke else REPO_ROOT / args.config
        config, batches = demo_batches(config_path, args.steps)
    tokens = sum(len(s.completion_token_ids) for batch in batches for s in batch) / len(batches)
    print(f"{len(batches)} batches of {len(batches[0])} demo rollouts, {tokens:.0f} completion tokens each")
    best = {side: float("inf") for side in SIDES}
    grads: dict[str, torch.Tensor] = {}
    for repeat in range(args.repeats):
        for side in SIDES if repeat % 2 == 0 else SIDES[::-1]:
            seconds, grads[side] = time_steps(config, batches, side)
            best[side] = min(best[side], seconds)
            print(f"[{side} #{repeat}] {seconds:.3f} CPU-s per step", flush=True)
    for side in ("unshared", "dense"):
        difference = float((grads["packed"] - grads[side]).abs().max() / grads[side].abs().max())
        print(f"last batch's gradients, packed vs {side}: max difference {difference:.1e} of the largest entry")
    for side in SIDES:
        print(f"RESULT {side}_train_step_s {best[side]:.3f}")
    print(f"RESULT packed_over_dense_train_step {best['packed'] / best['dense']:.3f}")
    print(f"RESULT shared_over_unshared_train_step {best['packed'] / best['unshared']:.3f}")


if __name__ == "__main__":
    main()
