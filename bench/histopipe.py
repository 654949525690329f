"""HistoPipe: sync-mode rollout step time with length-aware routing over least-loaded routing.

A sync step sends a batch of prompt groups to `--servers` inference servers and waits for the
slowest server. Least-loaded routing (the default) balances the *number* of groups; HistoPipe
(`HistoPipeRouter`) predicts each group's length from the prompt's previous epoch, launches
longest-first and places each group on the server with the least predicted work (greedy LPT).

Real parts: every server's share of a step is decoded by a real reference engine on the tiny
model, with `--slots` sequences per server (a server that is full, as a real one is when its KV
memory is), and the routers are the ones the actor uses. Synthesised, said in the output:
response lengths (the long-tailed profile of `bench/tail_batching.py`, enforced with
`max_new_tokens` and EOS disabled, because the tiny model's answers are uniformly short), and
the parallelism: this box has 2 shared cores, so the servers' shares run one after the other and
the step time is the *largest* share's CPU time — what it would be with each server on its own
device. A prompt keeps its length profile across epochs (new per-response noise each epoch).

    .venv/bin/python bench/histopipe.py       # ~2-4 min on the 2-core CPU sandbox (--smoke: seconds)

Ends with `RESULT histopipe_speedup <least-loaded step time / HistoPipe step time>`.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time


from benchlib import REPO_ROOT, LengthProfile, parse_bench_args, prepare_model, prompt_tokens  # first: it puts the checkout on sys.path

from rl_core.config.run_config import DEFAULT_TINY_MODEL_DIR  # noqa: E402
from rl_core.common.contracts import SamplingParams  # noqa: E402
from rl_core.inference.engine import EngineConfig, ReferenceEngine  # noqa: E402
from rl_core.actor.scheduling import HistoPipeRouter, LeastLoadedRouter, LengthPredictor, Router, assign_batch, load_spread  # noqa: E402


def run_server_share(engine: ReferenceEngine, share: list[str], lengths: dict[str, list[int]]) -> tuple[float, int]:
    """Decode one server's groups (in launch order) to the end; returns (CPU seconds, tokens)."""
    started = time.process_time()
    futures = []
    for prompt_id in share:
        for key, length in enumerate(lengths[prompt_id]):
            futures.append(engine.submit(prompt_tokens(prompt_id, engine.vocab_size), SamplingParams(max_new_tokens=length, seed=key)))
    tokens = sum(len(future.result(timeout=600).token_ids) for future in futures)
    return time.process_time() - started, tokens


def run_step(engine: ReferenceEngine, router: Router, prompts: list[str], lengths: dict[str, list[int]], args) -> dict:
    placement = assign_batch(router, prompts, args.group_size, [0.0] * args.servers)  # the actor's placement
    shares: list[list[str]] = [[] for _ in range(args.servers)]
    for prompt_id, server in placement:
        shares[server].append(prompt_id)
    seconds, tokens = [], []
    for share in shares:
        share_seconds, share_tokens = run_server_share(engine, share, lengths)
        seconds.append(share_seconds)
        tokens.append(share_tokens)
    for prompt_id, _ in placement:
        router.observe(prompt_id, lengths[prompt_id])
    metrics = router.metrics()
    return {"step_s": max(seconds), "server_s": seconds, "server_tokens": tokens, "metrics": metrics}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(REPO_ROOT / DEFAULT_TINY_MODEL_DIR), help="HF model dir (tiny model built if missing).")
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=4, help="Sequences a server decodes at once.")
    parser.add_argument("--batch-prompts", type=int, default=16, help="Prompt groups per step.")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=4, help="Epoch 1 fills the history (untimed); the rest are timed.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--length-scale", type=float, default=1.0, help="Every synthesised response length times this (the profile's shape kept).")
    args = parse_bench_args(parser, {"servers": 2, "slots": 2, "batch_prompts": 4, "group_size": 2, "epochs": 2, "length_scale": 0.25}, argv)
    model = prepare_model(args)
    profile = LengthProfile.scaled(args.length_scale, seed=args.seed)
    prompts = [f"p{index}" for index in range(args.batch_prompts)]

    routers: dict[str, Router] = {"least-loaded": LeastLoadedRouter(), "histopipe": HistoPipeRouter(LengthPredictor(prior_len=64))}
    started = time.time()
    rows = []
    totals = {name: 0.0 for name in routers}
    with ReferenceEngine(model, None, config=EngineConfig(max_batch_size=args.slots, seed=args.seed)) as engine:
        warm = [engine.submit(prompt_tokens("warm", engine.vocab_size), SamplingParams(max_new_tokens=min(200, profile.max_len))) for _ in range(args.slots)]
        for future in warm:
            future.result(timeout=600)
        for epoch in range(args.epochs):
            lengths = {p: [profile.length(p, key, epoch) for key in range(args.group_size)] for p in prompts}
            order = list(prompts)
            random.Random(f"{args.seed}:order:{epoch}").shuffle(order)  # the data loader's shuffle
            if epoch == 0:
                # The first epoch only gives HistoPipe its history; both routers see the same lengths.
                for router in routers.values():
                    for prompt_id in order:
                        router.pick(prompt_id, args.group_size, [0.0] * args.servers)
                        router.observe(prompt_id, lengths[prompt_id])
                    router.metrics()
                continue
            names = list(routers) if epoch % 2 else list(reversed(routers))
            for name in names:
                result = run_step(engine, routers[name], order, lengths, args)
                totals[name] += result["step_s"]
                rows.append((epoch, name, result))

    print(
        f"\nHistoPipe vs least-loaded: {args.servers} servers x {args.slots} slots, {args.batch_prompts} groups x "
        f"{args.group_size} responses per step, {time.time() - started:.0f}s total.\nDecoding is real (reference engine, "
        "tiny model); response lengths are synthesised (long-tailed profile, EOS disabled) and the servers' shares\n"
        "run one after the other on this 2-core box: step time = the largest share's CPU seconds, as with one device per server."
    )
    print(f"{'epoch':>6} {'router':<14}{'step s':>8}{'spread':>8}{'pred~actual':>12}  per-server tokens / CPU s")
    for epoch, name, result in rows:
        correlation = result["metrics"].get("sched/predicted_vs_actual_len", float("nan"))
        shares = "  ".join(f"{t}/{s:.1f}" for t, s in zip(result["server_tokens"], result["server_s"]))
        print(f"{epoch:>6} {name:<14}{result['step_s']:>8.2f}{load_spread(result['server_tokens']):>8.2f}{correlation:>12.2f}  {shares}")
    print(f"{'total':>6} {'least-loaded':<14}{totals['least-loaded']:>8.2f}")
    print(f"{'total':>6} {'histopipe':<14}{totals['histopipe']:>8.2f}")
    print(f"RESULT histopipe_speedup {totals['least-loaded'] / totals['histopipe']:.3f}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
