"""A run at a real model size: the product's own `python -m rl_core run` on a randomly
initialised published shape (default Qwen2.5-0.5B), asynchronous (and, with `--modes
async,sync`, the same run synchronous), a few steps of small batches.

It shows what only size shows: that nothing in the run is tuned to the 4M demo model (server
start, weight-update and health deadlines, memory), what an in-flight update costs when the
weights are ~2 GB, and what each role holds in memory.

- `real_size_update_pause_vs_broadcast`: the async run's median update pause (what the servers
  report, `weights/update_pause_s`) over a bare torch.distributed gloo broadcast of the same
  bytes between two processes on this machine (benchlib.bare_broadcast: nothing around the
  collective). CPU runs only; on one GPU the trainer and the server share the device and
  bench/weight_update.py --handoff same-device measures the update against a device copy.
- `real_size_<mode>_step_s`: wall time per optimizer step (first to last step of the run);
  `real_size_<mode>_gpu_util`: mean GPU utilisation while the run ran (NVML, every 0.5 s).
- `real_size_peak_rss_gib_<role>` (and `..._gpu_gib_<role>` on a GPU): the most memory each
  role's processes held together, sampled every 0.5 s (server, trainer, actor, launcher).

A random model earns no reward, so every group's advantages are 0 and the trainer would compute
one sample a step (loss.samples_with_gradient). The run therefore sets `trainer.kl_coef` (default
1e-3): with a KL term every sample carries a gradient, so the trainer runs forward and backward
over the whole batch plus the reference model's forward, as a learning run's trainer does. Its
gradient is ~0 while the policy equals the reference, so the weights barely move: the work, not
the learning, is what is measured. `real_size_trained_tokens_per_step` proves the work was done.

    .venv/bin/python bench/real_size.py [--shape qwen2.5-0.5b] [--device cpu|cuda] [--dtype ...]
        [--steps 3] [--modes async|async,sync] [--kl-coef 1e-3] [--smoke]

`--smoke`: the tiny shape, two steps, async only (seconds; the same code path).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import yaml

from benchlib import REPO_ROOT, bare_broadcast  # noqa: E402  (first: it puts the checkout on sys.path)

from rl_core.models.model_shapes import SHAPES, add_model_shape_args, bench_dtype, model_for_bench  # noqa: E402
from rl_core.weights.sync import DEFAULT_BUCKET_BYTES  # noqa: E402

SAMPLE_EVERY_S = 0.5
# Which role a process of the run is, by its command line (`python -m rl_core <command>`).
ROLE_COMMANDS = {"serve": "server", "rl_core.inference.vllm_engine": "server", "trainer": "trainer", "actor": "actor"}


class RunSampler:
    """Every 0.5 s: resident memory of each role's processes (summed per role), and on NVIDIA GPUs
    each role's GPU memory (NVML per process) and the devices' utilisation. Keeps the peaks."""

    def __init__(self, launcher_pid: int) -> None:
        self.launcher = psutil.Process(launcher_pid)
        self.peak_rss: dict[str, int] = {}
        self.peak_gpu: dict[str, int] = {}
        self.gpu_util: list[float] = []
        self._stop = threading.Event()
        self._nvml = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # noqa: BLE001 - no NVIDIA driver: memory figures only
            self._handles = []
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> RunSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._nvml is not None:
            self._nvml.nvmlShutdown()

    @staticmethod
    def role_of(process: psutil.Process) -> str:
        try:
            # One title for a role forked by the run's fork server (setproctitle), argv for a fresh one.
            arguments = " ".join(process.cmdline()).split()
        except psutil.Error:
            return "other"
        for argument in arguments:
            if argument in ROLE_COMMANDS:
                return ROLE_COMMANDS[argument]
        return "other"

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            try:
                processes = [self.launcher, *self.launcher.children(recursive=True)]
            except psutil.Error:
                return
            roles = {process.pid: ("launcher" if process.pid == self.launcher.pid else self.role_of(process)) for process in processes}
            rss: dict[str, int] = {}
            for process in processes:
                try:
                    rss[roles[process.pid]] = rss.get(roles[process.pid], 0) + process.memory_info().rss
                except psutil.Error:
                    continue
            for role, value in rss.items():
                self.peak_rss[role] = max(self.peak_rss.get(role, 0), value)
            gpu: dict[str, int] = {}
            utilisation = []
            for handle in self._handles:
                try:
                    utilisation.append(float(self._nvml.nvmlDeviceGetUtilizationRates(handle).gpu))
                    for entry in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                        role = roles.get(entry.pid)
                        if role is not None and entry.usedGpuMemory:
                            gpu[role] = gpu.get(role, 0) + int(entry.usedGpuMemory)
                except Exception:  # noqa: BLE001 - a GPU that fell off the bus loses its figures, not the bench
                    continue
            if utilisation:
                self.gpu_util.append(statistics.fmean(utilisation))
            for role, value in gpu.items():
                self.peak_gpu[role] = max(self.peak_gpu.get(role, 0), value)


def run_config(args: argparse.Namespace, model_dir: Path, mode: str) -> dict:
    on_gpu = args.device.startswith("cuda")
    return {
        "name": f"real-size-{mode}",
        "mode": mode,
        "sync_steps_per_batch": 1,
        "seed": 0,
        # Generous: the point is that the run needs no deadline tuned to its size.
        "max_wall_time_s": 3600,
        "model": {"path": str(model_dir), "dtype": bench_dtype(args), "build_tiny_if_missing": False},
        "task": {"kind": "synthetic", "heldout_size": 8},
        "sampling": {"temperature": 1.0, "max_new_tokens": args.max_new_tokens},
        "inference": {
            "engine": args.engine, "device": args.device, "num_servers": 1, "gpus_per_server": 1 if on_gpu else 0,
            "max_batch_size": 64, "threads_per_server": 1,
            # vLLM takes this share of the GPU up front; the trainer shares the device (one GPU).
            "gpu_memory_utilization": 0.35 if on_gpu else 0.8,
        },
        "actor": {"group_size": args.group_size, "groups_in_flight": max(1, args.samples_per_step // args.group_size),
                  "max_lag": 2, "advantage": "group_mean"},
        "trainer": {
            "backend": args.backend, "zero_stage": args.zero_stage, "device": args.device, "gpus": 1 if on_gpu else 0,
            "share_inference_gpus": on_gpu, "threads": 1, "samples_per_step": args.samples_per_step,
            "max_steps": args.steps, "lr": 1e-6, "warmup_steps": 0, "schedule": "constant", "kl_coef": args.kl_coef,
            "micro_batch_tokens": args.micro_batch_tokens, "checkpoint_every": 0,
        },
        "eval": {"heldout_every_n_steps": 0},
        "monitoring": {"rollouts": {"train_logprobs": False}},
    }


def run_mode(args: argparse.Namespace, model_dir: Path, mode: str, root: Path) -> dict:
    """One run through the product's launcher; its figures and the sampler's peaks."""
    from tests.metrics_file import read_metrics

    config_path = root / f"{mode}.yaml"
    config_path.write_text(yaml.safe_dump(run_config(args, model_dir, mode)))
    out = root / mode
    command = [sys.executable, "-m", "rl_core", "run", str(config_path), "--out", str(out), "--quiet"]
    started = time.monotonic()
    log_path = root / f"{mode}.log"
    with open(log_path, "wb") as log:
        launcher = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        with RunSampler(launcher.pid) as sampler:
            returncode = launcher.wait()
    wall = time.monotonic() - started
    if returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        logs = "\n".join(f"--- {path.name}\n" + "\n".join(path.read_text(errors="replace").splitlines()[-15:])
                         for path in sorted((out / "logs").glob("*.log")))
        raise SystemExit(f"real_size: the {mode} run failed ({returncode}) after {wall:.0f} s:\n{tail}\n{logs}")
    records = read_metrics(out / "metrics.jsonl")
    steps = [r for r in records if "train/loss" in r]
    pauses = [r["weights/update_pause_s"] for r in records if "weights/update_pause_s" in r]
    handoff = [r["weights/same_device_handoff"] for r in records if "weights/same_device_handoff" in r]
    step_s = (steps[-1]["t"] - steps[0]["t"]) / (len(steps) - 1) if len(steps) > 1 else float("nan")
    tokens = [r["train/tokens_per_s"] * r["train/step_s"] for r in steps if "train/tokens_per_s" in r and "train/step_s" in r]
    return {
        "mode": mode, "wall_s": wall, "steps": len(steps), "step_s": step_s, "pauses": pauses,
        "same_device": bool(handoff and handoff[-1]), "trained_tokens": tokens,
        "peak_rss": dict(sampler.peak_rss), "peak_gpu": dict(sampler.peak_gpu),
        "gpu_util": statistics.fmean(sampler.gpu_util) if sampler.gpu_util else None,
    }


def bare_broadcast_floor(model_dir: Path, dtype: str, rounds: int, scratch: Path) -> tuple[float, int]:
    """Median seconds of a bare gloo broadcast of the model's parameters, and their bytes."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl_core.models.model_io import model_dtype

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=model_dtype(dtype))
    named = [(name, parameter.detach()) for name, parameter in model.named_parameters()]
    total = sum(tensor.numel() * tensor.element_size() for _, tensor in named)
    torch.set_num_threads(1)
    times = bare_broadcast(named, DEFAULT_BUCKET_BYTES, rounds, scratch)
    return statistics.median(times), total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_model_shape_args(parser, default_shape="qwen2.5-0.5b")
    parser.add_argument("--steps", type=int, default=3, help="Optimizer steps of each run.")
    parser.add_argument("--samples-per-step", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--micro-batch-tokens", type=int, default=256,
                        help="Tokens per packed micro-batch: a 152k-row LM head makes 0.6 MB of logits per token.")
    parser.add_argument("--modes", default="async", help="Comma-separated: async, sync.")
    parser.add_argument("--engine", default="reference", choices=["reference", "vllm"], help="inference.engine of the runs.")
    parser.add_argument("--backend", default="torch", choices=["torch", "deepspeed"])
    parser.add_argument("--zero-stage", type=int, default=0, choices=[0, 1, 2, 3])
    parser.add_argument("--kl-coef", type=float, default=1e-3,
                        help="trainer.kl_coef: > 0 keeps every sample computed on a model that earns no reward.")
    parser.add_argument("--bare-rounds", type=int, default=3, help="Bare broadcasts timed (CPU).")
    parser.add_argument("--smoke", action="store_true", help="The tiny shape, 2 steps, async only.")
    args = parser.parse_args()
    if args.smoke:
        args.shape, args.steps, args.modes, args.bare_rounds = "tiny", 2, "async", 2
    modes = [mode.strip() for mode in args.modes.split(",") if mode.strip()]
    if not modes or any(mode not in ("async", "sync") for mode in modes):
        raise SystemExit(f"--modes: expected async and/or sync, got {args.modes!r}")
    on_gpu = args.device.startswith("cuda")

    with tempfile.TemporaryDirectory(prefix="inflight-real-size-") as scratch_dir:
        scratch = Path(scratch_dir)
        model_dir = model_for_bench(args, scratch)
        what = args.model or f"{args.shape} ({SHAPES[args.shape].num_parameters / 1e6:.0f}M parameters)"
        print(f"model: {what}, {bench_dtype(args)} on {args.device}; trainer {args.backend}"
              f"{f' ZeRO-{args.zero_stage}' if args.backend == 'deepspeed' else ''}")
        print(f"trainer work: kl_coef={args.kl_coef:g} keeps every sample computed (a random model earns no reward, "
              "so every advantage is 0)" if args.kl_coef > 0 else
              "trainer work: kl_coef=0 - a random model's all-zero advantages leave one sample a step computed")
        results = []
        for mode in modes:
            result = run_mode(args, model_dir, mode, scratch)
            results.append(result)
            print(f"{mode}: {result['steps']} steps in {result['wall_s']:.0f} s (start-up included), "
                  f"{result['step_s']:.2f} s per step, update pauses {[round(p, 3) for p in result['pauses']]}"
                  f"{' (same-device handoff)' if result['same_device'] else ''}", flush=True)
            print_run_results(result, first=len(results) == 1)  # now: a later run timing out keeps these
        async_result = next((r for r in results if r["mode"] == "async"), None)
        if async_result and async_result["pauses"] and not on_gpu:
            floor, total = bare_broadcast_floor(model_dir, bench_dtype(args), args.bare_rounds, scratch)
            print(f"bare gloo broadcast of the same {total / 2**30:.2f} GiB (one connection, 127.0.0.1): {floor:.3f} s")
            print(f"RESULT real_size_bare_broadcast_s {floor:.3f}")
            print(f"RESULT real_size_update_pause_vs_broadcast {statistics.median(async_result['pauses']) / floor:.2f}")
    if len(results) == 2 and async_result:
        sync_result = next(r for r in results if r["mode"] == "sync")
        print(f"RESULT real_size_async_over_sync_step_time {async_result['step_s'] / sync_result['step_s']:.3f}")


def print_run_results(result: dict, first: bool) -> None:
    """One run's RESULT lines; the memory table and per-role peaks for the first run only."""
    mode = result["mode"]
    print(f"RESULT real_size_{mode}_step_s {result['step_s']:.3f}")
    if result["gpu_util"] is not None:
        print(f"RESULT real_size_{mode}_gpu_util {result['gpu_util']:.1f}")
    if mode == "async" and result["pauses"]:
        print(f"RESULT real_size_update_pause_s {statistics.median(result['pauses']):.3f}")
    if not first:
        return
    roles = sorted(role for role in result["peak_rss"] if role != "other")
    print(f"{'role':<10}{'peak RSS GiB':>14}{'peak GPU GiB':>14}   ({mode} run, sampled every {SAMPLE_EVERY_S} s)")
    for role in roles:
        gpu = result["peak_gpu"].get(role)
        print(f"{role:<10}{result['peak_rss'][role] / 2**30:>14.2f}{(gpu / 2**30 if gpu else float('nan')):>14.2f}")
    for role in roles:
        print(f"RESULT real_size_peak_rss_gib_{role} {result['peak_rss'][role] / 2**30:.2f}")
    for role, value in sorted(result["peak_gpu"].items()):
        print(f"RESULT real_size_peak_gpu_gib_{role} {value / 2**30:.2f}")
    if result["trained_tokens"]:
        print(f"RESULT real_size_trained_tokens_per_step {statistics.median(result['trained_tokens']):.0f}")


if __name__ == "__main__":
    main()
