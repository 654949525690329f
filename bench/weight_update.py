"""In-flight weight update pause: the process-group broadcast against a bare broadcast of the same
bytes, and the same-device handoff against a bare device copy of the same bytes.

A random Qwen2 of the `--shape` (default ~125M parameters, fp32 ~500 MB) is served by a real
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

from rl_core.weight_sync import DEFAULT_BUCKET_BYTES, synchronize_device  # noqa: E402

# Qwen2 shapes of this bench: (hidden, intermediate, layers, heads, kv heads, vocab). "125m" is the
# shape every earlier figure of this bench used; "smoke" is the smallest that still buckets.
SHAPES: dict[str, tuple[int, int, int, int, int, int]] = {
    "smoke": (128, 256, 2, 4, 2, 4096),
    "125m": (768, 2048, 12, 12, 4, 32000),
    "0.5b": (896, 4864, 24, 14, 2, 151936),
}


def build_shape(directory: Path, shape: str) -> int:
    """A randomly initialised Qwen2 of `shape` with the tiny model's tokenizer; its parameter count."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rl_core.tiny_model import build_tokenizer

    hidden, intermediate, layers, heads, kv_heads, vocab = SHAPES[shape]
    tokenizer = build_tokenizer(0, 1024)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads, max_position_embeddings=1024,
        tie_word_embeddings=False, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return sum(parameter.numel() for parameter in model.parameters())


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
    parser.add_argument("--shape", choices=sorted(SHAPES), default="125m", help="Model shape (random weights).")
    parser.add_argument("--device", default="cpu", help="Device of the server and the trainer's tensors: cpu, cuda.")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="Parameter dtype.")
    parser.add_argument("--updates", type=int, default=5, help="Updates per path (the median is reported).")
    parser.add_argument("--bucket-bytes", type=int, default=DEFAULT_BUCKET_BYTES)
    parser.add_argument("--smoke", action="store_true", help="Smallest real settings (seconds): shape smoke, 2 updates.")
    args = parser.parse_args()
    if args.smoke:
        args.shape, args.updates = "smoke", 2
    torch.set_num_threads(1)  # as the server (--threads 1): the copy floor runs on one core too
    from transformers import AutoModelForCausalLM

    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    same_device, gloo = args.handoff in ("same-device", "both"), args.handoff in ("gloo", "both")
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        model_dir = scratch / f"model-{args.shape}"
        num_parameters = build_shape(model_dir, args.shape)
        trainer_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
        named = [(name, parameter.detach()) for name, parameter in trainer_model.named_parameters()]
        total_bytes = sum(tensor.numel() * tensor.element_size() for _, tensor in named)
        server = start_reference_server(model_dir, timeout_s=300, max_batch_size=8, device=args.device, dtype=args.dtype)
        try:
            version = 1
            if same_device:
                from rl_core.weight_handoff import SameDeviceSender

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

    print(f"model: shape {args.shape}, {num_parameters / 1e6:.1f}M parameters, {total_bytes / 2**20:.0f} MiB {args.dtype} "
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
