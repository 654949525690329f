"""train_logprobs.jsonl: the trainer's per-token logprobs at training time, mapped back to the
right sample through packing (shared prompts, several micro-batches), equal to the model's
logprob of each token computed on its own, recorded only on the steps the platform keeps."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from rl_core.config.run_config import RunConfig
from rl_core.config.files import config_to_yaml
from rl_core.common.contracts import RolloutSample
from rl_core.trainer.loss import pack_micro_batches
from rl_core.rundir.metrics import JsonlSink
from rl_core.rundir.layout import TRAIN_LOGPROBS_FILE
from rl_core.rundir.stream import FileStreamWriter, open_reader
from rl_core.trainer.train_records import TrainRecords
from rl_core.trainer.loop import Trainer, make_backend


def grouped_samples(groups: int, group_size: int, seed: int, start: int = 0) -> list[RolloutSample]:
    """Groups share a prompt (packing puts a group's completions back to back after one prompt copy)."""
    rng = random.Random(seed)
    samples = []
    for g in range(groups):
        prompt = [rng.randrange(10, 200) for _ in range(rng.randrange(4, 8))]
        for k in range(group_size):
            completion = [rng.randrange(10, 200) for _ in range(rng.randrange(2, 10))]
            n = start + g * group_size + k
            samples.append(RolloutSample(
                sample_id=f"s{n}", group_id=f"g{start + g}", prompt_id=f"p{start + g}", prompt_token_ids=prompt,
                completion_token_ids=completion, behaviour_logprobs=[-5.0] * len(completion),
                token_versions=[0] * len(completion), reward=float(k % 2), success=k % 2 == 1,
                advantage=1.0 if k % 2 else -1.0,
            ))
    return samples


def read_records(run_dir: Path) -> list[dict]:
    path = run_dir / TRAIN_LOGPROBS_FILE
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_capture_maps_packed_tokens_back_to_their_samples(tmp_path: Path) -> None:
    samples = grouped_samples(3, 4, seed=1)
    batches = pack_micro_batches(samples, micro_batch_tokens=48, row_tokens=48)
    assert len(batches) > 1 and any(len(b.sample_order) > 1 for b in batches)
    records = TrainRecords(tmp_path, every_n_steps=1)
    for batch in batches:
        # A stand-in for the model: each term's "logprob" encodes the token it scores.
        records.capture(batch, -batch.target_ids.float() / 1000, samples)
    records.flush(step=1, consumed=12)
    records.close()
    got = {r["sample_id"]: r for r in read_records(tmp_path)}
    assert set(got) == {s.sample_id for s in samples}
    for sample in samples:
        assert got[sample.sample_id]["logprobs"] == [round(-t / 1000, 4) for t in sample.completion_token_ids]
        assert got[sample.sample_id]["step"] == 1 and got[sample.sample_id]["consumed"] == 12


def test_a_view_into_a_larger_table_is_not_kept_alive(tmp_path: Path) -> None:
    samples = grouped_samples(1, 2, seed=5)
    (batch,) = pack_micro_batches(samples, 256)
    table = torch.randn(*batch.target_ids.shape, 64)  # as a [B, K, V] table would be
    records = TrainRecords(tmp_path, every_n_steps=1)
    records.capture(batch, table[..., 3], samples)
    kept = records._captured[0][0]
    assert kept.untyped_storage().nbytes() == kept.numel() * kept.element_size()
    records.flush(1, 2)
    records.close()
    want = table[..., 3][batch.loss_mask].tolist()
    assert [v for r in read_records(tmp_path) for v in r["logprobs"]] == pytest.approx(want, abs=1e-4)


def test_only_kept_steps_are_recorded_and_disabled_records_nothing(tmp_path: Path) -> None:
    records = TrainRecords(tmp_path, every_n_steps=5)
    assert [step for step in range(1, 16) if records.wants(step)] == [5, 10, 15]
    off = TrainRecords(tmp_path, every_n_steps=1, enabled=False)
    assert not any(off.wants(step) for step in range(1, 10))


def test_a_failing_write_never_reaches_the_trainer(tmp_path: Path) -> None:
    samples = grouped_samples(1, 2, seed=2)
    records = TrainRecords(tmp_path / "missing-dir", every_n_steps=1)
    for batch in pack_micro_batches(samples, 256):
        records.capture(batch, torch.zeros(batch.target_ids.shape), samples)
    records.flush(1, 2)  # the directory does not exist: the thread logs and gives up
    records.close()
    assert not (tmp_path / "missing-dir").exists()


@pytest.mark.timeout(180)
def test_trainer_records_each_tokens_logprob_at_training_time(untrained_tiny_model: Path, tmp_path: Path) -> None:
    config = RunConfig.model_validate({
        "model": {"path": str(untrained_tiny_model)},
        "trainer": {"samples_per_step": 8, "micro_batch_tokens": 64, "max_steps": 2, "lr": 1e-2, "warmup_steps": 0},
        "actor": {"max_lag": 3},
        "monitoring": {"rollouts": {"keep_every_n_steps": 2}},
    })
    (tmp_path / "config.yaml").write_text(config_to_yaml(config))
    first, second = grouped_samples(2, 4, seed=3), grouped_samples(2, 4, seed=4, start=8)
    FileStreamWriter(tmp_path).append(first + second)
    backend = make_backend(config, config.model.path)
    trainer = Trainer(config, tmp_path, backend, open_reader("file", tmp_path), JsonlSink(tmp_path / "metrics.jsonl"))

    # Step 1 is not a multiple of keep_every_n_steps: train it, then take the weights that train step 2.
    original_run_steps = config.trainer.max_steps
    trainer.config.trainer.max_steps = 1
    trainer.run()
    assert read_records(tmp_path) == []
    expected = {}
    with torch.no_grad():
        for sample in second:
            ids = torch.tensor([sample.prompt_token_ids + sample.completion_token_ids])
            logp, _ = backend.token_logprobs(ids, None, None)
            expected[sample.sample_id] = logp[0, len(sample.prompt_token_ids):].tolist()
    trainer.config.trainer.max_steps = original_run_steps
    trainer.run()

    records = read_records(tmp_path)
    assert {r["sample_id"] for r in records} == {s.sample_id for s in second}
    for record in records:
        assert record["step"] == 2 and record["consumed"] == 16
        assert record["logprobs"] == pytest.approx(expected[record["sample_id"]], abs=2e-4)
