"""Inflight vs Hugging Face TRL's GRPOTrainer: seconds to +20 points of held-out success.

Runs both on the same run config (default examples/tiny-cpu.yaml), one after the other, on CPU:

- Inflight: the product's own code path, `.venv/bin/python -m rl_core run CONFIG --out DIR
  --set trainer.max_steps=N`, read back from DIR/metrics.jsonl (`success/heldout` lines).
- TRL: `GRPOTrainer` (trl 1.16.0) in its own venv, `.venv-trl/`, started as a subprocess of this
  file (`--trl-child`) with the repo on PYTHONPATH, so it uses rl_core's task, prompts, reward
  and held-out evaluation. The venv is created on first use; by hand it is
      python3 -m venv .venv-trl && .venv-trl/bin/pip install torch==2.13.0 && .venv-trl/bin/pip install trl==1.16.0 transformers==5.19.0 math-verify==0.9.0 'datasets>=4.7' 'pydantic>=2.7' 'pyyaml>=6'
  (torch first, pinned, so pip takes the local CPU wheel and never a CUDA build).

    .venv/bin/python bench/vs_trl.py [--config examples/tiny-cpu.yaml] [--max-steps 40] [--repeats 1] [--only trl|inflight] [--smoke]

`--smoke`: both sides on the config at its smallest settings (benchlib.SMOKE_DEMO_OVERRIDES), 2
optimizer steps each (held-out points at steps 0 and 2); the figures are those of so short a run.

Matched, read from the YAML for both: model dir and dtype, task and training prompts in
`load_task(config.task).train_stream()` order (TRL: shuffle_dataset=False), the server's chat
template (tokenizer.apply_chat_template(..., add_generation_prompt=True): identical prompt ids),
rl_core.envs.rewards scoring, group size (num_generations), samples per optimizer step
(per_device_train_batch_size, one generation batch per step, num_iterations=1: TRL is strictly
on-policy), lr with rl_core's own warm-up/schedule function (torch_backend.lr_multiplier via a
LambdaLR: HF's constant_with_warmup would give step 0 an lr of 0), AdamW as TorchBackend builds it
(torch defaults betas (0.9, 0.999), eps 1e-8, trainer.weight_decay on every parameter), grad clip,
max new tokens, temperature, top_p (top_k=0), KL coefficient (beta = trainer.kl_coef = 0: no
reference model), advantages (group_mean_std -> scale_rewards="group"), float32, seed.
Loss normalisation: Inflight sums token terms and divides by the sequences of the step.
TRL's loss_type="luspo" does exactly that ((loss * mask).sum(-1).mean() over one 64-sequence
batch, no accumulation); "dr_grpo" would divide by sequences x max_completion_length (48x smaller
gradients: grad clipping would act differently). On-policy the clipped ratio is 1, so TRL's
gradient per token is -A * grad log p, the same as Inflight's pipelinerl loss at weight 1.

What cannot match, and why:
- Inflight is asynchronous (actor.max_lag 2): its tokens may be sampled 1-2 versions behind the
  weights that train them (truncated importance weights correct for it); TRL generates, then trains.
- actor.drop_zero_advantage_groups: false in the demo, as TRL works: all-equal groups stay in the
  step (Inflight's trainer does not compute them, their gradient being exactly zero). A YAML that
  sets it true makes Inflight replace them with more prompts, which TRL cannot: the two sides then
  see the prompt stream at different rates after the first drop.
- Group std: TRL divides by the Bessel-corrected std (+1e-4), Inflight by the population std
  (+1e-6): TRL's advantages are sqrt((G-1)/G) = 0.935x Inflight's for G=8 (no switch in TRL).
- Sampling RNG: Inflight's engine seeds each request; TRL's HF generate() draws from torch's
  global generator (seeded with config.seed). Same seed value, different draws.
- Threads: TRL runs with torch.set_num_threads(2) (a synchronous trainer can give both cores to
  each phase); Inflight runs its config as the product does (1 thread per server and trainer).
- HF generate() decodes the 64 sequences as one padded batch to the longest; Inflight's
  continuous batching does not. This is a speed difference, not a learning one.

Held-out evaluation, the same code for both: rl_core.evaluation.evaluator.evaluate over the task's 64
held-out problems, k=eval.heldout_k, T=sampling temperature, seeded per problem with config.seed
(the actor's `success/heldout`). TRL: at step 0 and every eval.heldout_every_n_steps (and the last
step) the weights are saved to a temp dir and evaluated through a ReferenceEngine in the child,
with TRL's training clock paused. Inflight evaluates concurrently on its servers; that time is
in its wall clock and a point counts when its line is written (after the eval). Both favour TRL.
An Inflight point is tagged with the step it started at; in-flight updates may reach it mid-eval.

Time zero, both sides: training starts with the model loaded. Inflight: the first metrics.jsonl
line (the launcher logs it once the servers are up; the trainer and actor start then, so their
start-up counts). TRL: the trainer's on_train_begin. +20 points: the first held-out point >= that
side's step-0 held-out + 0.20. Ends with `RESULT <name> <value>` lines (medians over --repeats).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
INFLIGHT_PYTHON = REPO / ".venv" / "bin" / "python"
TRL_VENV = REPO / ".venv-trl"
TRL_PYTHON = TRL_VENV / "bin" / "python"
TRL_PACKAGES = ["trl==1.16.0", "transformers==5.19.0", "math-verify==0.9.0", "datasets>=4.7", "pydantic>=2.7", "pyyaml>=6"]
GAIN = 0.20

Curve = list[tuple[int, float, float]]  # (step, seconds since time zero, success/heldout)


# --- the TRL side (runs inside .venv-trl) --------------------------------------------


def trl_child(config_path: str, max_steps: int, out_json: str) -> None:
    import asyncio
    import shutil
    from itertools import islice

    import torch

    torch.set_num_threads(2)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rl_core.config.files import load_config
    from rl_core.common.contracts import SamplingParams
    from rl_core.inference.engine import EngineConfig, ReferenceEngine
    from rl_core.evaluation.evaluator import PromptTemplate, engine_generate, evaluate
    from rl_core.models.model_io import model_dtype
    from rl_core.envs.rewards import score_many
    from rl_core.envs.problems import load_task
    from rl_core.trainer.torch_backend import lr_multiplier

    config = load_config(config_path)
    t, e = config.trainer, config.eval
    model_dir = Path(config.model.path)
    model_dir = model_dir if model_dir.is_absolute() else REPO / model_dir
    group = config.actor.group_size
    if t.samples_per_step % group:
        raise SystemExit("trainer.samples_per_step must be a multiple of actor.group_size")
    task = load_task(config.task)
    # The prompts Inflight's actor draws, in its order; TRL repeats each one num_generations times.
    prompts = [problem for _, problem in islice(task.train_stream(), max_steps * t.samples_per_step // group)]
    dataset = Dataset.from_list([{"prompt": task.messages(p), "answer": p.answer} for p in prompts])

    def reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [r.reward for r in score_many(list(zip(texts, answer)), config.task.reward_timeout_s)]

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=model_dtype(config.model.dtype))
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    # AdamW and the LR factor exactly as rl_core.trainer.torch_backend.TorchBackend builds them.
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=t.lr, weight_decay=t.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_multiplier(step, t.warmup_steps, t.schedule, max_steps))
    heldout_t = config.sampling.temperature if e.heldout_temperature is None else e.heldout_temperature

    class HeldoutClock(TrainerCallback):
        """Held-out evals at Inflight's steps, with the training clock stopped while they run."""

        def __init__(self) -> None:
            self.t0 = 0.0
            self.paused = 0.0
            self.curve: Curve = []
            self.steps: list[tuple[int, float]] = []

        def clock(self) -> float:
            return time.monotonic() - self.t0 - self.paused

        def evaluate(self, step: int, policy: Any) -> None:
            started = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="vs-trl-weights-") as tmp:
                policy.save_pretrained(tmp, safe_serialization=True)
                for side_file in model_dir.iterdir():  # tokenizer + chat template: a servable model dir
                    if side_file.is_file() and side_file.suffix != ".safetensors" and not (Path(tmp) / side_file.name).exists():
                        shutil.copy2(side_file, Path(tmp) / side_file.name)
                engine = ReferenceEngine.from_pretrained(tmp, dtype=config.model.dtype, config=EngineConfig(
                    max_batch_size=config.inference.max_batch_size, seed=config.seed)).start()
                try:
                    report = asyncio.run(evaluate(
                        "heldout", engine_generate(engine), k=e.heldout_k, problems=task.heldout,
                        sampling=SamplingParams(temperature=heldout_t, top_p=config.sampling.top_p,
                                                max_new_tokens=config.sampling.max_new_tokens),
                        template=PromptTemplate(system=config.task.system_prompt),
                        reward_timeout_s=config.task.reward_timeout_s, concurrency=len(task.heldout), seed=config.seed))
                finally:
                    engine.stop()
            self.paused += time.monotonic() - started
            self.curve.append((step, self.clock(), report.mean_at_k))
            print(f"trl: step {step} success/heldout {report.mean_at_k:.3f} at {self.clock():.1f}s", flush=True)

        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
            self.t0 = time.monotonic()
            self.evaluate(0, model)  # clock paused: time zero stays the start of training

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
            step = state.global_step
            self.steps.append((step, self.clock()))
            every = e.heldout_every_n_steps
            if (every and step % every == 0) or step == args.max_steps:
                self.evaluate(step, model)

    args = GRPOConfig(
        output_dir=str(Path(out_json).parent / "trl-output"),
        per_device_train_batch_size=t.samples_per_step, gradient_accumulation_steps=1, num_generations=group,
        num_iterations=1, max_steps=max_steps, max_completion_length=config.sampling.max_new_tokens,
        temperature=config.sampling.temperature, top_p=config.sampling.top_p, top_k=0,
        beta=t.kl_coef, loss_type="luspo", importance_sampling_level="token", mask_truncated_completions=False,
        scale_rewards="group" if config.actor.advantage == "group_mean_std" else "none",
        learning_rate=t.lr, weight_decay=t.weight_decay, max_grad_norm=t.grad_clip, seed=config.seed,
        shuffle_dataset=False, bf16=False, fp16=False, use_cpu=True, gradient_checkpointing=False,
        logging_steps=1, report_to=[], save_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
    )
    clock = HeldoutClock()
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, optimizers=(optimizer, scheduler), callbacks=[clock])
    trainer.train()
    Path(out_json).write_text(json.dumps({"curve": clock.curve, "steps": clock.steps, "eval_s_excluded": clock.paused}))


def ensure_trl_venv() -> None:
    """Create .venv-trl on first use (never the project's venv: TRL pins its own stack)."""
    if TRL_PYTHON.exists() and subprocess.run([str(TRL_PYTHON), "-c", "import trl, rl_core.config.run_config"], cwd=REPO,
                                              env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True).returncode == 0:
        return
    print("creating .venv-trl (torch 2.13.0 CPU, trl 1.16.0): a few minutes, once", flush=True)
    subprocess.run(["python3", "-m", "venv", str(TRL_VENV)], check=True)
    pip = [str(TRL_VENV / "bin" / "pip"), "install", "-q"]
    subprocess.run(pip + ["torch==2.13.0"], check=True)
    subprocess.run(pip + TRL_PACKAGES, check=True)


def run_trl(config: str, max_steps: int, root: Path) -> dict[str, Any]:
    ensure_trl_venv()
    out = root / "trl.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "TOKENIZERS_PARALLELISM": "false"}
    log = root / "trl.log"
    with open(log, "w") as handle:
        code = subprocess.run([str(TRL_PYTHON), __file__, "--trl-child", "--config", config, "--max-steps", str(max_steps),
                               "--out", str(out)], cwd=REPO, env=env, stdout=handle, stderr=subprocess.STDOUT).returncode
    if code != 0 or not out.exists():
        raise SystemExit(f"TRL run failed ({code}):\n{log.read_text()[-3000:]}")
    data = json.loads(out.read_text())
    return {"curve": [tuple(p) for p in data["curve"]], "steps": [tuple(s) for s in data["steps"]],
            "note": f"eval time excluded {data['eval_s_excluded']:.0f}s"}


# --- the Inflight side: the product's CLI ---------------------------------------------


def run_inflight(config: str, max_steps: int, root: Path) -> dict[str, Any]:
    out = root / "inflight"
    python = str(INFLIGHT_PYTHON if INFLIGHT_PYTHON.exists() else sys.executable)
    result = subprocess.run([python, "-m", "rl_core", "run", config, "--out", str(out), "--quiet",
                             "--set", f"trainer.max_steps={max_steps}"], cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"Inflight run failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    t0 = records[0]["t"]  # the launcher's first line: servers up, model loaded, trainer and actor starting
    curve = [(r["step"], r["t"] - t0, r["success/heldout"]) for r in records if "success/heldout" in r]
    steps = [(r["step"], r["t"] - t0) for r in records if "train/loss" in r]
    lag = max((r["success/heldout_version_max"] - r["step"] for r in records if "success/heldout" in r), default=0)
    return {"curve": curve, "steps": steps, "note": f"eval points saw up to {lag:.0f} later versions"}


# --- summary ----------------------------------------------------------------------------


def summarize(run: dict[str, Any]) -> dict[str, float]:
    curve: Curve = run["curve"]
    start = next(value for step, _, value in curve if step == 0)
    hit = next(((step, seconds) for step, seconds, value in curve if value >= start + GAIN - 1e-9), (float("nan"),) * 2)
    (first_step, first_s), (last_step, last_s) = run["steps"][0], run["steps"][-1]
    # Steady-state seconds per optimizer step: first to last step, start-up left out.
    s_per_step = (last_s - first_s) / max(1, last_step - first_step)
    # When the trainer had the weights of that step (Inflight's point counts only once its eval is done).
    trained = next((seconds for step, seconds in run["steps"] if step >= hit[0]), float("nan"))
    return {"start": start, "final": curve[-1][2], "steps_to": hit[0], "seconds_to": hit[1],
            "trained_s": trained, "s_per_step": s_per_step, "steps": last_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default="examples/tiny-cpu.yaml", help="Run config YAML (both sides).")
    parser.add_argument("--max-steps", type=int, default=40, help="Optimizer steps per side (enough to pass +20).")
    parser.add_argument("--repeats", type=int, default=1, help="Runs per side; >1 prints each and the spread.")
    parser.add_argument("--only", choices=["trl", "inflight"], help="Run one side only (debugging).")
    parser.add_argument("--setup-only", action="store_true", help="Create .venv-trl if it is not there, then exit (`make bench-smoke` does, outside its clock).")
    parser.add_argument("--trl-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    if "--trl-child" in sys.argv:  # inside .venv-trl, which has TRL's stack, not the benches' (benchlib)
        args = parser.parse_args()
        trl_child(args.config, args.max_steps, args.out)
        return
    from benchlib import parse_bench_args, smoke_demo_config

    # --smoke: 2 optimizer steps per side, the fewest that still give a steady-state s/step (first
    # to last step) and a held-out point after training (eval.heldout_every_n_steps=2 at smoke
    # size: points at steps 0 and 2). 4 steps cost one more TRL eval and twice the training.
    args = parse_bench_args(parser, smoke={"max_steps": 2})
    if args.setup_only:
        ensure_trl_venv()
        return
    config = str((REPO / args.config) if not Path(args.config).is_absolute() else args.config)
    with tempfile.TemporaryDirectory(prefix="bench-vs-trl-") as scratch:
        if args.smoke:  # both sides on the config at its smallest settings (benchlib.SMOKE_DEMO_OVERRIDES)
            config = str(smoke_demo_config(Path(scratch), Path(config)))
        compare(config, args)


def compare(config: str, args: argparse.Namespace) -> None:
    sides = [args.only] if args.only else ["inflight", "trl"]
    runners = {"inflight": run_inflight, "trl": run_trl}
    results: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    started = time.monotonic()
    for repeat in range(args.repeats):
        # Alternate the order across repeats so a drift in machine load does not favour one side.
        for side in (sides if repeat % 2 == 0 else sides[::-1]):
            with tempfile.TemporaryDirectory(prefix=f"bench-vs-trl-{side}-") as tmp:
                run = runners[side](config, args.max_steps, Path(tmp))
            summary = summarize(run)
            results[side].append(summary)
            curve = " ".join(f"{step}:{value:.3f}@{seconds:.0f}s" for step, seconds, value in run["curve"])
            print(f"[{side} #{repeat}] steps {summary['steps']}, {summary['s_per_step']:.2f} s/step, "
                  f"+{GAIN:.2f} at step {summary['steps_to']} / {summary['seconds_to']:.1f}s (step trained at "
                  f"{summary['trained_s']:.1f}s; {run['note']})\n"
                  f"  held-out step:value@seconds  {curve}", flush=True)

    print(f"\n{'side':9} {'held-out 0':>10} {'final':>6} {'steps to +20':>12} {'s to +20':>9} {'s/step':>7}")
    median: dict[str, dict[str, float]] = {}
    for side, runs in results.items():
        median[side] = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        m = median[side]
        spread = ""
        if len(runs) > 1:
            values = [r["seconds_to"] for r in runs]
            spread = f"  (s to +20 over {len(runs)} runs: {min(values):.1f}..{max(values):.1f})"
        print(f"{side:9} {m['start']:10.3f} {m['final']:6.3f} {m['steps_to']:12.0f} {m['seconds_to']:9.1f} {m['s_per_step']:7.2f}{spread}")
    print(f"({time.monotonic() - started:.0f} s in all)")
    for side in results:
        m = median[side]
        print(f"RESULT {side}_time_to_plus20_s {m['seconds_to']:.1f}")
        print(f"RESULT {side}_steps_to_plus20 {m['steps_to']:.0f}")
        print(f"RESULT {side}_heldout_final {m['final']:.3f}")
        print(f"RESULT {side}_s_per_step {m['s_per_step']:.2f}")
    if len(results) == 2:
        print(f"RESULT inflight_over_trl_time_to_plus20 {median['inflight']['seconds_to'] / median['trl']['seconds_to']:.3f}")


if __name__ == "__main__":
    main()
