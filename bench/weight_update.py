"""In-flight weight update pause: the process-group broadcast against a bare broadcast of the same
bytes, and the same-device handoff against a bare device copy of the same bytes.

A random Qwen2 of the `--shape` (rl_core/models/model_shapes.py: default 125m, fp32 ~500 MB; qwen2.5-0.5b ...) is served by a real
`python -m rl_core serve` process that keeps decoding requests; this process is the trainer and
pushes updates with the product's senders. The server reports how long decoding was paused per update.

- `--handoff gloo`: `WeightBroadcaster` (gloo over 127.0.0.1). In the same run a bare receiver
  process joins its own gloo group and receives the very same buckets with nothing else around
  them; its receive time is the floor. `RESULT update_pause_vs_broadcast` (goal <= 1.5).
- `--handoff same-device`: `weight_handoff.SameDeviceSender` (a /dev/shm segment on CPU, a CUDA
  IPC handle on a GPU), then gloo updates to the same server for comparison. The floor is a bare
  `copy_` of the same bytes on the same device, one thread as the server.
  `RESULT update_pause_vs_device_copy` (goal <= 1.2) and `RESULT update_pause_gloo_over_same_device`.
- `--handoff both` (default): both.

    .venv/bin/python bench/weight_update.py [--handoff same-device] [--shape 125m] [--device cpu] [--dtype float32] [--updates 3] [--smoke]

At the ~125M shape or larger: at a few MB a fixed signalling cost would dominate every ratio.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from benchlib import bare_broadcast, start_reference_server, updates_while_decoding  # first: it puts the checkout on sys.path

from rl_core.models.model_shapes import add_model_shape_args, bench_dtype, model_for_bench  # noqa: E402
from rl_core.models.model_io import synchronize_device  # noqa: E402
from rl_core.weights.sync import DEFAULT_BUCKET_BYTES  # noqa: E402

def bare_device_copy(total_bytes: int, device: torch.device, rounds: int) -> list[float]:
    """Seconds of one `copy_` of `total_bytes` between two buffers already resident on `device`."""
    source = torch.ones(total_bytes, dtype=torch.uint8, device=device)
    target = torch.zeros(total_bytes, dtype=torch.uint8, device=device)
    target.copy_(source)  # both faulted in, as the server's weights are
    times = []
    for _ in range(rounds):
        synchronize_device(device)
        started = time.perf_counter()
        target.copy_(source)
        synchronize_device(device)
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--handoff", choices=["gloo", "same-device", "both"], default="both",
                        help="Which update path to measure (both: each against its floor, on one server).")
    add_model_shape_args(parser, default_shape="125m")  # the server's and the trainer's device, dtype, shape
    parser.add_argument("--updates", type=int, default=5, help="Updates per path (the median is reported).")
    parser.add_argument("--bucket-bytes", type=int, default=DEFAULT_BUCKET_BYTES)
    parser.add_argument("--smoke", action="store_true", help="Smallest real settings (seconds): shape tiny, 2 updates.")
    args = parser.parse_args()
    if args.smoke:
        args.shape, args.updates = "tiny", 2
    torch.set_num_threads(1)  # as the server (--threads 1): the copy floor runs on one core too
    from transformers import AutoModelForCausalLM

    device = torch.device(args.device)
    dtype_name = bench_dtype(args)
    same_device, gloo = args.handoff in ("same-device", "both"), args.handoff in ("gloo", "both")
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        model_dir = model_for_bench(args, scratch)
        trainer_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype_name)).to(device)
        named = [(name, parameter.detach()) for name, parameter in trainer_model.named_parameters()]
        num_parameters = sum(tensor.numel() for _, tensor in named)
        total_bytes = sum(tensor.numel() * tensor.element_size() for _, tensor in named)
        server = start_reference_server(model_dir, timeout_s=300, max_batch_size=8, device=args.device, dtype=dtype_name)
        try:
            version = 1
            if same_device:
                from rl_core.weights.handoff import SameDeviceSender

                sender = SameDeviceSender([server.url], f"bench{id(server) & 0xFFFF}", device=device)
                results["same_device_pause"], results["same_device_write"] = updates_while_decoding(
                    server.url, named, args.updates, args.bucket_bytes, sender=sender, first_version=version)
                version += args.updates
            if gloo:
                results["gloo_pause"], results["gloo_broadcast"] = updates_while_decoding(
                    server.url, named, args.updates, args.bucket_bytes, first_version=version)
        finally:
            server.stop()
        if same_device:
            results["device_copy"] = bare_device_copy(total_bytes, device, max(args.updates, 3))
        if gloo:
            results["bare_broadcast"] = bare_broadcast(named, args.bucket_bytes, args.updates, scratch)

    print(f"model: {args.model or 'shape ' + args.shape}, {num_parameters / 1e6:.1f}M parameters, {total_bytes / 2**20:.0f} MiB {dtype_name} "
          f"on {device}, gloo buckets of {args.bucket_bytes / 2**20:.0f} MiB on 127.0.0.1")
    for key, values in results.items():
        print(f"{key:>18}: " + " ".join(f"{value:.4f}" for value in values))
    median = {key: statistics.median(values) for key, values in results.items()}
    if gloo:
        print(f"RESULT update_pause_s {median['gloo_pause']:.4f}")
        print(f"RESULT bare_broadcast_s {median['bare_broadcast']:.4f}")
        print(f"RESULT update_pause_vs_broadcast {median['gloo_pause'] / median['bare_broadcast']:.2f}")
    if same_device:
        print(f"RESULT update_pause_same_device_s {median['same_device_pause']:.4f}")
        print(f"RESULT device_copy_s {median['device_copy']:.4f}")
        print(f"RESULT update_pause_vs_device_copy {median['same_device_pause'] / median['device_copy']:.2f}")
    if gloo and same_device:
        print(f"RESULT update_pause_gloo_over_same_device {median['gloo_pause'] / median['same_device_pause']:.1f}")


if __name__ == "__main__":
    main()
