"""DeepSpeedBackend on CPU (DeepSpeed's CPU accelerator + gloo), real tiny Qwen2 model.

Every DeepSpeed scenario runs in a child process (`python this_file SCENARIO ...`):
DeepSpeed initialises torch.distributed's default process group, which must not
leak into the pytest process that other tests (weight sync, servers) share.
The first run on a machine JIT-compiles DeepSpeed's CPU comm op (~80 s); later
runs reuse the build in TORCH_EXTENSIONS_DIR.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rl_core.kernels.cpu import ENV_SWITCH

pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed with DS_BUILD_OPS=0)")

pytestmark = pytest.mark.deepspeed
THIS_FILE = Path(__file__).resolve()
REPO_ROOT = THIS_FILE.parents[2]


def run_scenario(scenario: str, tmp_path: Path, *args: str, timeout: float = 480) -> dict:
    from rl_core.trainer.deepspeed_backend import TORCH_EXTENSIONS_DEFAULT

    result_file = tmp_path / f"{scenario}.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR", str(TORCH_EXTENSIONS_DEFAULT)))
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(key, None)
    proc = subprocess.run(
        [sys.executable, str(THIS_FILE), scenario, str(result_file), *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )
    if proc.returncode != 0 or not result_file.is_file():
        raise AssertionError(f"scenario {scenario} failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return json.loads(result_file.read_text())


# --- the scenarios (run in the child) ---------------------------------------------


def _config(zero_stage: int, **trainer: object):
    from rl_core.config.run_config import RunConfig

    return RunConfig.model_validate({
        "trainer": {"backend": "deepspeed", "zero_stage": zero_stage, "lr": 1e-2, "warmup_steps": 1,
                    "grad_clip": 0.5, "max_steps": 10, "weight_decay": 0.01, **trainer},
    })


def _micro_batches(step: int):
    """Two micro-batches of different shapes per step: accumulation must sum both."""
    import torch

    generator = torch.Generator().manual_seed(100 + step)
    return [torch.randint(3, 500, (2, 12), generator=generator), torch.randint(3, 500, (1, 20), generator=generator)]


def _train_steps(backend, steps: int) -> list[dict]:
    infos = []
    for step in range(steps):
        for input_ids in _micro_batches(backend.version):
            logprobs, _ = backend.token_logprobs(input_ids, None, None)
            backend.backward(-logprobs[:, 1:].sum() / 3.0)
        infos.append(backend.optimizer_step())
    return infos


def _max_difference(named_a, named_b) -> float:
    a, b = dict(named_a), dict(named_b)
    assert list(a) == list(b), (list(a)[:4], list(b)[:4])
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def scenario_match_torch(result_file: str, model_path: str) -> None:
    """Every ZeRO stage takes the same steps as the plain torch backend."""
    import torch

    from rl_core.trainer.deepspeed_backend import DeepSpeedBackend
    from rl_core.trainer.torch_backend import TorchBackend

    torch.set_num_threads(1)
    config = _config(0)
    reference = TorchBackend(model_path, lr=config.trainer.lr, weight_decay=config.trainer.weight_decay,
                             warmup_steps=config.trainer.warmup_steps, total_steps=config.trainer.max_steps,
                             grad_clip=config.trainer.grad_clip)
    initial = {name: tensor.clone() for name, tensor in reference.parameters_for_broadcast()}
    reference_infos = _train_steps(reference, 3)
    reference_weights = list(reference.parameters_for_broadcast())
    out: dict = {"reference_grad_norms": [i["grad_norm"] for i in reference_infos],
                 "reference_lrs": [i["lr"] for i in reference_infos],
                 "moved": _max_difference(initial.items(), reference_weights), "stages": {}}
    for stage in (0, 1, 2, 3):
        backend = DeepSpeedBackend(_config(stage), model_path)
        infos = _train_steps(backend, 3)
        out["stages"][str(stage)] = {
            "version": backend.version,
            "grad_norms": [i["grad_norm"] for i in infos],
            "lrs": [i["lr"] for i in infos],
            "max_weight_difference": _max_difference(reference_weights, backend.parameters_for_broadcast()),
            "names": [name for name, _ in backend.parameters_for_broadcast()],
        }
    out["reference_names"] = [name for name, _ in reference_weights]
    Path(result_file).write_text(json.dumps(out))


def scenario_checkpoint(result_file: str, model_path: str, checkpoint_dir: str) -> None:
    """ZeRO-3: save after 2 steps, resume in a fresh backend, the 3rd step is identical."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl_core.trainer.deepspeed_backend import DeepSpeedBackend

    torch.set_num_threads(1)
    original = DeepSpeedBackend(_config(3), model_path, broadcast_bucket_bytes=64 * 1024)
    _train_steps(original, 2)
    original.save_checkpoint(checkpoint_dir)
    saved = {name: tensor for name, tensor in original.parameters_for_broadcast()}
    _train_steps(original, 1)
    continued = list(original.parameters_for_broadcast())

    hf_model = AutoModelForCausalLM.from_pretrained(checkpoint_dir, dtype=torch.float32)
    hf_difference = _max_difference(saved.items(), [(n, p.detach()) for n, p in hf_model.named_parameters()])

    resumed = DeepSpeedBackend(_config(3), model_path)
    resumed.load_checkpoint(checkpoint_dir)
    resumed_version = resumed.version
    loaded_difference = _max_difference(saved.items(), resumed.parameters_for_broadcast())
    _train_steps(resumed, 1)
    out = {
        "resumed_version": resumed_version,
        "hf_difference": hf_difference,
        "loaded_difference": loaded_difference,
        "third_step_difference": _max_difference(continued, resumed.parameters_for_broadcast()),
        "files": sorted(p.name for p in Path(checkpoint_dir).iterdir()),
    }
    stage0 = DeepSpeedBackend(_config(0), model_path)
    try:
        stage0.load_checkpoint(checkpoint_dir)
        out["stage_mismatch_error"] = None
    except ValueError as exc:
        out["stage_mismatch_error"] = str(exc)
    Path(result_file).write_text(json.dumps(out))


def scenario_broadcast(result_file: str, model_path: str) -> None:
    """ZeRO-3 trainer -> real reference server through WeightBroadcaster (gloo): the
    server then computes with exactly the trainer's gathered weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl_core.trainer.deepspeed_backend import DeepSpeedBackend
    from server_process import start_vllm_server  # tests/rl_core is on sys.path
    from rl_core.weights.sync import WeightBroadcaster

    torch.set_num_threads(1)
    server = start_vllm_server(
        [sys.executable, "-m", "rl_core", "serve", "--model", model_path, "--port", "0", "--threads", "1"], timeout_s=300
    )
    try:
        # Small buckets: the gather really happens bucket by bucket.
        backend = DeepSpeedBackend(_config(3), model_path, broadcast_bucket_bytes=256 * 1024)
        _train_steps(backend, 2)
        weights = {name: tensor for name, tensor in backend.parameters_for_broadcast()}
        broadcaster = WeightBroadcaster([server.url], backend="gloo", bucket_bytes=1024 * 1024)
        broadcaster.connect()
        stats = broadcaster.broadcast(backend.parameters_for_broadcast(), backend.version)
        broadcaster.close()
        health, choice_json = greedy_chat(server.url, max_tokens=10)
    finally:
        server.stop()
    # What the server generated must be what the trainer's weights generate.
    trained = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    missing, unexpected = trained.load_state_dict(weights, strict=False)
    ids = torch.tensor([choice_json["prompt_token_ids"]])
    expected, expected_logprobs = [], []
    with torch.no_grad():
        for _ in range(len(choice_json["choices"][0]["token_ids"])):
            step = torch.log_softmax(trained(ids).logits[0, -1], -1)
            token = int(step.argmax())
            expected.append(token)
            expected_logprobs.append(float(step[token]))
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    choice = choice_json["choices"][0]
    Path(result_file).write_text(json.dumps({
        "version": backend.version, "server_version": health["version"], "stats": stats,
        "unexpected": list(unexpected), "missing": [k for k in missing if "lm_head" not in k],
        "tokens": choice["token_ids"], "expected_tokens": expected, "token_versions": choice["token_versions"],
        "logprobs": [item["logprob"] for item in choice["logprobs"]["content"]], "expected_logprobs": expected_logprobs,
    }))


def scenario_packed_exactness(result_file: str, model_path: str, work_dir: str) -> None:
    """ZeRO-0 and ZeRO-3, each model directory of test_attention_exactness.CONFIGURED_ATTENTION:
    `trainer.train_step`'s packed loss and gradients against one unpacked forward per sample."""
    import torch

    from rl_core.trainer.deepspeed_backend import DeepSpeedBackend
    from test_attention_exactness import (  # tests/rl_core is this script's directory, so on sys.path
        CONFIGURED_ATTENTION, compare, exactness_config, grouped_samples, model_dir_with_attention,
        packed_loss_and_gradients, unpacked_loss_and_gradients)

    torch.set_num_threads(1)
    samples = grouped_samples()
    out: dict = {}
    for stage in (0, 3):
        config = exactness_config("deepspeed", stage)
        unpacked = unpacked_loss_and_gradients(Path(model_path), samples, config)
        for attention in CONFIGURED_ATTENTION:
            try:  # every case is reported, a model that does not load included
                backend = DeepSpeedBackend(config, model_dir_with_attention(Path(model_path), attention, Path(work_dir)))
            except Exception as exc:  # noqa: BLE001
                out[f"{stage}/{attention}"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                continue
            packed = packed_loss_and_gradients(backend, backend.module.parameters, samples, config)
            modules = [backend.module] + ([backend.reference.module if stage == 3 else backend.reference])
            out[f"{stage}/{attention}"] = {
                **compare(packed, unpacked), "has_gradient": packed["gradient"] is not None,
                "attention": [module.config._attn_implementation for module in modules]}
    Path(result_file).write_text(json.dumps(out))


SCENARIOS = {"match_torch": scenario_match_torch, "checkpoint": scenario_checkpoint, "broadcast": scenario_broadcast,
             "packed_exactness": scenario_packed_exactness}


# --- the tests -------------------------------------------------------------------



def greedy_chat(url: str, max_tokens: int) -> tuple[dict, dict]:
    """The server's /health and its greedy answer (with logprobs) to a fixed question."""
    import httpx

    health = httpx.get(url + "/health", trust_env=False).json()
    model_name = httpx.get(url + "/v1/models", trust_env=False).json()["data"][0]["id"]
    body = {"model": model_name, "messages": [{"role": "user", "content": "What is 3 + 4?"}], "temperature": 0.0,
            "max_tokens": max_tokens, "logprobs": True}
    return health, httpx.post(url + "/v1/chat/completions", json=body, trust_env=False, timeout=120).json()

def test_deepspeed_every_zero_stage_takes_the_torch_backends_steps(untrained_tiny_model: Path, tmp_path: Path) -> None:
    result = run_scenario("match_torch", tmp_path, str(untrained_tiny_model))
    # lr 1e-2 for 3 steps moves weights by ~3e-2; ZeRO's other reduction order leaves
    # float32 rounding that Adam's normalisation amplifies to ~1e-4, far below that.
    assert result["moved"] > 1e-2, "the reference run must actually change the weights"
    for stage, got in result["stages"].items():
        assert got["version"] == 3, stage
        assert got["names"] == result["reference_names"], stage
        assert got["lrs"] == pytest.approx(result["reference_lrs"]), stage
        # Grad norms before clipping: accumulation over both micro-batches, reduced.
        assert got["grad_norms"] == pytest.approx(result["reference_grad_norms"], rel=1e-4), stage
        assert got["max_weight_difference"] < 5e-4, (stage, got["max_weight_difference"])


def test_deepspeed_zero3_checkpoint_resumes_exactly(untrained_tiny_model: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoints" / "step_000002"
    result = run_scenario("checkpoint", tmp_path, str(untrained_tiny_model), str(checkpoint))
    assert result["resumed_version"] == 2
    assert {"model.safetensors", "config.json", "deepspeed"} <= set(result["files"])
    assert result["hf_difference"] == 0.0, "model.safetensors must hold the gathered ZeRO-3 weights"
    assert result["loaded_difference"] == 0.0
    # Same weights + same optimizer moments + same LR => the same next step.
    assert result["third_step_difference"] < 1e-6
    assert result["stage_mismatch_error"] and "zero_stage=3" in result["stage_mismatch_error"]


def test_deepspeed_zero3_weights_reach_a_reference_server_intact(untrained_tiny_model: Path, tmp_path: Path) -> None:
    result = run_scenario("broadcast", tmp_path, str(untrained_tiny_model))
    assert result["version"] == 2 and result["server_version"] == 2
    assert result["unexpected"] == [] and result["missing"] == []
    assert result["stats"]["weights/version"] == 2
    assert result["tokens"] == result["expected_tokens"]
    assert result["token_versions"] == [2] * len(result["tokens"])
    assert result["logprobs"] == pytest.approx(result["expected_logprobs"], abs=1e-4)


def test_deepspeed_packed_micro_batches_give_the_unpacked_loss_and_gradient(untrained_tiny_model: Path, tmp_path: Path) -> None:
    """Whatever config.json names, the policy and the reference model attend by the packed layout
    and ZeRO-0 and ZeRO-3 train on exactly the unpacked gradient. Before, eager attention read the
    packed rows' boolean mask as 0/1 scores here: loss off by 1%, the largest gradient entry by its
    own size; a flash-attention config did not load at all."""
    from test_attention_exactness import CONFIGURED_ATTENTION, assert_exact

    from rl_core.kernels.packed_attention import PACKED_ATTENTION

    result = run_scenario("packed_exactness", tmp_path, str(untrained_tiny_model), str(tmp_path))
    assert set(result) == {f"{stage}/{attention}" for stage in (0, 3) for attention in CONFIGURED_ATTENTION}
    loaded = {case: got for case, got in result.items() if "error" not in got}
    for case, got in loaded.items():
        # ZeRO-3 partitions the gradients: there the step's global norm stands for them.
        assert got["has_gradient"] == case.startswith("0/"), case
        assert_exact({**got, "case": case}, with_gradient=got["has_gradient"])
    assert {case: got["attention"] for case, got in loaded.items()} == {
        case: [PACKED_ATTENTION, PACKED_ATTENTION] for case in loaded}  # the policy's and the reference's
    assert loaded == result, "these model directories did not load: " + str(
        {case: got for case, got in result.items() if case not in loaded})


def _stream_samples(count: int, seed: int):
    """Scored rollouts of different lengths, so the ranks' shares pack into different
    numbers of micro-batches (the padding path) and both signs of advantage appear."""
    import random

    from rl_core.common.contracts import RolloutSample

    rng = random.Random(seed)
    samples = []
    for index in range(count):
        completion = [rng.randrange(10, 400) for _ in range(rng.randrange(2, 14))]
        advantage = 1.0 if index % 2 == 0 else -1.0
        samples.append(RolloutSample(
            sample_id=f"s{index}", group_id=f"g{index // 4}", prompt_id=f"p{index // 4}",
            prompt_token_ids=[rng.randrange(10, 400) for _ in range(6)], completion_token_ids=completion,
            behaviour_logprobs=[-6.0] * len(completion), token_versions=[0] * len(completion),
            reward=max(0.0, advantage), success=advantage > 0, advantage=advantage,
        ))
    return samples


@pytest.mark.timeout(900)
def test_deepspeed_zero3_two_trainer_ranks_train_shares_and_rank0_updates_the_server(
    untrained_tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real trainer CLI as the launcher starts it with `trainer.cpu_ranks: 2` (two
    processes, gloo, ZeRO-3) against a real reference server: after 2 steps the server
    generates exactly with the consolidated checkpoint weights, the ranks trained disjoint
    halves of each batch, and the result equals one torch process on the whole batches."""
    import torch
    from transformers import AutoModelForCausalLM

    from rl_core.config.run_config import RunConfig
    from rl_core.config.files import config_to_yaml
    from rl_core.trainer.deepspeed_backend import TORCH_EXTENSIONS_DEFAULT
    from rl_core.launch.launcher import place_run, trainer_children
    from rl_core.common.processes import free_port
    from tests.metrics_file import read_metrics
    from rl_core.rundir.stream import FileStreamWriter
    from rl_core.trainer.torch_backend import TorchBackend
    from rl_core.rundir.layout import SHARDS_FILE, latest_checkpoint
    from rl_core.trainer.loop import train_step
    from server_process import start_vllm_server  # tests/rl_core is on sys.path

    config = RunConfig.model_validate({
        "model": {"path": str(untrained_tiny_model)},
        "trainer": {"backend": "deepspeed", "zero_stage": 3, "cpu_ranks": 2, "samples_per_step": 8, "max_steps": 2,
                    "micro_batch_tokens": 32, "lr": 1e-2, "warmup_steps": 0, "grad_clip": 0.5},
        "actor": {"max_lag": 3},
        "monitoring": {"rollouts": {"keep_every_n_steps": 1}},  # every step's trainer logprobs recorded
    })
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(config_to_yaml(config))
    samples = _stream_samples(16, seed=1)
    from rl_core.trainer.loss import pack_micro_batches
    from rl_core.trainer.loop import shard_for_rank

    counts = [[len(pack_micro_batches(shard_for_rank(batch, rank, 2), 32)) for rank in (0, 1)] for batch in (samples[:8], samples[8:])]
    assert any(a != b for a, b in counts), "the data must make one rank pad its micro-batches (ZeRO-3 collectives)"
    writer = FileStreamWriter(run_dir)
    writer.append(samples)
    writer.close()

    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
    env.update(OMP_NUM_THREADS="1", TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR", str(TORCH_EXTENSIONS_DEFAULT)))
    server = start_vllm_server(
        [sys.executable, "-m", "rl_core", "serve", "--model", str(untrained_tiny_model), "--port", "0", "--threads", "1"],
        timeout_s=300,
    )
    procs: list[subprocess.Popen] = []
    try:
        specs = trainer_children(config, place_run(config, []), run_dir, untrained_tiny_model, [server.url], False, free_port())
        assert [spec.name for spec in specs] == ["trainer", "trainer1"]
        for spec in specs:
            log = open(tmp_path / f"{spec.name}.log", "wb")
            procs.append(subprocess.Popen(spec.command, cwd=REPO_ROOT, env={**env, **spec.env}, stdout=log, stderr=subprocess.STDOUT))
            log.close()
        codes = [proc.wait(timeout=720) for proc in procs]
        logs = "\n".join((tmp_path / f"{spec.name}.log").read_text()[-3000:] for spec in specs)
        assert codes == [0, 0], logs
        health, choice_json = greedy_chat(server.url, max_tokens=8)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        server.stop()

    # Each step's batch was split between the ranks: disjoint, non-empty, together the batch.
    shards = [json.loads(line) for line in (run_dir / SHARDS_FILE).read_text().splitlines()]
    for step, batch in ((1, samples[:8]), (2, samples[8:])):
        by_rank = {record["rank"]: set(record["sample_ids"]) for record in shards if record["step"] == step}
        assert set(by_rank) == {0, 1} and by_rank[0] and by_rank[1], shards
        assert not by_rank[0] & by_rank[1]
        assert by_rank[0] | by_rank[1] == {sample.sample_id for sample in batch}
    # Each rank recorded the trainer logprobs of its own share: every sample once, whole.
    from rl_core.rundir.layout import TRAIN_LOGPROBS_FILE

    recorded = [json.loads(line) for line in (run_dir / TRAIN_LOGPROBS_FILE).read_text().splitlines()]
    assert sorted(r["sample_id"] for r in recorded) == sorted(s.sample_id for s in samples)
    lengths = {s.sample_id: len(s.completion_token_ids) for s in samples}
    assert all(len(r["logprobs"]) == lengths[r["sample_id"]] and r["step"] in (1, 2) for r in recorded)
    metrics = [record for record in read_metrics(run_dir / "metrics.jsonl") if "train/loss" in record]
    assert [record["weights/version"] for record in metrics] == [1.0, 2.0]  # rank 0 alone logs
    assert [record["train/samples_consumed"] for record in metrics] == [8.0, 16.0]

    # The server holds the consolidated (gathered) weights rank 0 checkpointed at version 2.
    checkpoint = latest_checkpoint(run_dir)
    assert checkpoint is not None and checkpoint.name == "step_000002" and health["version"] == 2
    trained = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
    choice = choice_json["choices"][0]
    ids = torch.tensor([choice_json["prompt_token_ids"]])
    with torch.no_grad():
        for token, entry in zip(choice["token_ids"], choice["logprobs"]["content"]):
            step_logprobs = torch.log_softmax(trained(ids).logits[0, -1], -1)
            assert token == int(step_logprobs.argmax())
            assert entry["logprob"] == pytest.approx(float(step_logprobs[token]), abs=1e-4)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    assert choice["token_versions"] == [2] * len(choice["token_ids"])

    # Two ranks on halves == one process on the whole batches (DeepSpeed averages the ranks).
    # Same GEMM kernels as the DeepSpeed ranks (torch's stock path), so the comparison is of
    # the sharding and averaging, not of two kernels' float rounding through two Adam steps.
    monkeypatch.setenv(ENV_SWITCH, "torch")
    single = TorchBackend(untrained_tiny_model, lr=1e-2, warmup_steps=0, total_steps=2, grad_clip=0.5)
    initial = {name: tensor.clone() for name, tensor in single.parameters_for_broadcast()}
    for batch in (samples[:8], samples[8:]):
        train_step(single, batch, config)
    expected = dict(single.parameters_for_broadcast())
    got = dict(trained.named_parameters())
    assert max(float((expected[n] - initial[n]).abs().max()) for n in expected) > 1e-2
    assert max(float((got[n].detach() - expected[n]).abs().max()) for n in expected) < 5e-4


def test_deepspeed_backend_refuses_a_missing_model_dir(tmp_path: Path) -> None:
    from rl_core.config.run_config import RunConfig
    from rl_core.trainer.deepspeed_backend import DeepSpeedBackend

    with pytest.raises(FileNotFoundError, match="model.path"):
        DeepSpeedBackend(RunConfig(), tmp_path / "nope")


if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
