"""In-flight weight update pause vs a bare torch.distributed broadcast of the same bytes.

A random Qwen2 of ~125M parameters (fp32, ~500 MB) is served by a real
`python -m rl_core serve` process that keeps decoding requests; this process is
the trainer and pushes updates with `WeightBroadcaster` (gloo over 127.0.0.1).
The server reports how long decoding was paused per update. In the same run a
bare receiver process joins its own gloo group and receives the very same
buckets with nothing else around them; its receive time is the floor.

    .venv/bin/python bench/weight_update.py [--updates 3]

Ends with `RESULT update_pause_vs_broadcast <ratio>` (goal <= 1.5).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from benchlib import bare_broadcast, build_model, start_reference_server, updates_while_decoding  # first: it puts the checkout on sys.path

from rl_core.weight_sync import DEFAULT_BUCKET_BYTES  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--bucket-bytes", type=int, default=DEFAULT_BUCKET_BYTES)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        model_dir = scratch / "model-125m"
        num_parameters = build_model(model_dir)
        trainer_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        named = [(name, parameter.detach()) for name, parameter in trainer_model.named_parameters()]
        total_bytes = sum(tensor.numel() * tensor.element_size() for _, tensor in named)
        server = start_reference_server(model_dir, timeout_s=300, max_batch_size=8)
        try:
            pauses, broadcasts = updates_while_decoding(server.url, named, args.updates, args.bucket_bytes)
        finally:
            server.stop()
        bare = bare_broadcast(named, args.bucket_bytes, args.updates, scratch)

    print(f"model: {num_parameters / 1e6:.1f}M parameters, {total_bytes / 2**20:.0f} MiB fp32, buckets of {args.bucket_bytes / 2**20:.0f} MiB, gloo on 127.0.0.1")
    print(f"{'update':>6} {'server pause s':>15} {'trainer bcast s':>16} {'bare receive s':>15}")
    for index, (pause, broadcast, floor) in enumerate(zip(pauses, broadcasts, bare), start=1):
        print(f"{index:>6} {pause:>15.3f} {broadcast:>16.3f} {floor:>15.3f}")
    ratio = statistics.median(pauses) / statistics.median(bare)
    print(f"RESULT update_pause_s {statistics.median(pauses):.3f}")
    print(f"RESULT bare_broadcast_s {statistics.median(bare):.3f}")
    print(f"RESULT update_pause_vs_broadcast {ratio:.2f}")


if __name__ == "__main__":
    main()
