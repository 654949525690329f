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
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "rl_core"))

from rl_core.processes import free_port  # noqa: E402
from rl_core.weight_sync import (  # noqa: E402
    DEFAULT_BUCKET_BYTES,
    ParamSpec,
    WeightBroadcaster,
    create_group,
    dtype_name,
    parse_dtype,
    plan_buckets,
)


def build_model(directory: Path) -> int:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rl_core.tiny_model import build_tokenizer

    tokenizer = build_tokenizer(0, 1024)
    config = Qwen2Config(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
        num_key_value_heads=4, head_dim=64, max_position_embeddings=1024, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return sum(parameter.numel() for parameter in model.parameters())


def bare_receiver(master_port: int, plan_file: str, rounds: int) -> None:
    """Rank 1 of a plain gloo group: handshake, then receive every bucket; print the times."""
    torch.set_num_threads(1)
    specs = [ParamSpec.from_json(item) for item in json.loads(Path(plan_file).read_text())["params"]]
    bucket_bytes = json.loads(Path(plan_file).read_text())["bucket_bytes"]
    buckets = plan_buckets(specs, bucket_bytes)
    group = create_group("gloo", "127.0.0.1", master_port, 1, 2)
    buffers = {bucket.dtype: torch.empty(max(b.numel for b in buckets if b.dtype == bucket.dtype), dtype=parse_dtype(bucket.dtype)) for bucket in buckets}
    times = []
    for _ in range(rounds):
        work, _ = group.agree(False, torch.device("cpu"))
        work.wait()
        started = time.perf_counter()
        for bucket in buckets:
            group.broadcast(buffers[bucket.dtype][: bucket.numel]).wait()
        times.append(time.perf_counter() - started)
    print(json.dumps({"receive_s": times}), flush=True)


def bare_broadcast(named: list[tuple[str, torch.Tensor]], bucket_bytes: int, rounds: int, scratch: Path) -> list[float]:
    specs = [ParamSpec(name, dtype_name(tensor.dtype), tuple(tensor.shape)) for name, tensor in named]
    plan_file = scratch / "plan.json"
    plan_file.write_text(json.dumps({"params": [spec.to_json() for spec in specs], "bucket_bytes": bucket_bytes}))
    port = free_port()
    receiver = subprocess.Popen(
        [sys.executable, __file__, "--bare-receiver", "--master-port", str(port), "--plan", str(plan_file), "--rounds", str(rounds)],
        stdout=subprocess.PIPE, text=True,
    )
    group = create_group("gloo", "127.0.0.1", port, 0, 2)
    tensors = dict(named)
    for _ in range(rounds):
        work, _ = group.agree(False, torch.device("cpu"))
        work.wait()
        # Same sender pipelining as WeightBroadcaster: assemble bucket k+1 while k is on the wire.
        in_flight = None
        for bucket in plan_buckets(specs, bucket_bytes):
            flat = torch.cat([tensors[specs[index].name].reshape(-1) for index, _, _ in bucket.members])
            if in_flight is not None:
                in_flight[0].wait()
            in_flight = (group.broadcast(flat), flat)
        in_flight[0].wait()
    output, _ = receiver.communicate(timeout=600)
    return json.loads(output.strip().splitlines()[-1])["receive_s"]


def keep_decoding(url: str, stop: threading.Event) -> None:
    """Requests in flight during every update, as in a real run."""
    from rl_core.client import InferenceClient
    from rl_core.contracts import SamplingParams

    async def loop() -> None:
        async with InferenceClient(url) as client:
            while not stop.is_set():
                await client.generate([{"role": "user", "content": "1+1"}], SamplingParams(temperature=1.0, max_new_tokens=32), n=2)

    asyncio.run(loop())


def updates_while_decoding(url: str, named: list[tuple[str, torch.Tensor]], updates: int, bucket_bytes: int) -> tuple[list[float], list[float]]:
    """Broadcast `updates` new weight versions to the server at `url` while it keeps decoding;
    returns the server's pause and the trainer's broadcast time per update."""
    stop = threading.Event()
    decoder = threading.Thread(target=keep_decoding, args=(url, stop), daemon=True)
    broadcaster = WeightBroadcaster([url], bucket_bytes=bucket_bytes)
    try:
        broadcaster.connect()
        decoder.start()
        time.sleep(2.0)  # updates land mid-decode, as in a run
        pauses, broadcasts = [], []
        for version in range(1, updates + 1):
            with torch.no_grad():
                for _, tensor in named:
                    tensor.mul_(1.0001)
            figures = broadcaster.broadcast(named, version)
            pauses.append(figures["weights/update_pause_s"])
            broadcasts.append(figures["weights/broadcast_s"])
    finally:
        stop.set()
        decoder.join(120)
        broadcaster.close()
    return pauses, broadcasts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--updates", type=int, default=3)
    parser.add_argument("--bucket-bytes", type=int, default=DEFAULT_BUCKET_BYTES)
    parser.add_argument("--bare-receiver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--master-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.bare_receiver:
        bare_receiver(args.master_port, args.plan, args.rounds)
        return
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM

    from engine_kinds import start_server

    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        model_dir = scratch / "model-125m"
        num_parameters = build_model(model_dir)
        trainer_model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        named = [(name, parameter.detach()) for name, parameter in trainer_model.named_parameters()]
        total_bytes = sum(tensor.numel() * tensor.element_size() for _, tensor in named)
        server = start_server("reference", model_dir, timeout_s=300, max_batch_size=8)
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
