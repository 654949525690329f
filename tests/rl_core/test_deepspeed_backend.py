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

pytest.importorskip("deepspeed", reason="deepspeed is not installed (pip install deepspeed with DS_BUILD_OPS=0)")

pytestmark = pytest.mark.deepspeed
THIS_FILE = Path(__file__).resolve()
REPO_ROOT = THIS_FILE.parents[2]


def run_scenario(scenario: str, tmp_path: Path, *args: str, timeout: float = 480) -> dict:
    from rl_core.deepspeed_backend import TORCH_EXTENSIONS_DEFAULT

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
    from rl_core.config import RunConfig

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

    from rl_core.deepspeed_backend import DeepSpeedBackend
    from rl_core.torch_backend import TorchBackend

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

    from rl_core.deepspeed_backend import DeepSpeedBackend

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
    import httpx
    import torch
    from transformers import AutoModelForCausalLM

    from rl_core.deepspeed_backend import DeepSpeedBackend
    from rl_core.vllm_engine import start_vllm_server
    from rl_core.weight_sync import WeightBroadcaster

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
        health = httpx.get(server.url + "/health", trust_env=False).json()
        model_name = httpx.get(server.url + "/v1/models", trust_env=False).json()["data"][0]["id"]
        body = {"model": model_name, "messages": [{"role": "user", "content": "What is 3 + 4?"}], "temperature": 0.0,
                "max_tokens": 10, "logprobs": True}
        choice_json = httpx.post(server.url + "/v1/chat/completions", json=body, trust_env=False, timeout=120).json()
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


def _rank_micro_batches(step: int, rank: int):
    import torch

    generator = torch.Generator().manual_seed(1000 * rank + step)
    return [torch.randint(3, 500, (2, 10), generator=generator)]


def scenario_two_ranks(result_file: str, model_path: str, rank: str, port: str) -> None:
    """One of two data-parallel ZeRO-3 ranks (gloo): each trains on its own data; every
    rank iterates the gathering broadcast generator (a collective), rank 0 saves it."""
    import torch

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=rank, WORLD_SIZE="2", LOCAL_RANK=rank)
    from rl_core.deepspeed_backend import DeepSpeedBackend

    torch.set_num_threads(1)
    backend = DeepSpeedBackend(_config(3), model_path, broadcast_bucket_bytes=128 * 1024)
    for step in range(2):
        for input_ids in _rank_micro_batches(step, int(rank)):
            logprobs, _ = backend.token_logprobs(input_ids, None, None)
            backend.backward(-logprobs[:, 1:].sum() / 2.0)
        backend.optimizer_step()
    gathered = {name: tensor.clone() for name, tensor in backend.parameters_for_broadcast()}
    torch.save(gathered, result_file + f".rank{rank}.pt")
    Path(result_file + f".rank{rank}").write_text(json.dumps({"version": backend.version}))


SCENARIOS = {"match_torch": scenario_match_torch, "checkpoint": scenario_checkpoint, "broadcast": scenario_broadcast,
             "two_ranks": scenario_two_ranks}


# --- the tests -------------------------------------------------------------------


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


def test_deepspeed_zero3_two_ranks_gather_the_data_parallel_weights(untrained_tiny_model: Path, tmp_path: Path) -> None:
    """Two real processes (gloo): ZeRO-3 shards every parameter across them; after two
    steps both gather identical full weights, equal to one torch model trained on the
    rank-averaged loss (DeepSpeed averages gradients over data-parallel ranks)."""
    import torch

    from rl_core.deepspeed_backend import TORCH_EXTENSIONS_DEFAULT
    from rl_core.torch_backend import TorchBackend
    from rl_core.weight_sync import free_port

    result = str(tmp_path / "two_ranks")
    port = str(free_port())
    env = dict(os.environ, OMP_NUM_THREADS="1", TORCH_EXTENSIONS_DIR=os.environ.get("TORCH_EXTENSIONS_DIR", str(TORCH_EXTENSIONS_DEFAULT)))
    procs = [
        subprocess.Popen([sys.executable, str(THIS_FILE), "two_ranks", result, str(untrained_tiny_model), str(rank), port],
                         cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for rank in (0, 1)
    ]
    outputs = [proc.communicate(timeout=480)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], "\n".join(output[-3000:] for output in outputs)
    rank0 = torch.load(result + ".rank0.pt")
    rank1 = torch.load(result + ".rank1.pt")
    assert list(rank0) == list(rank1)
    assert all(torch.equal(rank0[name], rank1[name]) for name in rank0)

    config = _config(3).trainer
    reference = TorchBackend(untrained_tiny_model, lr=config.lr, weight_decay=config.weight_decay, warmup_steps=config.warmup_steps,
                             total_steps=config.max_steps, grad_clip=config.grad_clip)
    initial = {name: tensor.clone() for name, tensor in reference.parameters_for_broadcast()}
    for step in range(2):
        for rank in (0, 1):
            for input_ids in _rank_micro_batches(step, rank):
                logprobs, _ = reference.token_logprobs(input_ids, None, None)
                reference.backward(-logprobs[:, 1:].sum() / 2.0 / 2)  # mean over the 2 ranks
        reference.optimizer_step()
    expected = dict(reference.parameters_for_broadcast())
    assert max(float((expected[n] - initial[n]).abs().max()) for n in expected) > 1e-2
    assert max(float((rank0[n] - expected[n]).abs().max()) for n in expected) < 5e-4


def test_deepspeed_backend_refuses_a_missing_model_dir(tmp_path: Path) -> None:
    from rl_core.config import RunConfig
    from rl_core.deepspeed_backend import DeepSpeedBackend

    with pytest.raises(FileNotFoundError, match="model.path"):
        DeepSpeedBackend(RunConfig(), tmp_path / "nope")


if __name__ == "__main__":
    SCENARIOS[sys.argv[1]](*sys.argv[2:])
