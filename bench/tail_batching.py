"""RollPacker tail batching: sync-mode rollout time per trained prompt, with the switch over without.

Real parts: the reference engine decodes every request on the tiny model (continuous
batching, real per-step cost that grows with the batch), the `TailBatchPlanner` plans the
rounds and real aborts stop the requests a short round does not keep.

Synthesised part, said in the output: response *lengths*. The tiny model answers arithmetic in
a few dozen tokens, so there is no long tail to cut. Each response's length is drawn instead
from a long-tailed profile (most prompts short, some long; per-response noise with an occasional
runaway) and enforced by the request's `max_new_tokens` with end-of-sequence disabled, so the
engine really decodes exactly that many tokens. A prompt's length is a property of the prompt,
so a deferred prompt is long again in its long round — the case tail batching is built for.

The prompts come from a fixed set of `--prompt-set` ids, drawn `--epochs` times over (RL trains
several epochs on its data, which is what lets history help): with `defer_from_history` (the
default), from its second epoch on a prompt that was long-tail last time goes straight to the
long-tail queue instead of being launched in a short round only to be cut, and a prompt it knows
as short that a short round cut anyway (over-provisioning always cuts some) retries in the next
short round instead of taking a long round's slot. Three modes run
interleaved: without tail batching; RollPacker as published (1.25x prompts and 1.25x responses,
no history); and the switch as shipped (1.25x prompts, history deferral, and no response
over-provisioning — keeping a group's first finishers biases training towards short answers,
see bench/tail_batching_bias.py).

    .venv/bin/python bench/tail_batching.py      # ~3 min on the 2-core CPU sandbox (--smoke: seconds)

A small prompt set is a small sample of the profile (40 prompts hold 6 long ones, and by chance
no short round of theirs draws three): the default 96 prompts x 3 epochs is ~3 minutes.

Ends with `RESULT tail_batching_speedup <baseline CPU time per trained prompt / tail-batched>` (CPU time: see
the note the script prints; the switch as shipped), plus the wall-clock, decode-step and token
ratios and `tail_batching_speedup_rollpacker` / `tail_batching_step_ratio_rollpacker` (as published).
"""

from __future__ import annotations

import argparse
import math
import os
import queue
import sys
import time

import torch

from benchlib import REPO_ROOT, LengthProfile, parse_bench_args, prepare_model, prompt_tokens  # first: it puts the checkout on sys.path

from rl_core.config.run_config import DEFAULT_TINY_MODEL_DIR, TailBatchingConfig  # noqa: E402
from rl_core.common.contracts import SamplingParams  # noqa: E402
from rl_core.inference.engine import EngineConfig, ReferenceEngine  # noqa: E402
from rl_core.actor.tail_batching import TailBatchPlanner, TailRound  # noqa: E402


def run_round(engine: ReferenceEngine, round_: TailRound, profile: LengthProfile, attempts: dict[str, int]) -> tuple[float, float]:
    """Launch the round on the engine, feed finish events to it in finish order, abort what is
    left once it is done; returns (wall seconds, process CPU seconds) until every request has resolved."""
    events: queue.Queue = queue.Queue()
    futures = {}
    vocab = engine.vocab_size
    started = time.perf_counter()
    cpu_started = time.process_time()
    for prompt_id in round_.prompt_ids:
        attempt = attempts.get(prompt_id, 0)
        attempts[prompt_id] = attempt + 1
        for key in range(round_.responses_per_prompt):
            request_id = f"r{round_.index}:{prompt_id}:{key}"
            params = SamplingParams(temperature=1.0, max_new_tokens=profile.length(prompt_id, key, attempt), seed=key)
            future = engine.submit(prompt_tokens(prompt_id, vocab), params, request_id=request_id)
            future.add_done_callback(lambda f, p=prompt_id, k=key: events.put((p, k, f)))
            futures[request_id] = future
    resolved = 0
    aborted: set[str] = set()
    while resolved < len(futures):
        prompt_id, key, future = events.get(timeout=600)
        resolved += 1
        result = future.result()
        if result.finish_reason == "abort":
            continue
        round_.on_response(prompt_id, key, len(result.token_ids))
        # As the actor does: a prompt that has its G responses stops its surplus ones at once
        # (they would otherwise decode, for nothing, until the round is done), and once the
        # round is done every request still running stops.
        for done_prompt in round_.prompts_to_abort():
            if done_prompt in aborted:
                continue
            aborted.add(done_prompt)
            for other_key in range(round_.responses_per_prompt):
                request_id = f"r{round_.index}:{done_prompt}:{other_key}"
                if not futures[request_id].done():
                    engine.abort(request_id)
    return time.perf_counter() - started, time.process_time() - cpu_started


class ModeRunner:
    """One mode (tail batching on or off): its own planner and engine, run round by round so
    the two modes can be interleaved — a busy shared machine then slows both alike."""

    def __init__(self, model: torch.nn.Module, config: TailBatchingConfig, args: argparse.Namespace, profile: LengthProfile) -> None:
        self.planner = TailBatchPlanner(args.batch_prompts, args.group_size, config)
        self.profile = profile
        # Every (prompt, epoch) to train, in order; each mode trains all of them.
        self.to_draw = [(f"p{index}", epoch) for epoch in range(args.epochs) for index in range(args.prompt_set)]
        self.epoch_of: dict[str, int] = {}  # drawn prompt -> its epoch, until trained
        slots = math.ceil(args.batch_prompts * config.prompt_overprovision) * math.ceil(args.group_size * config.response_overprovision)
        self.engine = ReferenceEngine(model, None, config=EngineConfig(max_batch_size=max(slots, 1), seed=args.seed)).start()
        self.attempts: dict[str, int] = {}
        self.trained: list[tuple[str, int]] = []
        self.rows: list[tuple] = []
        self.total_s = 0.0
        self.total_cpu_s = 0.0
        self.decode_steps = 0
        self.decoded_tokens = 0  # every token the engine generated, kept or later aborted
        self.finished = False

    def draw(self, count: int) -> list[str]:
        """The next prompts of the epoch-by-epoch pass over the prompt set. A prompt still waiting
        (long-tail queue or retry) from its previous epoch keeps its place in line until it is
        trained, so every mode trains every (prompt, epoch) exactly once."""
        out: list[str] = []
        for entry in list(self.to_draw):
            if len(out) >= count:
                break
            prompt_id, epoch = entry
            if prompt_id in self.epoch_of or prompt_id in out:
                continue
            self.to_draw.remove(entry)
            self.epoch_of[prompt_id] = epoch
            out.append(prompt_id)
        return out

    def warm_up(self, requests: int = 8, max_new_tokens: int = 300) -> None:
        """One untimed round of short requests: first-call costs must not land on round 0."""
        futures = [self.engine.submit(prompt_tokens(f"w{i}", self.engine.vocab_size),
                                      SamplingParams(max_new_tokens=min(max_new_tokens, self.profile.max_len)))
                   for i in range(requests)]
        for future in futures:
            future.result(timeout=600)

    def next_round(self) -> bool:
        """Run one round; False once this mode has drawn every epoch and drained its queue."""
        if self.finished:
            return False
        # Once every epoch is drawn the long-tail queue is drained, so every mode is charged for
        # every prompt it started.
        exhausted = not self.to_draw
        round_ = self.planner.plan_flush_round() if exhausted else self.planner.plan_round(self.draw)
        if round_ is not None and not round_.prompt_ids:
            self.planner.close_round(round_)
            round_ = self.planner.plan_flush_round()
        if round_ is None:
            self.finished = True
            self.engine.stop()
            return False
        steps_before = self.engine.counters["steps"]
        tokens_before = self.engine.counters["generated_tokens"]
        seconds, cpu_seconds = run_round(self.engine, round_, self.profile, self.attempts)
        steps = int(self.engine.counters["steps"] - steps_before)
        self.decoded_tokens += int(self.engine.counters["generated_tokens"] - tokens_before)
        outcome = self.planner.close_round(round_)
        self.trained.extend((prompt_id, self.epoch_of.pop(prompt_id)) for prompt_id in outcome.kept)
        assert len(self.trained) == len(set(self.trained)), "a prompt was trained twice in one epoch"
        self.total_s += seconds
        self.total_cpu_s += cpu_seconds
        self.decode_steps += steps
        self.rows.append((round_.index, round_.kind, len(round_.prompt_ids), len(outcome.kept), outcome.aborted, len(self.planner.long_tail), steps, seconds, cpu_seconds))
        return True

    def summary(self) -> dict:
        prompts = max(1, len(self.trained))
        return {
            "prompts": len(self.trained),
            "total_s": self.total_s,
            "total_cpu_s": self.total_cpu_s,
            "s_per_prompt": self.total_s / prompts,
            "cpu_s_per_prompt": self.total_cpu_s / prompts,
            "steps_per_prompt": self.decode_steps / prompts,
            "tokens_per_prompt": self.decoded_tokens / prompts,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=str(REPO_ROOT / DEFAULT_TINY_MODEL_DIR), help="HF model dir (tiny model built if missing).")
    parser.add_argument("--batch-prompts", type=int, default=8, help="Prompts per trained batch (B).")
    parser.add_argument("--group-size", type=int, default=4, help="Responses per prompt (G).")
    parser.add_argument("--prompt-set", type=int, default=96, help="Distinct prompts, drawn once per epoch.")
    parser.add_argument("--epochs", type=int, default=3, help="Passes over the prompt set (then the queue is drained).")
    parser.add_argument("--prompt-overprovision", type=float, default=TailBatchingConfig().prompt_overprovision,
                        help="Both tail-batching modes.")
    parser.add_argument("--rollpacker-response-overprovision", type=float, default=1.25,
                        help="Responses per prompt of the RollPacker-as-published mode (the shipped default is "
                        f"{TailBatchingConfig().response_overprovision}: see bench/tail_batching_bias.py).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--length-scale", type=float, default=1.0, help="Every synthesised response length times this (the profile's shape kept).")
    args = parse_bench_args(parser, {"batch_prompts": 2, "group_size": 2, "prompt_set": 4, "epochs": 1, "length_scale": 0.25}, argv)
    model = prepare_model(args)
    profile = LengthProfile.scaled(args.length_scale, seed=args.seed)

    started = time.time()
    modes = {
        "without": TailBatchingConfig(enabled=False),
        "RollPacker as published": TailBatchingConfig(
            enabled=True, prompt_overprovision=args.prompt_overprovision,
            response_overprovision=args.rollpacker_response_overprovision, defer_from_history=False,
        ),
        "tail batching (shipped)": TailBatchingConfig(enabled=True, prompt_overprovision=args.prompt_overprovision),
    }
    runners = {label: ModeRunner(model, config, args, profile) for label, config in modes.items()}
    for runner in runners.values():
        # --smoke: 2 requests of 16 tokens already pay each engine's first-call costs; the default
        # warm-up (8 x up to 300 tokens, three engines) decoded more than the smoke's rounds did.
        runner.warm_up(*((2, 16) if args.smoke else ()))
    while any([runner.next_round() for runner in runners.values()]):
        pass
    for label, runner in runners.items():
        assert len(runner.trained) == args.prompt_set * args.epochs, f"{label}: {len(runner.trained)} prompts trained"
    print(
        "\nTail batching (RollPacker), sync rounds on the reference engine. Decoding is real; response lengths are "
        "synthesised\n(long-tailed profile, enforced via max_new_tokens with EOS disabled) because the tiny model's "
        f"answers have no long tail.\nB={args.batch_prompts} prompts x G={args.group_size} responses, "
        f"over-provision {args.prompt_overprovision}x prompts (both) / {args.rollpacker_response_overprovision}x "
        f"responses (RollPacker as published; shipped: {modes['tail batching (shipped)'].response_overprovision}x), "
        f"{args.prompt_set} prompts x {args.epochs} epochs, modes interleaved round by round, "
        f"{time.time() - started:.0f}s total, load average {os.getloadavg()[0]:.1f}"
    )
    for label, runner in runners.items():
        print(f"\n{label}:")
        print(f"{'round':>6}{'kind':>7}{'launched':>9}{'kept':>6}{'aborted':>9}{'queue':>7}{'steps':>7}{'wall s':>8}{'cpu s':>8}")
        for index, kind, launched, kept, aborted, queued, steps, seconds, cpu_seconds in runner.rows:
            print(f"{index:>6}{kind:>7}{launched:>9}{kept:>6}{aborted:>9}{queued:>7}{steps:>7}{seconds:>8.2f}{cpu_seconds:>8.2f}")
    figures = {label: runner.summary() for label, runner in runners.items()}
    print(f"\n{'mode':<28}{'prompts':>8}{'wall s':>9}{'cpu s':>8}{'wall s/prompt':>15}{'cpu s/prompt':>14}{'steps/prompt':>14}{'tokens/prompt':>15}")
    for label, row in figures.items():
        print(
            f"{label:<28}{row['prompts']:>8}{row['total_s']:>9.2f}{row['total_cpu_s']:>8.2f}"
            f"{row['s_per_prompt']:>15.3f}{row['cpu_s_per_prompt']:>14.3f}{row['steps_per_prompt']:>14.1f}"
            f"{row['tokens_per_prompt']:>15.1f}"
        )
    print(
        "Where the time goes: a step of this engine costs a fixed overhead plus a share per running sequence, so\n"
        "tail batching saves the steps a round spends waiting on its tail, but pays for every token it decodes and\n"
        "then drops (surplus responses, and the partial answers of deferred prompts, redone in a long round).\n"
        "The shipped mode launches no surplus responses, and its history keeps known-long prompts out of short rounds."
    )
    print(
        "Rollout time is taken as process CPU seconds: with one torch thread, CPU time equals wall time on an idle\n"
        "machine, while on the 2 shared cores wall time mostly measures the neighbours' load (wall ratio shown too)."
    )
    base, tail, published = figures["without"], figures["tail batching (shipped)"], figures["RollPacker as published"]
    print(f"RESULT tail_batching_wall_speedup {base['s_per_prompt'] / tail['s_per_prompt']:.3f}")
    print(f"RESULT tail_batching_step_ratio {base['steps_per_prompt'] / tail['steps_per_prompt']:.3f}")
    print(f"RESULT tail_batching_token_ratio {tail['tokens_per_prompt'] / base['tokens_per_prompt']:.3f}")
    print(f"RESULT tail_batching_speedup_rollpacker {base['cpu_s_per_prompt'] / published['cpu_s_per_prompt']:.3f}")
    print(f"RESULT tail_batching_step_ratio_rollpacker {base['steps_per_prompt'] / published['steps_per_prompt']:.3f}")
    print(f"RESULT tail_batching_speedup {base['cpu_s_per_prompt'] / tail['cpu_s_per_prompt']:.3f}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
