"""The same-device weight handoff (rl_core/weights/handoff.py): trainer and servers on one device
hand weights over through a segment both map, the server pausing only for a device-local copy.

Real parts: a real engine, a real server process, /dev/shm segments, SIGKILLed processes, and a
whole run through the launcher. The CUDA IPC kind cannot run here (no GPU): its descriptor checks
are tested, its copy is the same code as the CPU kind's."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from rl_core.inference.client import InferenceClient
from rl_core.config.run_config import RunConfig
from rl_core.common.contracts import SamplingParams
from rl_core.inference.engine import ReferenceEngine
from rl_core.cluster.placement import PlacementError, check_placement
from rl_core.weights.handoff import (
    SEGMENT_ALIGN_BYTES,
    SameDeviceSender,
    SegmentDescriptor,
    SegmentReceiver,
    segment_layout,
)
from rl_core.weights.segments import remove_run_segments, run_segment_tag, run_segments, segment_name
from rl_core.models.model_io import synchronize_device
from rl_core.weights.sync import ParamSpec, WeightSyncError
from engine_kinds import start_server  # tests/rl_core is on sys.path (rootdir-relative test modules)
from test_launcher import children_of, command_words, start_run, status, trained_steps, wait_for, write_config
from tests.metrics_file import read_metrics


def perturb(model: torch.nn.Module, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_((0.05 * torch.randn(parameter.shape, generator=generator)).to(parameter.dtype))


class LocalEndpoint:
    """A server's receiving side in this process, behind the endpoint interface the sender uses,
    with the JSON round trip of the HTTP body (what the server parses is what crossed the wire)."""

    def __init__(self, receiver: SegmentReceiver, after: LocalEndpoint | None = None) -> None:
        self.name = "in-process"
        self.receiver = receiver
        self.after = after  # a server slower than `after`: it takes each update once that one has
        self.answered = threading.Event()

    def request_segment_update(self, version: int, params: list[ParamSpec], segment: SegmentDescriptor) -> dict:
        if self.after is not None:
            assert self.after.answered.wait(60)
        body = json.loads(json.dumps({"params": [spec.to_json() for spec in params], "segment": segment.to_json()}))
        try:
            return {"pause_s": self.receiver.receive(version, body["params"], body["segment"])}
        finally:
            self.answered.set()

    def close(self) -> None:
        pass


def test_layout_aligns_every_parameter_and_descriptors_name_the_bad_field() -> None:
    specs = [ParamSpec("a", "float32", (3,)), ParamSpec("b", "bfloat16", (5, 7)), ParamSpec("c", "float64", (1,))]
    offsets, nbytes = segment_layout(specs)
    assert offsets == [0, SEGMENT_ALIGN_BYTES, 2 * SEGMENT_ALIGN_BYTES] and nbytes == 3 * SEGMENT_ALIGN_BYTES
    good = {"kind": "shared_memory", "name": segment_name("abc", 12, 1), "nbytes": 64}
    assert segment_name("abc") != segment_name("abc")  # never a name a server has mapped already
    assert SegmentDescriptor.from_json(good).to_json() == good
    for bad, field in [({**good, "kind": "nfs"}, "segment.kind"), ({**good, "nbytes": 0}, "segment.nbytes"),
                       ({**good, "name": "../../etc/passwd"}, "segment.name"), ({**good, "name": "inflight-weights-x/../y-1"}, "segment.name"),
                       ({**good, "kind": "cuda_ipc"}, "segment.cuda_ipc")]:
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            SegmentDescriptor.from_json(bad)


def cpu_config(**sections: dict) -> RunConfig:
    data: dict = {"inference": {}, "trainer": {}}
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return RunConfig.model_validate(data)


def test_the_placement_picks_the_handoff_by_itself() -> None:
    cpu = check_placement(cpu_config(), 0)
    assert cpu.weight_handoff == "same_device" and "weight_handoff=same_device" in cpu.summary()
    assert check_placement(cpu_config(inference={"num_servers": 2}), 0).weight_handoff == "same_device"  # both map it
    assert check_placement(cpu_config(inference={"weight_handoff": "collective"}), 0).weight_handoff == "collective"
    one_gpu = {"device": "cuda", "gpus_per_server": 1}
    shared = check_placement(cpu_config(inference=one_gpu, trainer={"device": "cuda", "share_inference_gpus": True}), 1)
    assert shared.weight_handoff == "same_device"
    apart = check_placement(cpu_config(inference=one_gpu, trainer={"device": "cuda"}), 2)
    assert (apart.weight_handoff, apart.weight_sync_backend) == ("collective", "nccl")
    two_servers = cpu_config(inference={**one_gpu, "num_servers": 2}, trainer={"device": "cuda", "share_inference_gpus": True})
    assert check_placement(two_servers, 2).weight_handoff == "collective"
    with pytest.raises(PlacementError, match="inference.weight_handoff 'same_device' needs .* different devices"):
        check_placement(cpu_config(inference={**one_gpu, "weight_handoff": "same_device"}, trainer={"device": "cuda"}), 2)
    with pytest.raises(PlacementError, match="inference.weight_handoff 'same_device' needs .* process group only"):
        check_placement(cpu_config(inference={"engine": "vllm", "weight_handoff": "same_device"}), 0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_update_leaves_the_engine_bit_for_bit_equal_to_the_trainer(untrained_tiny_model: Path, dtype: str) -> None:
    engine = ReferenceEngine.from_pretrained(str(untrained_tiny_model), device="cpu", dtype=dtype).start()
    trainer_model = AutoModelForCausalLM.from_pretrained(untrained_tiny_model, dtype=getattr(torch, dtype))
    tag = f"test-exact-{dtype}-{os.getpid()}"
    sender = SameDeviceSender([], tag, endpoints=[LocalEndpoint(SegmentReceiver(engine))])
    try:
        for version in (1, 2, 3):
            perturb(trainer_model, version)
            figures = sender.broadcast(trainer_model.named_parameters(), version)
            served = engine.model.state_dict()
            assert all(torch.equal(served[name], parameter) for name, parameter in trainer_model.named_parameters())
            assert engine.version == version and figures["weights/same_device_handoff"] == 1.0
            assert figures["weights/update_pause_s"] > 0
            # Both sides mapped the segment: its name is gone already, the mapping still works.
            assert run_segments(tag) == []
        # Another parameter list (here the same one reversed: the same size) gets a segment of its
        # own, which the server maps instead of copying on from the one it mapped before.
        perturb(trainer_model, 4)
        sender.broadcast(list(trainer_model.named_parameters())[::-1], 4)
        served = engine.model.state_dict()
        assert all(torch.equal(served[name], parameter) for name, parameter in trainer_model.named_parameters())
        perturb(trainer_model, 5)
        sender.broadcast(trainer_model.named_parameters(), 5)
        served = engine.model.state_dict()
        assert all(torch.equal(served[name], parameter) for name, parameter in trainer_model.named_parameters())
    finally:
        sender.close()
        engine.stop()


def test_two_servers_map_one_segment(untrained_tiny_model: Path) -> None:
    """Several CPU servers of a run map the same segment: the first to answer must not take its
    name from a slower one that has not mapped it yet."""
    engines = [ReferenceEngine.from_pretrained(str(untrained_tiny_model), device="cpu", dtype="float32").start() for _ in range(2)]
    trainer_model = AutoModelForCausalLM.from_pretrained(untrained_tiny_model, dtype=torch.float32)
    tag = f"test-two-{os.getpid()}"
    first = LocalEndpoint(SegmentReceiver(engines[0]))
    sender = SameDeviceSender([], tag, endpoints=[first, LocalEndpoint(SegmentReceiver(engines[1]), after=first)])
    try:
        for version in (1, 2):
            perturb(trainer_model, version)
            sender.broadcast(trainer_model.named_parameters(), version)
            for engine in engines:
                served = engine.model.state_dict()
                assert all(torch.equal(served[name], parameter) for name, parameter in trainer_model.named_parameters())
        assert run_segments(tag) == []
    finally:
        sender.close()
        for engine in engines:
            engine.stop()


def test_pause_clocks_wait_for_the_device(monkeypatch: pytest.MonkeyPatch, untrained_tiny_model: Path) -> None:
    """An NCCL receive or a CUDA copy is queued, not done, when the Python call returns: the pause
    clock stops after the device wait, which is timed inside the pause."""
    import rl_core.inference.engine

    waits: list[torch.device] = []

    def slow_device(device: torch.device) -> None:
        waits.append(device)
        time.sleep(0.2)

    engine = ReferenceEngine.from_pretrained(str(untrained_tiny_model), device="cpu", dtype="float32")
    monkeypatch.setattr(rl_core.inference.engine, "synchronize_device", slow_device)
    with engine.paused() as pause:
        pass
    assert waits == [engine.device] and pause.pause_s >= 0.2
    # On CUDA the wait is torch.cuda.synchronize of that device; on CPU nothing to wait for.
    synced: list = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    synchronize_device("cpu")
    synchronize_device(torch.device("cuda", 0))
    assert synced == [torch.device("cuda", 0)]


def test_a_server_takes_a_same_device_update_in_flight(untrained_tiny_model: Path) -> None:
    server = start_server("reference", untrained_tiny_model, max_batch_size=8)
    trainer_model = AutoModelForCausalLM.from_pretrained(untrained_tiny_model, dtype=torch.float32).eval()
    tag = f"test-server-{os.getpid()}"
    sender = SameDeviceSender([server.url], tag)
    messages = [{"role": "user", "content": "What is 7 + 8?"}]

    async def scenario() -> tuple:
        async with InferenceClient(server.url) as client:
            spanning = asyncio.create_task(client.generate(messages, SamplingParams(temperature=0.0, max_new_tokens=800)))
            while (await client.health())["running"] == 0:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.3)
            perturb(trainer_model, 1)
            figures = await asyncio.to_thread(sender.broadcast, trainer_model.named_parameters(), 1)
            return await spanning, figures, await client.generate(messages, SamplingParams(temperature=0.0, max_new_tokens=16))

    try:
        spanning, figures, after = asyncio.run(asyncio.wait_for(scenario(), 300))
        # The sequence decoding across the update kept its KV cache and its tokens' versions are exact.
        assert set(spanning[0].token_versions) == {0, 1} and spanning[0].token_versions == sorted(spanning[0].token_versions)
        assert figures["weights/update_pause_s"] > 0
        prompt = after[0].prompt_token_ids
        with torch.no_grad():
            expected = trainer_model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0, len(prompt):].tolist()
        assert after[0].token_ids == expected and set(after[0].token_versions) == {1}
        assert run_segments(tag) == []
        # A segment the server cannot take is refused by field, and nothing changes.
        with httpx.Client(base_url=server.url, trust_env=False) as http:
            params = [{"name": "model.norm.weight", "dtype": "float32", "shape": list(trainer_model.model.norm.weight.shape)}]
            answer = http.post("/request_weight_update", json={"version": 9, "params": params, "segment": {
                "kind": "shared_memory", "name": segment_name("gone", 1, 1), "nbytes": 4096}})
            assert answer.status_code == 400 and "segment.name: cannot open" in answer.json()["error"]["message"]
            answer = http.post("/request_weight_update", json={"version": 9, "params": params, "segment": {"kind": "pipe"}})
            assert answer.status_code == 400 and "segment.kind" in answer.json()["error"]["message"]
            assert http.get("/health").json()["version"] == 1
    finally:
        sender.close()
        server.stop()


def test_a_killed_server_fails_the_trainer_at_once_and_leaves_no_segment(untrained_tiny_model: Path) -> None:
    server = start_server("reference", untrained_tiny_model, max_batch_size=8)
    trainer_model = AutoModelForCausalLM.from_pretrained(untrained_tiny_model, dtype=torch.float32)
    tag = f"test-killed-server-{os.getpid()}"
    sender = SameDeviceSender([server.url], tag)
    try:
        sender.broadcast(trainer_model.named_parameters(), 1)
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(30)
        started = time.monotonic()
        with pytest.raises(WeightSyncError, match=server.url):
            sender.broadcast(trainer_model.named_parameters(), 2)
        assert time.monotonic() - started < 10
        assert run_segments(tag) == []
    finally:
        sender.close()
        server.stop()


TRAINER_LOOP = """
import sys, torch
from transformers import AutoModelForCausalLM
from rl_core.weights.handoff import SameDeviceSender
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
sender = SameDeviceSender([sys.argv[2]], sys.argv[3])
version = 0
while True:
    version += 1
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(1.0001)
    sender.broadcast(model.named_parameters(), version)
    print(version, flush=True)
"""


def test_a_killed_trainer_leaves_the_server_serving(untrained_tiny_model: Path, tmp_path: Path) -> None:
    """SIGKILL the trainer while it updates as fast as it can: the server never waits on it (no
    collective to be stuck in), keeps serving, and the run's end leaves no segment of it."""
    server = start_server("reference", untrained_tiny_model, max_batch_size=8)
    tag = run_segment_tag(tmp_path)
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER_LOOP, str(untrained_tiny_model), server.url, tag],
                               stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(3):  # a few updates through
            assert trainer.stdout.readline().strip(), "the trainer loop ended"
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(30)

        async def still_serving() -> tuple[dict, list]:
            async with InferenceClient(server.url) as client:
                done = await client.generate([{"role": "user", "content": "1+1"}], SamplingParams(temperature=1.0, max_new_tokens=8))
                return await client.health(), done

        health, done = asyncio.run(asyncio.wait_for(still_serving(), 30))
        assert health["version"] >= 3 and len(done[0].token_ids) > 0
        # What the launcher does at the run's end (remove_run_segments): nothing of the run is left.
        remove_run_segments(tmp_path)
        assert run_segments(tag) == []
    finally:
        if trainer.poll() is None:
            trainer.kill()
        server.stop()


def test_segments_of_dead_owners_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    tag = run_segment_tag(tmp_path)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout.strip()
    mine, theirs = (Path("/dev/shm") / segment_name(tag)), (Path("/dev/shm") / segment_name(tag, int(dead), 1))
    mine.write_bytes(b"x")
    theirs.write_bytes(b"x")
    try:
        assert remove_run_segments(tmp_path, only_dead_owners=True) == [theirs]
        assert run_segments(tag) == [mine]
        assert remove_run_segments(tmp_path) == [mine] and run_segments(tag) == []
    finally:
        for path in (mine, theirs):
            path.unlink(missing_ok=True)


@pytest.mark.parametrize("victim", ["trainer", "serve"])
def test_a_run_with_a_killed_side_ends_failed_with_no_segment_left(untrained_tiny_model: Path, tmp_path: Path, victim: str) -> None:
    """A whole CPU run takes the same-device path by itself (the run page's weights chart shows
    it); SIGKILL either side mid-run: the run fails naming it and no segment of the run is left.
    (The untrained model: the trainer steps on its groups all the same, and it needs no warm start.)"""
    config = write_config(tmp_path / "c.yaml", untrained_tiny_model, trainer={"max_steps": 200})
    out = tmp_path / "run"
    launcher = start_run(config, out)
    try:
        wait_for(lambda: trained_steps(out) >= 2, 240, "two training steps")
        target = next(p for p in children_of(launcher.pid) if victim in command_words(p))
        target.send_signal(signal.SIGKILL)
        assert launcher.wait(90) == 1
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert status(out)["state"] == "failed" and ("server0" if victim == "serve" else "trainer") in status(out)["error"]
    steps = [line for line in read_metrics(out / "metrics.jsonl") if "train/loss" in line]
    assert steps and all(line["weights/same_device_handoff"] == 1.0 for line in steps)
    assert run_segments(run_segment_tag(out)) == []
