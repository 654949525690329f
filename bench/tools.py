"""Multi-turn rollouts with a Python tool (issue 34): what tool calls cost the actor, and how much
of a continuation's prompt the reference engine does not recompute.

1. Overlap. `--trajectories` trajectories at once through `envs/trajectories.TrajectoryRunner`, each
   making `--calls` real sandbox calls (`envs/sandbox.ProcessSandbox`, a process per call forked from its warm launcher,
   `--code` as the tool's work), the model's turns answered at once by a scripted stand-in (so the
   figure is the tool path's own). Sequential cost = the calls' summed seconds; wall time = what the
   actor waits. `tools_overlap_speedup` = sequential / wall: how far awaiting the sandbox lets
   trajectories overlap (bounded by the sandbox's `max_concurrent` and the cores).
2. Call cost. `--cost-calls` calls of a demo-sized tool call (`print(84 * 54)`), `--max-concurrent`
   at a time, through the sandbox as the actor gets it (each call forked from a warm launcher) and
   with a launcher started per call (the fallback where warm launchers do not serve), one after the
   other: the machine's busy CPU (/proc/stat, so anything else running counts too) and the wall
   time per call, the launchers' start left out. `tool_call_cpu_cold_over_warm` = the ratio.
3. Prefix reuse. A real reference server (tiny model): a group of G first turns, then G
   continuations sent together as token prompts (prompt + model tokens + a tool output), as the
   actor sends them; the server's `prompt_tokens_shared` counter against the continuations' prompt
   tokens says how much prefill the engine skipped, and `prompt_tokens_retained` how much of it
   came from the finished turns' own K/V, kept for their continuations (`multiturn_prefix_reuse`;
   the rest is a prompt prefix shared with other sequences cached at the current weights).

4. Learning. The tools demo as a user runs it: `python -m rl_core run examples/tiny-cpu-tools.yaml`
   on its model variant (rl_core/models/tiny_tools_model.py, built at var/models/tiny-tools if
   missing), then the same config with `env.name=math` (the same task and model, no tool: a call
   the policy writes is not run). `tools_heldout_gain` = the run's last held-out point minus its
   step-0 point; `tools_vs_notools_final` = the tools run's last held-out point minus the no-tool
   run's. `tool_overhead_share` = the mean of the run's `tool/wait_share` (wall time with a call
   running and no generation request of the actor in flight, over the window's wall time: the
   actor waits on the tool); `tool_busy_share` = the mean of `tool/busy_share` (wall time with at
   least one call running, decoding of other samples or not: this figure was `tool_overhead_share`
   until 2026-11-28); `tools_decode_tokens_per_s_ratio` = the
   tools run's mean `rollout/tokens_per_s` over the no-tool run's. Under `--smoke` the variant is
   a one-step build and only the tools run runs, at the demo benches' smoke settings.

    .venv/bin/python bench/tools.py [--trajectories 16] [--calls 2] [--group 8] [--learning-steps 40]

RESULT lines: tool_call_seconds_mean, tools_sequential_s, tools_wall_s, tools_overlap_speedup,
tool_wait_share (ToolClock busy time over wall), tool_call_cpu_ms_warm, tool_call_cpu_ms_cold,
tool_call_cpu_cold_over_warm, tool_call_wall_ms_warm, tool_call_wall_ms_cold, continuation_prompt_tokens,
continuation_prefill_tokens_saved, continuation_prefill_saved_share, multiturn_prefix_reuse; tools_heldout_start,
tools_heldout_final, tools_heldout_gain, tool_call_share_start, tool_call_share_final,
notools_heldout_final, tools_vs_notools_final, tool_overhead_share, tool_busy_share,
tools_decode_tokens_per_s_ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import REPO_ROOT, SMOKE_DEMO_OVERRIDES, parse_bench_args, run_cli, start_reference_server, tiny_or_given_model  # noqa: E402

from rl_core.common.contracts import GenerationResult, SamplingParams  # noqa: E402
from rl_core.common.metric_names import TOOL_BUSY_SHARE, TOOL_WAIT_SHARE  # noqa: E402
from rl_core.config.run_config import DEFAULT_TINY_MODEL_DIR, DEFAULT_TINY_TOOLS_MODEL_DIR, RunConfig  # noqa: E402
from rl_core.envs.environments import MathPythonToolEnvironment  # noqa: E402
from rl_core.envs.sandbox import ProcessSandbox, SandboxLimits  # noqa: E402
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
            "tool_wait_share": min(1.0, clock.take().busy_s / wall)}


def _busy_cpu_s() -> float:
    """CPU seconds the whole machine has spent busy (not idle, not waiting on I/O) since boot."""
    with open("/proc/stat", encoding="ascii") as stat:
        ticks = [int(field) for field in stat.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


async def call_cost(args: argparse.Namespace) -> dict[str, float]:
    results: dict[str, float] = {}
    limits = SandboxLimits()
    for mode in ("warm", "cold"):
        sandbox = ProcessSandbox(max_concurrent=args.max_concurrent, warm=mode == "warm")
        # Started once per run in the product: the launchers' start is not a call's cost.
        await asyncio.gather(*(sandbox.run("pass", limits) for _ in range(args.max_concurrent)))
        if mode == "warm" and not sandbox.warm:
            print("call cost: warm launchers do not serve on this machine (not root?): both figures are per-call launchers")
        cpu, started = _busy_cpu_s(), time.monotonic()
        done = await asyncio.gather(*(sandbox.run("print(84 * 54)", limits) for _ in range(args.cost_calls)))
        wall, cpu = time.monotonic() - started, _busy_cpu_s() - cpu
        await sandbox.aclose()
        assert {(result.status, result.stdout) for result in done} == {("ok", "4536\n")}, done[0]
        results[f"tool_call_cpu_ms_{mode}"] = 1000 * cpu / args.cost_calls
        results[f"tool_call_wall_ms_{mode}"] = 1000 * statistics.fmean(result.seconds for result in done)
    results["tool_call_cpu_cold_over_warm"] = results["tool_call_cpu_ms_cold"] / results["tool_call_cpu_ms_warm"]
    return results


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
            before = (await client.health())["counters"]
            prompts = [first.prompt_token_ids + first.token_ids + tool for first in firsts]
            continuation = SamplingParams(temperature=1.0, max_new_tokens=args.next_tokens)
            await asyncio.gather(*(client.generate([], continuation, prompt_token_ids=p) for p in prompts))
            after = (await client.health())["counters"]
    finally:
        server.stop()
    total = sum(len(p) for p in prompts)
    saved = after["prompt_tokens_shared"] - before["prompt_tokens_shared"]
    retained = after["prompt_tokens_retained"] - before["prompt_tokens_retained"]
    return {"continuation_prompt_tokens": float(total), "continuation_prefill_tokens_saved": float(saved),
            "continuation_prefill_saved_share": saved / total, "multiturn_prefix_reuse": retained / total}


TOOLS_CONFIG = REPO_ROOT / "examples" / "tiny-cpu-tools.yaml"


def _series(records: list[dict], name: str) -> list[float]:
    return [float(record[name]) for record in records if name in record]


def _tenths(values: list[float]) -> list[list[float]]:
    size = max(1, len(values) // 10)
    return [values[start:start + size] for start in range(0, len(values), size)]


def learning(args: argparse.Namespace, scratch: Path) -> dict[str, float]:
    from rl_core.models.tiny_tools_model import ToolsWarmStartSpec, build_tiny_tools_model, ensure_tiny_tools_model

    if args.smoke:  # the variant's code path at one step, into the scratch folder (the real one takes minutes)
        model = build_tiny_tools_model(scratch / "tiny-tools", base=tiny_or_given_model(args.model), threads=2, log=lambda _: None,
                                       spec=ToolsWarmStartSpec(max_steps=1, batch_size=4, eval_problems=1, eval_samples_per_problem=1))
        overrides = [*SMOKE_DEMO_OVERRIDES]
    else:
        model = Path(args.tools_model)
        if model.resolve() == (REPO_ROOT / DEFAULT_TINY_TOOLS_MODEL_DIR).resolve():
            model = ensure_tiny_tools_model(model)
        overrides = [f"trainer.max_steps={args.learning_steps}"]
    overrides += [f"model.path={model}", f"seed={args.seed}"]
    tools = run_cli(TOOLS_CONFIG, scratch / "tools", overrides)
    heldout, calls = _series(tools, "success/heldout"), _series(tools, "tool/call_share")
    window = max(1, len(calls) // 10)  # a tenth of the run's points at each end: one point is one group's noise
    results = {"tools_heldout_start": heldout[0], "tools_heldout_final": heldout[-1], "tools_heldout_gain": heldout[-1] - heldout[0],
               "tool_call_share_start": statistics.fmean(calls[:window]), "tool_call_share_final": statistics.fmean(calls[-window:]),
               "tool_overhead_share": statistics.fmean(_series(tools, TOOL_WAIT_SHARE)),
               "tool_busy_share": statistics.fmean(_series(tools, TOOL_BUSY_SHARE))}
    print(f"tools run: held-out {' '.join(f'{value:.3f}' for value in heldout)}; tool/call_share by tenths of the run "
          f"{' '.join(f'{statistics.fmean(part):.2f}' for part in _tenths(calls))}", flush=True)
    if not args.smoke:
        plain = run_cli(TOOLS_CONFIG, scratch / "notools", [*overrides, "env.name=math"])
        plain_heldout = _series(plain, "success/heldout")
        print(f"no-tool run: held-out {' '.join(f'{value:.3f}' for value in plain_heldout)}", flush=True)
        decoding = [value for value in _series(tools, "rollout/tokens_per_s") if value > 0]
        plain_decoding = [value for value in _series(plain, "rollout/tokens_per_s") if value > 0]
        results.update({"notools_heldout_final": plain_heldout[-1], "tools_vs_notools_final": heldout[-1] - plain_heldout[-1],
                        "tools_decode_tokens_per_s_ratio": statistics.fmean(decoding) / statistics.fmean(plain_decoding)})
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_TINY_MODEL_DIR, help="Model directory (its tokenizer; the server's model).")
    parser.add_argument("--trajectories", type=int, default=16, help="Trajectories running at once.")
    parser.add_argument("--calls", type=int, default=2, help="Tool calls per trajectory (env.max_turns).")
    parser.add_argument("--max-concurrent", type=int, default=4, help="The sandbox's concurrent calls.")
    parser.add_argument("--code", default="print(sum(i * i for i in range(200_000)))", help="Each call's Python.")
    parser.add_argument("--cost-calls", type=int, default=64, help="Calls of the call-cost part, per mode.")
    parser.add_argument("--group", type=int, default=8, help="Continuations sent together (a group).")
    parser.add_argument("--first-tokens", type=int, default=24, help="First turn's tokens.")
    parser.add_argument("--next-tokens", type=int, default=8, help="Continuation's tokens.")
    parser.add_argument("--tools-model", default=DEFAULT_TINY_TOOLS_MODEL_DIR, help="The tools demo's model (its variant, built there if missing).")
    parser.add_argument("--learning-steps", type=int, default=40, help="Optimizer steps of each learning run (the example's 40).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the learning runs.")
    args = parse_bench_args(parser, {"trajectories": 4, "calls": 1, "cost_calls": 8, "group": 4, "first_tokens": 12,
                                     "next_tokens": 4}, argv)
    model = tiny_or_given_model(args.model)
    results = asyncio.run(overlap(args, model))
    results.update(asyncio.run(call_cost(args)))
    results.update(asyncio.run(prefix_reuse(args, model)))
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as scratch:
        results.update(learning(args, Path(scratch)))
    for name, value in results.items():
        print(f"RESULT {name} {value:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
