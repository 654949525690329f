"""Multi-turn rollouts with a Python tool (issue 34): what tool calls cost the actor, and how much
of a continuation's prompt the reference engine does not recompute.

1. Overlap. `--trajectories` trajectories at once through `envs/trajectories.TrajectoryRunner`, each
   making `--calls` real sandbox calls (`envs/sandbox.ProcessSandbox`, a fresh process per call,
   `--code` as the tool's work), the model's turns answered at once by a scripted stand-in (so the
   figure is the tool path's own). Sequential cost = the calls' summed seconds; wall time = what the
   actor waits. `tools_overlap_speedup` = sequential / wall: how far awaiting the sandbox lets
   trajectories overlap (bounded by the sandbox's `max_concurrent` and the cores).
2. Prefix reuse. A real reference server (tiny model): a group of G first turns, then G
   continuations sent together as token prompts (prompt + model tokens + a tool output), as the
   actor sends them; the server's `prompt_tokens_shared` counter against the continuations' prompt
   tokens says how much prefill the engine skipped (it shares a prompt prefix with sequences still
   cached at the current weights; a finished turn's own K/V are not kept).

    .venv/bin/python bench/tools.py [--trajectories 16] [--calls 2] [--group 8]

RESULT lines: tool_call_seconds_mean, tools_sequential_s, tools_wall_s, tools_overlap_speedup,
tool_wait_share (ToolClock busy time over wall), continuation_prompt_tokens,
continuation_prefill_tokens_saved, continuation_prefill_saved_share.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import parse_bench_args, start_reference_server, tiny_or_given_model  # noqa: E402

from rl_core.common.contracts import GenerationResult, SamplingParams  # noqa: E402
from rl_core.config.run_config import DEFAULT_TINY_MODEL_DIR, RunConfig  # noqa: E402
from rl_core.envs.environments import MathPythonToolEnvironment  # noqa: E402
from rl_core.envs.sandbox import ProcessSandbox  # noqa: E402
from rl_core.envs.trajectories import HFTokenCodec, ToolClock, TrajectoryRunner  # noqa: E402
from rl_core.inference.client import InferenceClient  # noqa: E402


def scripted(codec: HFTokenCodec, prompt: list[int], text: str) -> GenerationResult:
    ids = codec.encode(text)
    return GenerationResult("bench", prompt, ids, [-1.0] * len(ids), [0] * len(ids), "stop", text)


async def overlap(args: argparse.Namespace, model: Path) -> dict[str, float]:
    config = RunConfig.model_validate({"model": {"path": str(model)}, "task": {"heldout_size": 4},
                                       "env": {"name": "math_python_tool", "max_turns": args.calls}})
    codec = HFTokenCodec.from_pretrained(str(model))
    sandbox = ProcessSandbox(max_concurrent=args.max_concurrent)
    env = MathPythonToolEnvironment(config, sandbox=sandbox)
    clock = ToolClock()
    runner = TrajectoryRunner(env, codec, clock)
    call = f"```python\n{args.code}\n```"
    prompt = codec.encode("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")

    async def generate(prompt_ids: list[int], sampling: SamplingParams) -> GenerationResult:
        # Another call while calls are left, then the answer (the env says when the turns run out).
        return scripted(codec, prompt_ids, call)

    sampling = SamplingParams(max_new_tokens=100_000)
    started = time.monotonic()
    trajectories = await asyncio.gather(*(runner.complete(scripted(codec, prompt, call), generate, sampling)
                                          for _ in range(args.trajectories)))
    wall = time.monotonic() - started
    seconds = [s for t in trajectories for s in t.tool_seconds]
    assert len(seconds) == args.trajectories * args.calls, len(seconds)
    statuses = {status for t in trajectories for status in t.tool_statuses}
    assert statuses == {"ok"}, statuses
    return {"tool_call_seconds_mean": sum(seconds) / len(seconds), "tools_sequential_s": sum(seconds),
            "tools_wall_s": wall, "tools_overlap_speedup": sum(seconds) / wall,
            "tool_wait_share": min(1.0, clock.take_busy_s() / wall)}


async def prefix_reuse(args: argparse.Namespace, model: Path) -> dict[str, float]:
    codec = HFTokenCodec.from_pretrained(str(model))
    server = start_reference_server(model, max_batch_size=max(8, 2 * args.group))
    try:
        async with InferenceClient(server.url) as client:
            messages = [{"role": "system", "content": "Solve the problem. Put the final answer in \\boxed{}."},
                        {"role": "user", "content": "Compute 17 + 25."}]
            firsts = await client.generate(messages, SamplingParams(temperature=1.0, max_new_tokens=args.first_tokens),
                                           n=args.group, prompt_id="bench-tools")
            tool = codec.encode("\n```output\n42\n```\n")
            before = (await client.health())["counters"]["prompt_tokens_shared"]
            prompts = [first.prompt_token_ids + first.token_ids + tool for first in firsts]
            continuation = SamplingParams(temperature=1.0, max_new_tokens=args.next_tokens)
            await asyncio.gather(*(client.generate([], continuation, prompt_token_ids=p) for p in prompts))
            saved = (await client.health())["counters"]["prompt_tokens_shared"] - before
    finally:
        server.stop()
    total = sum(len(p) for p in prompts)
    return {"continuation_prompt_tokens": float(total), "continuation_prefill_tokens_saved": float(saved),
            "continuation_prefill_saved_share": saved / total}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_TINY_MODEL_DIR, help="Model directory (its tokenizer; the server's model).")
    parser.add_argument("--trajectories", type=int, default=16, help="Trajectories running at once.")
    parser.add_argument("--calls", type=int, default=2, help="Tool calls per trajectory (env.max_turns).")
    parser.add_argument("--max-concurrent", type=int, default=4, help="The sandbox's concurrent calls.")
    parser.add_argument("--code", default="print(sum(i * i for i in range(200_000)))", help="Each call's Python.")
    parser.add_argument("--group", type=int, default=8, help="Continuations sent together (a group).")
    parser.add_argument("--first-tokens", type=int, default=24, help="First turn's tokens.")
    parser.add_argument("--next-tokens", type=int, default=8, help="Continuation's tokens.")
    args = parse_bench_args(parser, {"trajectories": 4, "calls": 1, "group": 4, "first_tokens": 12, "next_tokens": 4}, argv)
    model = tiny_or_given_model(args.model)
    results = asyncio.run(overlap(args, model))
    results.update(asyncio.run(prefix_reuse(args, model)))
    for name, value in results.items():
        print(f"RESULT {name} {value:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
