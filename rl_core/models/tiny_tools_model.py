"""`python -m rl_core bootstrap-tiny-tools [DIR]`: the tiny demo policy for math with a Python tool.

The tools demo (examples/tiny-cpu-tools.yaml, issue 34) needs a policy that has *seen* a tool call
but does not yet know when one pays, on a task where working the answer out is hard for it. The
task is products of two 2-digit numbers (`TOOLS_TASK`): the tiny model cannot multiply 84 * 54 in
its head, but `print(84 * 54)` in the sandbox can. This variant starts from the built tiny model
(`rl_core/models/tiny_model.py`: its tokenizer, its arithmetic and its `\\boxed{}` habit) and is
warm-started further on a corpus that mixes two kinds of answer, as the base recipe mixes guesses
and worked solutions:

- mostly a one-line product blurted from memory (`84 * 54 = 4520`, the answer plus a uniform offset
  within `guess_spread`: right about 1 time in 7 when the model knows the product that well, which
  it does not: near 0 held-out);
- sometimes (`tool_share`) a tool call in the environment's own fenced format, the sandbox's output
  (context: masked out of the loss, never imitated), then the answer copied from it.

Both kinds begin by copying the two operands, so every example trains the copying a tool call
needs. The model ends up calling the tool in about one sample in five and getting held-out
problems right about as often; reward alone must teach it that the call pays (the tool share and
held-out success rise together: bench/tools.py's learning part, bench/RESULTS.md).

The call's text and the output's format come from `MathPythonToolEnvironment` (the run's own
parser and formatter), so the warm start imitates exactly what a run parses and shows back.
`bootstrap.json` records the base model, the recipe, the task and the measured behaviour.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from rl_core.config.run_config import (
    DEFAULT_TINY_MODEL_DIR,
    DEFAULT_TINY_TOOLS_MODEL_DIR,
    RunConfig,
    TaskConfig,
)
from rl_core.envs.environments import MathPythonToolEnvironment
from rl_core.envs.problems import Problem, build_messages, load_task, synthetic_problems
from rl_core.envs.sandbox import ToolResult
from rl_core.models.tiny_model import IM_END, _batch_loss, ensure_tiny_model, is_built

TOOLS_SYSTEM_PROMPT = "Solve the problem. You may run Python in a ```python block. Put the final answer in \\boxed{}."
# Products of two 2-digit numbers: 8,100 problems, 64 held out (never in the warm start).
TOOLS_TASK = TaskConfig(min_operand=10, max_operand=99, num_terms=2, operators=["*"], heldout_size=64,
                        system_prompt=TOOLS_SYSTEM_PROMPT)


@dataclass
class ToolsWarmStartSpec:
    """The variant's warm start: a fixed number of AdamW steps on the mixed corpus, from the base model."""

    max_steps: int = 400  # the operands are copied right in ~85% of calls by then
    batch_size: int = 32
    lr: float = 1e-3  # 3e-4 had not learnt to copy the operands after 300 steps
    warmup_steps: int = 20
    tool_share: float = 0.25  # fraction of targets that call the tool
    guess_spread: int = 3  # a blurted product is the answer plus a uniform offset in [-spread, spread]
    pool_size: int = 4000  # training problems drawn from the task (held-out ones excluded)
    eval_samples_per_problem: int = 4  # first turns sampled per held-out problem when measuring behaviour
    eval_problems: int = 64


def _operands(problem: Problem) -> tuple[int, int]:
    left, right = problem.meta["operands"]
    return int(left), int(right)


def tool_call_text(problem: Problem) -> str:
    """The call the warm start shows for `problem`: the environment's fenced format."""
    left, right = _operands(problem)
    return f"```python\nprint({left} * {right})\n```"


def warm_start_segments(problem: Problem, rng: random.Random, spec: ToolsWarmStartSpec,
                        env: MathPythonToolEnvironment) -> list[tuple[str, bool]]:
    """The target for `problem` as (text, trained) segments; the tool's output is not trained on,
    exactly as a run's trainer masks it (its text is the env's formatter applied to what the
    sandbox prints for the call)."""
    left, right = _operands(problem)
    if rng.random() < spec.tool_share:
        call = env.on_model_turn(tool_call_text(problem), tool_calls=0)
        assert call is not None, "the env no longer parses the warm start's call"
        printed = ToolResult(status="ok", stdout=f"{problem.answer}\n", stderr="", seconds=0.0, exit_code=0)
        return [(tool_call_text(problem), True), (env.tool_output_text(call, printed), False),
                (f"\\boxed{{{problem.answer}}}{IM_END}", True)]
    guess = int(problem.answer) + rng.randint(-spec.guess_spread, spec.guess_spread)
    return [(f"{left} * {right} = {guess}\n\\boxed{{{guess}}}{IM_END}", True)]


def encode_example(tokenizer, problem: Problem, segments: list[tuple[str, bool]]) -> tuple[list[int], list[int]]:
    """(input ids, labels): the chat prompt and untrained segments labelled -100."""
    prompt = tokenizer.apply_chat_template(build_messages(problem, TOOLS_TASK.system_prompt), add_generation_prompt=True,
                                           tokenize=True, return_dict=False)
    ids, labels = list(prompt), [-100] * len(prompt)
    for text, trained in segments:
        tokens = tokenizer.encode(text, add_special_tokens=False)
        ids += tokens
        labels += tokens if trained else [-100] * len(tokens)
    return ids, labels


def _environment() -> MathPythonToolEnvironment:
    config = RunConfig.model_validate({"task": TOOLS_TASK.model_dump(), "env": {"name": "math_python_tool", "max_turns": 1}})
    return MathPythonToolEnvironment(config)


def warm_start(model, tokenizer, spec: ToolsWarmStartSpec, seed: int, log=print) -> dict:
    env = _environment()
    heldout = {problem.id for problem in env.task.heldout}
    pool = synthetic_problems(TOOLS_TASK, spec.pool_size, stream="tools-warm-start", exclude=heldout)
    rng = random.Random(f"{seed}:tools-warm-start")
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.0, betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(1.0, (step + 1) / max(1, spec.warmup_steps))
        * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / max(1, spec.max_steps))))),
    )
    losses: list[float] = []
    model.train()
    for step in range(1, spec.max_steps + 1):
        batch = [rng.choice(pool) for _ in range(spec.batch_size)]
        loss = _batch_loss(model, [encode_example(tokenizer, p, warm_start_segments(p, rng, spec, env)) for p in batch],
                           tokenizer.pad_token_id)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if step % 50 == 0 or step == spec.max_steps:
            log(f"tools warm start step {step}: loss {sum(losses[-50:]) / len(losses[-50:]):.3f}")
    model.eval()
    return {"steps": spec.max_steps, "final_loss": sum(losses[-20:]) / max(1, len(losses[-20:])), "train_problems": len(pool)}


@torch.no_grad()
def describe_first_turns(model, tokenizer, problems: list[Problem], samples_per_problem: int, seed: int) -> dict[str, float]:
    """How the model opens a held-out problem at temperature 1.0: how often with a tool call, and
    how often with the right call (the operands copied). Success itself is the run's step-0
    held-out point: it needs the sandbox and the second turn, which only a run has."""
    torch.manual_seed(seed)
    prompts = [build_messages(p, TOOLS_TASK.system_prompt) for p in problems for _ in range(samples_per_problem)]
    expected = [tool_call_text(p) for p in problems for _ in range(samples_per_problem)]
    encoded = tokenizer.apply_chat_template(prompts, add_generation_prompt=True, padding=True, return_tensors="pt", return_dict=True)
    output = model.generate(**encoded, do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=24,
                            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(output[:, encoded["input_ids"].shape[1]:], skip_special_tokens=True)
    calls = sum(text.startswith("```python") for text in texts)
    right = sum(text.startswith(call) for text, call in zip(texts, expected))
    return {"tool_call_share": calls / max(1, len(texts)), "right_call_share": right / max(1, len(texts)), "samples": len(texts)}


def build_tiny_tools_model(out_dir: str | Path, *, base: str | Path = DEFAULT_TINY_MODEL_DIR, seed: int = 0,
                           spec: ToolsWarmStartSpec | None = None, threads: int | None = None, log=print) -> Path:
    """Build the variant into `out_dir` (replacing it) from the tiny model at `base` (built first if
    missing). Assembled beside it and renamed into place: a reader never sees half a model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir, spec = Path(out_dir), spec or ToolsWarmStartSpec()
    base = Path(ensure_tiny_model(base, log=log)) if Path(base).resolve() == Path(DEFAULT_TINY_MODEL_DIR).resolve() else Path(base)
    previous_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    started = time.time()
    try:
        tokenizer = AutoTokenizer.from_pretrained(base)
        model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
        trained = warm_start(model, tokenizer, spec, seed, log=log)
        heldout = load_task(TOOLS_TASK).heldout[: spec.eval_problems]
        behaviour = describe_first_turns(model, tokenizer, heldout, spec.eval_samples_per_problem, seed)
        log(f"held-out first turns at temperature 1.0: {behaviour}")
        base_record = json.loads((base / "bootstrap.json").read_text()) if (base / "bootstrap.json").is_file() else {}
        record = {
            "variant": "tools",
            "seed": seed,
            "base": {"path": str(base.resolve()), "seed": base_record.get("seed"), "num_parameters": base_record.get("num_parameters")},
            "architecture": "Qwen2ForCausalLM",
            "num_parameters": sum(p.numel() for p in model.parameters()),
            "warm_start": {"recipe": asdict(spec), **trained, "task": TOOLS_TASK.model_dump(mode="json"),
                           "heldout_first_turns_temperature_1": behaviour},
            "build_seconds": round(time.time() - started, 1),
        }
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = out_dir.parent / f".{out_dir.name}.building-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        (staging / "bootstrap.json").write_text(json.dumps(record, indent=2) + "\n")
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
    finally:
        torch.set_num_threads(previous_threads)
    return out_dir


def ensure_tiny_tools_model(path: str | Path, *, seed: int = 0, log=print) -> Path:
    """The variant at `path`, built first if missing. Safe to call from many processes at once."""
    path = Path(path)
    if is_built(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the second caller waits, then finds it built
        if not is_built(path):
            build_tiny_tools_model(path, seed=seed, threads=max(1, min(2, os.cpu_count() or 1)), log=log)
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_core bootstrap-tiny-tools", description=__doc__.split("\n")[0])
    parser.add_argument("dir", nargs="?", default=DEFAULT_TINY_TOOLS_MODEL_DIR, help=f"Output directory (default {DEFAULT_TINY_TOOLS_MODEL_DIR}).")
    parser.add_argument("--base", default=DEFAULT_TINY_MODEL_DIR, help=f"The tiny model to start from (default {DEFAULT_TINY_MODEL_DIR}; built first if missing).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the warm start.")
    parser.add_argument("--steps", type=int, default=ToolsWarmStartSpec.max_steps, help="Warm-start steps (fewer: a quicker, weaker model).")
    parser.add_argument("--force", action="store_true", help="Rebuild even if DIR already holds a model.")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for the warm start.")
    args = parser.parse_args(argv)
    if args.seed < 0 or args.steps < 1:
        print("--seed must be >= 0 and --steps >= 1", file=sys.stderr)
        return 2
    if is_built(args.dir) and not args.force:
        print(f"{args.dir} already holds a model (use --force to rebuild)")
        return 0
    if not Path(args.base).exists() and Path(args.base).resolve() != Path(DEFAULT_TINY_MODEL_DIR).resolve():
        print(f"--base {args.base} does not exist", file=sys.stderr)
        return 2
    log = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    spec = ToolsWarmStartSpec(max_steps=args.steps)
    path = build_tiny_tools_model(args.dir, base=args.base, seed=args.seed, spec=spec, threads=args.threads, log=log)
    record = json.loads((path / "bootstrap.json").read_text())
    print(json.dumps({"path": str(path), "build_seconds": record["build_seconds"],
                      **record["warm_start"]["heldout_first_turns_temperature_1"]}))
    return 0
