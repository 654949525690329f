"""Trainer -> server weight broadcast over a real gloo group and a real server process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from rl_core.inference.client import InferenceClient
from rl_core.common.contracts import SamplingParams
from rl_core.common.processes import free_port
from rl_core.weights.sync import (
    ParamSpec,
    WeightBroadcaster,
    WeightSyncError,
    check_join,
    create_group,
    parse_update,
    plan_buckets,
    receive_buckets,
)
from engine_kinds import start_server  # tests/rl_core is on sys.path (rootdir-relative test modules)


def test_plan_buckets_packs_same_dtype_neighbours() -> None:
    specs = [
        ParamSpec("a", "float32", (10,)),
        ParamSpec("b", "float32", (5, 2)),
        ParamSpec("c", "bfloat16", (4,)),
        ParamSpec("d", "float32", (100,)),  # larger than a bucket: a bucket of its own
        ParamSpec("e", "float32", (3,)),
    ]
    buckets = plan_buckets(specs, bucket_bytes=100)
    assert [(b.dtype, [m[0] for m in b.members]) for b in buckets] == [
        ("float32", [0, 1]),
        ("bfloat16", [2]),
        ("float32", [3]),
        ("float32", [4]),
    ]
    assert buckets[0].members == [(0, 0, 10), (1, 10, 10)] and buckets[0].numel == 20


def test_join_and_update_checks_shared_by_every_receiver() -> None:
    check_join(1, 2, "gloo", on_cuda=False)
    check_join(2, 4, "gloo", on_cuda=False, ranks=2)  # a server of two workers takes ranks 2 and 3
    with pytest.raises(ValueError, match="rank must be in 1..world_size-2"):
        check_join(3, 4, "gloo", on_cuda=False, ranks=2)
    with pytest.raises(ValueError, match="rank must be in 1..world_size-1"):
        check_join(0, 2, "gloo", on_cuda=False)
    with pytest.raises(ValueError, match="'nccl' needs a vLLM server on CUDA"):
        check_join(1, 2, "nccl", on_cuda=False, what="a vLLM server")

    def check(specs) -> None:
        for name, shape in specs:
            if name != "w" or shape != (2, 3):
                raise KeyError(f"model has no parameter or buffer named {name!r}")

    assert parse_update([{"name": "w", "dtype": "float32", "shape": [2, 3]}], check) == ([ParamSpec("w", "float32", (2, 3))], None)
    assert parse_update([{"name": "v", "dtype": "float32", "shape": [1]}], check) == ([], "model has no parameter or buffer named 'v'")
    assert parse_update([{"name": "w", "dtype": "int7", "shape": [2, 3]}], check)[1].startswith("unsupported dtype")


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("streams", [1, 2, 3])
def test_receive_buckets_delivers_every_bucket_in_order(overlap: bool, streams: int) -> None:
    """A real gloo pair in one process: rank 0 broadcasts the buckets as the trainer does (bucket
    k on stream k % streams, up to `streams` in flight), rank 1 receives them through the shared
    helper, pipelined into `streams + 1` rotating buffers (reference server) or not (vLLM)."""
    import threading

    specs = [ParamSpec(f"p{i}", "float32" if i != 4 else "float64", (4,)) for i in range(7)]
    values = [torch.arange(4.0, dtype=torch.float32 if i != 4 else torch.float64) + 10 * i for i in range(7)]
    port = free_port()
    sender: dict = {}
    thread = threading.Thread(target=lambda: sender.update(group=create_group("gloo", "127.0.0.1", port, 0, 2, 60, streams)))
    thread.start()
    receiver = create_group("gloo", "127.0.0.1", port, 1, 2, 60, streams)
    thread.join()
    assert receiver.streams == sender["group"].streams == streams

    def send() -> None:
        works = []
        for number, bucket in enumerate(plan_buckets(specs, bucket_bytes=16)):
            works.append(sender["group"].broadcast(torch.cat([values[index] for index, _, _ in bucket.members]), number))
        for work in works:
            work.wait()

    thread = threading.Thread(target=send)
    thread.start()
    buffers = {dtype: [torch.empty(4, dtype=dtype) for _ in range(streams + 1)] for dtype in (torch.float32, torch.float64)}
    delivered: list[tuple[int, list[float]]] = []
    receive_buckets(
        receiver, specs, 16, lambda number, bucket: buffers[getattr(torch, bucket.dtype)][number % (streams + 1)][: bucket.numel],
        lambda number, bucket, flat: delivered.append((number, flat.tolist())), overlap=overlap,
    )
    thread.join()
    receiver.shutdown()
    sender["group"].shutdown()
    assert delivered == [(i, values[i].tolist()) for i in range(7)]


def test_a_group_refuses_an_impossible_stream_count() -> None:
    with pytest.raises(ValueError, match="streams must be 1..8"):
        create_group("gloo", "127.0.0.1", free_port(), 0, 2, 60, streams=0)
    with pytest.raises(ValueError, match="streams must be 1..8"):
        WeightBroadcaster(["http://127.0.0.1:1"], streams=9)


def test_param_spec_rejects_malformed_entries() -> None:
    with pytest.raises(ValueError, match="shape"):
        ParamSpec.from_json({"name": "w", "dtype": "float32", "shape": "3"})
    with pytest.raises(ValueError, match="unsupported dtype"):
        ParamSpec.from_json({"name": "w", "dtype": "int7", "shape": [3]})


@pytest.fixture(scope="module")
def server(untrained_tiny_model: Path):
    handle = start_server("reference", untrained_tiny_model, max_batch_size=8)
    yield handle
    handle.stop()


def test_broadcast_updates_the_server_in_flight(server, untrained_tiny_model: Path) -> None:
    trainer_model = AutoModelForCausalLM.from_pretrained(untrained_tiny_model, dtype=torch.float32).eval()
    broadcaster = WeightBroadcaster([server.url], backend="gloo", bucket_bytes=256 * 1024)
    broadcaster.connect()
    messages = [{"role": "user", "content": "What is 7 + 8?"}]

    async def scenario() -> tuple[list, dict, list, dict]:
        async with InferenceClient(server.url) as client:
            long_request = asyncio.create_task(
                client.generate(messages, SamplingParams(temperature=0.0, max_new_tokens=800), request_id_prefix="spanning")
            )
            # Let it decode a while under version 0, then update underneath it (800 tokens: the
            # update must land before a decoder that keeps getting faster finishes it).
            while (await client.health())["running"] == 0:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
            with torch.no_grad():
                generator = torch.Generator().manual_seed(5)
                for parameter in trainer_model.parameters():
                    parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
            figures = await asyncio.to_thread(broadcaster.broadcast, trainer_model.named_parameters(), 1)
            spanning = await long_request
            after = await client.generate(messages, SamplingParams(temperature=0.0, max_new_tokens=16))
            return spanning, figures, after, await client.health()

    spanning, figures, after, health = asyncio.run(asyncio.wait_for(scenario(), 300))
    assert health["version"] == 1
    assert figures["weights/update_pause_s"] > 0 and figures["weights/broadcast_s"] > 0
    assert set(spanning[0].token_versions) == {0, 1}
    assert spanning[0].token_versions == sorted(spanning[0].token_versions)
    # The server's weights now equal the trainer's: same greedy continuation as HF on them.
    prompt = after[0].prompt_token_ids
    with torch.no_grad():
        expected = trainer_model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0, len(prompt) :].tolist()
    assert after[0].token_ids == expected
    assert set(after[0].token_versions) == {1}

    # A second update keeps working over the same group.
    figures = broadcaster.broadcast(trainer_model.named_parameters(), 2)
    assert figures["weights/version"] == 2

    # A refused update (unknown parameter) fails fast, names the server, changes nothing.
    with pytest.raises(WeightSyncError, match=server.url):
        broadcaster.broadcast([("no.such.weight", torch.zeros(3))], 3)
    assert asyncio.run(_health(server.url))["version"] == 2
    # ... and the refusal was agreed inside the group, so the group still works.
    assert broadcaster.broadcast(trainer_model.named_parameters(), 3)["weights/version"] == 3
    assert asyncio.run(_health(server.url))["version"] == 3
    broadcaster.close()


async def _health(url: str) -> dict:
    async with InferenceClient(url) as client:
        return await client.health()
