"""The trainer on the real (untrained) tiny model, a real file stream and real
checkpoints. No inference servers here (test_run_e2e.py has them): the broadcaster
is left out, which the trainer supports for exactly this purpose."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from rl_core.config.run_config import RunConfig
from rl_core.config.files import config_to_yaml
from rl_core.common.contracts import RolloutSample
from rl_core.rundir.metrics import JsonlSink
from tests.metrics_file import read_metrics
from rl_core.rundir.stream import FileStreamWriter, open_reader
from rl_core.trainer.torch_backend import TorchBackend, lr_multiplier
from rl_core.rundir.layout import latest_checkpoint, read_progress
from rl_core.trainer.loop import Trainer, make_backend, train_step


def make_config(model: Path, **trainer: object) -> RunConfig:
    settings = {"samples_per_step": 4, "micro_batch_tokens": 64, "max_steps": 2, "lr": 1e-2, "warmup_steps": 0}
    settings.update(trainer)
    return RunConfig.model_validate({"model": {"path": str(model)}, "trainer": settings, "actor": {"max_lag": 3}})


def make_samples(count: int, seed: int, advantage_sign: int | None = None, start: int = 0) -> list[RolloutSample]:
    rng = random.Random(seed)
    samples = []
    for i in range(count):
        completion = [rng.randrange(10, 200) for _ in range(rng.randrange(3, 9))]
        advantage = float(advantage_sign) if advantage_sign is not None else (1.0 if i % 2 == 0 else -1.0)
        samples.append(RolloutSample(
            sample_id=f"s{start + i}", group_id=f"g{(start + i) // 2}", prompt_id="p",
            prompt_token_ids=[rng.randrange(10, 200) for _ in range(5)], completion_token_ids=completion,
            behaviour_logprobs=[-5.0] * len(completion), token_versions=[0] * len(completion),
            reward=max(0.0, advantage), success=advantage > 0, advantage=advantage,
        ))
    return samples


def sequence_logprob(backend: TorchBackend, sample: RolloutSample) -> float:
    ids = torch.tensor([sample.prompt_token_ids + sample.completion_token_ids])
    with torch.no_grad():
        logp, _ = backend.token_logprobs(ids, None, None)
    return float(logp[0, len(sample.prompt_token_ids):].sum())


def test_lr_schedule() -> None:
    assert [lr_multiplier(s, 2, "constant", 10) for s in range(4)] == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0])
    assert lr_multiplier(2, 2, "cosine", 10) == pytest.approx(1.0)
    assert lr_multiplier(6, 2, "cosine", 10) == pytest.approx(0.5)
    assert lr_multiplier(10, 2, "cosine", 10) == pytest.approx(0.0, abs=1e-9)


def test_step_moves_logprobs_by_advantage_sign(untrained_tiny_model: Path) -> None:
    config = make_config(untrained_tiny_model)
    backend = make_backend(config, untrained_tiny_model)
    good, bad = make_samples(1, 1, +1)[0], make_samples(1, 2, -1)[0]
    before = sequence_logprob(backend, good), sequence_logprob(backend, bad)
    stats, info = train_step(backend, [good, bad], config)
    after = sequence_logprob(backend, good), sequence_logprob(backend, bad)
    assert backend.version == 1 and info["grad_norm"] > 0
    assert after[0] > before[0] and after[1] < before[1]
    assert stats.num_tokens == len(good.completion_token_ids) + len(bad.completion_token_ids)
    assert stats.lag_max == 0 and 0 < stats.ess <= 1


@pytest.mark.parametrize("temperature", [0.5, 1.6])
def test_a_step_with_no_policy_change_is_on_policy_at_any_temperature(untrained_tiny_model: Path, temperature: float) -> None:
    """Samples drawn by the engine at temperature T, scored by the trainer before any update:
    every importance ratio is 1 and the ESS is 1 (before the fix the trainer scored at T=1:
    ESS 0.905 at T=1.6 on the demo model)."""
    from rl_core.common.contracts import SamplingParams
    from rl_core.inference.engine import EngineConfig, ReferenceEngine

    engine = ReferenceEngine.from_pretrained(untrained_tiny_model, config=EngineConfig(max_batch_size=8))
    params = SamplingParams(temperature=temperature, max_new_tokens=12, seed=7)
    prompts = [[11, 12, 13, 14], [40, 41, 42], [90, 91, 92, 93, 94]]
    engine.start()
    try:
        results = engine.generate(prompts * 2, params)
    finally:
        engine.stop()
    samples = [
        RolloutSample(
            sample_id=f"s{i}", group_id="g0", prompt_id="p", prompt_token_ids=list(r.prompt_token_ids),
            completion_token_ids=list(r.token_ids), behaviour_logprobs=list(r.logprobs),
            token_versions=list(r.token_versions), reward=float(i % 2), success=bool(i % 2), advantage=(i % 2) - 0.5,
        )
        for i, r in enumerate(results)
    ]
    config = RunConfig.model_validate({
        "model": {"path": str(untrained_tiny_model)}, "sampling": {"temperature": temperature},
        "trainer": {"samples_per_step": len(samples), "micro_batch_tokens": 4096, "lr": 1e-12, "warmup_steps": 0},
    })
    backend = make_backend(config, untrained_tiny_model)
    for sample in samples:
        ids = torch.tensor([sample.prompt_token_ids + sample.completion_token_ids])
        with torch.no_grad():
            logp, _ = backend.token_logprobs(ids, None, None, temperature)
        scored = logp[0, len(sample.prompt_token_ids):]
        ratios = torch.exp(scored - torch.tensor(sample.behaviour_logprobs))
        assert torch.allclose(ratios, torch.ones_like(ratios), atol=2e-4), ratios
    stats, _ = train_step(backend, samples, config)
    assert stats.ess == pytest.approx(1.0, abs=1e-6)
    assert stats.clip_fraction == 0.0


def test_gradient_does_not_depend_on_micro_batching(untrained_tiny_model: Path) -> None:
    samples = make_samples(6, 3)
    grads = []
    for budget in (16, 4096):  # one sequence per micro-batch vs everything in one row
        config = make_config(untrained_tiny_model, micro_batch_tokens=budget)
        backend = TorchBackend(untrained_tiny_model)
        backend.optimizer_step = lambda: {}  # stop before the step to read the accumulated gradient
        train_step(backend, samples, config)
        grads.append(torch.cat([p.grad.flatten() for p in backend.model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5, rtol=1e-4)


def run_trainer(config: RunConfig, run_dir: Path, resume: bool = False) -> Trainer:
    from rl_core.rundir.metrics import JsonlSink

    backend = make_backend(config, config.model.path)
    trainer = Trainer(config, run_dir, backend, open_reader("file", run_dir), JsonlSink(run_dir / "metrics.jsonl"))
    if resume:
        trainer.resume(latest_checkpoint(run_dir))
    trainer.run()
    return trainer


@pytest.mark.timeout(180)
def test_loop_checkpoints_and_resumes_without_loss_or_repeats(untrained_tiny_model: Path, tmp_path: Path) -> None:
    config = make_config(untrained_tiny_model)
    (tmp_path / "config.yaml").write_text(config_to_yaml(config))
    writer = FileStreamWriter(tmp_path)
    writer.append(make_samples(8, 4))  # exactly two steps' worth
    trainer = run_trainer(config, tmp_path)
    assert trainer.backend.version == 2

    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2]
    for key in ("train/loss", "train/grad_norm", "train/entropy", "train/ess", "train/samples_per_s",
                "train/tokens_per_s", "policy_lag/mean", "policy_lag/max", "weights/version", "weights/update_pause_s"):
        assert key in records[-1], key
    latest = tmp_path / "checkpoints" / "latest"
    assert latest.is_symlink() and latest.resolve().name == "step_000002"
    for name in ("model.safetensors", "config.json", "optimizer.pt", "trainer_state.json", "tokenizer.json"):
        assert (latest / name).is_file(), name
    state = json.loads((latest / "trainer_state.json").read_text())
    assert state["consumed"] == 8 and state["version"] == 2
    assert read_progress(tmp_path).model_dump() | {"t": 0} == {"version": 2, "consumed": 8, "done": True, "max_steps": 2, "t": 0}

    # More rollouts arrive; a resumed trainer picks up exactly after the 8 it trained on.
    writer.append(make_samples(8, 5, start=8))
    resumed_config = make_config(untrained_tiny_model, max_steps=4)
    (tmp_path / "config.yaml").write_text(config_to_yaml(resumed_config))
    resumed = run_trainer(resumed_config, tmp_path, resume=True)
    assert resumed.backend.version == 4 and resumed.consumed == 16
    assert resumed.reader.read(1, timeout_s=0.1) == []  # every sample consumed exactly once
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3, 4]
    # Trained tokens were sampled by version 0: lag = trainer version at train time.
    assert [r["policy_lag/max"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3]


@pytest.mark.timeout(180)
def test_samples_too_stale_for_max_lag_are_dropped(untrained_tiny_model: Path, tmp_path: Path) -> None:
    config = make_config(untrained_tiny_model, max_steps=1)
    writer = FileStreamWriter(tmp_path)
    stale = make_samples(2, 8)
    for sample in stale:  # written by version 0 while the trainer is already at 5 (a resumed run)
        sample.token_versions = [0] * len(sample.completion_token_ids)
    fresh = make_samples(4, 9, start=2)
    for sample in fresh:
        sample.token_versions = [4] * len(sample.completion_token_ids)
    writer.append(stale + fresh)
    backend = make_backend(config, untrained_tiny_model)
    backend.version = 5
    from rl_core.rundir.metrics import JsonlSink

    trainer = Trainer(config, tmp_path, backend, open_reader("file", tmp_path), JsonlSink(tmp_path / "metrics.jsonl"))
    batch = trainer.next_batch()
    assert [s.sample_id for s in batch] == ["s2", "s3", "s4", "s5"]
    assert trainer.consumed == 6 and trainer.dropped_stale == 2
    assert trainer.dropped_stale_tokens == sum(len(s.completion_token_ids) for s in stale)


def test_metrics_carry_the_lag_distribution_and_the_dropped_token_share(untrained_tiny_model: Path, tmp_path: Path) -> None:
    config = make_config(untrained_tiny_model, max_steps=1, samples_per_step=4)
    writer = FileStreamWriter(tmp_path)
    samples = make_samples(5, 10)
    for sample, version in zip(samples, [0, 3, 2, 3, 1]):  # trained at version 3, max_lag 3
        sample.token_versions = [version] * len(sample.completion_token_ids)
    samples[0].token_versions = [0] * len(samples[0].completion_token_ids)
    writer.append(samples)
    backend = make_backend(config, untrained_tiny_model)
    backend.version = 3
    config.trainer.max_steps = 4
    trainer = Trainer(config, tmp_path, backend, open_reader("file", tmp_path), JsonlSink(tmp_path / "metrics.jsonl"))
    trainer.config.actor.max_lag = 2  # sample 0 (lag 3) is dropped
    trainer.run()
    (record,) = read_metrics(tmp_path / "metrics.jsonl")
    trained = samples[1:]
    tokens = sum(len(s.completion_token_ids) for s in trained)
    dropped = len(samples[0].completion_token_ids)
    assert record["train/dropped_stale"] == 1
    assert record["train/dropped_stale_token_share"] == pytest.approx(dropped / (dropped + tokens))
    # The rollout viewer learns which sample it was (train_logprobs.jsonl, once its stream line is read).
    from rl_core.rundir.layout import TRAIN_LOGPROBS_FILE

    lines = [json.loads(line) for line in (tmp_path / TRAIN_LOGPROBS_FILE).read_text().splitlines()]
    assert [line for line in lines if "discarded" in line] == [
        {"sample_id": samples[0].sample_id, "step": 4, "consumed": 5, "discarded": "stale"}]
    by_lag = {lag: sum(len(s.completion_token_ids) for s in trained if 3 - s.token_versions[0] == lag) for lag in range(3)}
    for lag in range(3):
        assert record[f"policy_lag/share/{lag}"] == pytest.approx(by_lag[lag] / tokens)
    assert record["policy_lag/share/8+"] == 0.0


def test_checkpoint_roundtrip_restores_weights_and_optimizer(untrained_tiny_model: Path, tmp_path: Path) -> None:
    config = make_config(untrained_tiny_model)
    backend = make_backend(config, untrained_tiny_model)
    train_step(backend, make_samples(4, 6), config)
    backend.save_checkpoint(str(tmp_path / "ck"))
    restored = make_backend(config, untrained_tiny_model)
    restored.load_checkpoint(str(tmp_path / "ck"))
    assert restored.version == 1
    for (name, a), (_, b) in zip(backend.parameters_for_broadcast(), restored.parameters_for_broadcast()):
        assert torch.equal(a, b), name
    # Same optimizer state → the next step is identical too.
    batch = make_samples(4, 7)
    train_step(backend, batch, config)
    train_step(restored, batch, config)
    for (name, a), (_, b) in zip(backend.parameters_for_broadcast(), restored.parameters_for_broadcast()):
        assert torch.allclose(a, b, atol=1e-6), name


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="model.path.*no config.json"):
        TorchBackend(tmp_path / "nope")


def test_truncated_sampling_is_refused_at_config_time_naming_the_field() -> None:
    from pydantic import ValidationError

    from rl_core.config.files import format_validation_error

    with pytest.raises(ValidationError) as error:
        RunConfig.model_validate({"sampling": {"top_p": 0.9}})
    message = format_validation_error(error.value)
    assert "sampling.top_p" in message and "importance" in message
    assert RunConfig.model_validate({"sampling": {"top_p": 1.0, "temperature": 0.7}}).sampling.temperature == 0.7


def test_sharing_a_groups_prompt_and_completion_starts_leaves_the_gradient_unchanged(untrained_tiny_model: Path) -> None:
    from rl_core.trainer.loss import pack_micro_batches
    from rl_core.trainer.losses import policy_loss

    samples = make_samples(8, 11)
    for k, sample in enumerate(samples[1:4], start=1):  # a group of four on one prompt, the rest on their own
        sample.prompt_token_ids = list(samples[0].prompt_token_ids)
        # ... whose completions begin as the first one's does, each with its own values.
        sample.completion_token_ids = samples[0].completion_token_ids[:k] + sample.completion_token_ids
        sample.behaviour_logprobs = [-1.0 - 0.5 * k] * len(sample.completion_token_ids)
        sample.token_versions = [0] * len(sample.completion_token_ids)
    grads = []
    for share_prompts, share_prefixes, by_layout in ((False, False, False), (True, False, False), (True, True, False), (True, True, True)):
        backend = TorchBackend(untrained_tiny_model)
        batches = pack_micro_batches(samples, 4096, 64, share_prompts=share_prompts, share_prefixes=share_prefixes)
        for batch in batches:
            logp, _ = backend.token_logprobs(batch.input_ids, batch.attention_mask, batch.position_ids, 1.0,
                                             batch.logit_source, batch.packed_layout if by_layout else None, batch.target_ids)
            policy_loss(logp, batch, len(samples)).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in backend.model.parameters() if p.grad is not None]))
        if share_prefixes:  # the group's prompt once (3 x 5 tokens saved) and its shared starts once (1 + 2 + 3)
            computed = sum(int((batch.input_ids != 0).sum()) for batch in batches)  # token ids are >= 10, padding 0
            assert computed == sum(len(s.prompt_token_ids) + len(s.completion_token_ids) for s in samples) - 3 * 5 - (1 + 2 + 3)
    for grad in grads[1:]:
        assert torch.allclose(grads[0], grad, atol=1e-5, rtol=1e-4)


def test_zero_advantage_samples_count_in_the_step_but_are_not_computed(untrained_tiny_model: Path) -> None:
    """A step whose batch holds an all-equal group (advantage 0, kept as TRL keeps it) has the
    gradient of computing every sample, divided by the whole batch, but only the informative
    samples' tokens go through the model."""
    from rl_core.trainer.loss import pack_micro_batches
    from rl_core.trainer.losses import policy_loss

    samples = make_samples(8, 5)
    for sample in samples[4:]:
        sample.advantage = 0.0
    config = make_config(untrained_tiny_model, micro_batch_tokens=4096)
    everything = TorchBackend(untrained_tiny_model)
    for batch in pack_micro_batches(samples, 4096):
        logp, _ = everything.token_logprobs(
            batch.input_ids, batch.attention_mask, batch.position_ids, 1.0, batch.logit_source, None, batch.target_ids)
        policy_loss(logp, batch, len(samples)).loss.backward()
    skipping = TorchBackend(untrained_tiny_model)
    skipping.optimizer_step = lambda: {}  # stop before the step to read the accumulated gradient
    stats, _ = train_step(skipping, samples, config)

    def gradient(backend: TorchBackend) -> torch.Tensor:
        return torch.cat([p.grad.flatten() for p in backend.model.parameters() if p.grad is not None])

    assert torch.allclose(gradient(everything), gradient(skipping), atol=1e-6, rtol=1e-5)
    assert stats.num_tokens == sum(len(s.completion_token_ids) for s in samples[:4])
    assert stats.num_samples == 8


def test_a_kl_penalty_or_an_all_zero_batch_still_computes_samples() -> None:
    """With a KL penalty a zero-advantage token still has a gradient; a batch with no
    informative sample keeps one so every rank runs a forward."""
    from rl_core.trainer.loss import samples_with_gradient

    samples = make_samples(4, 6)
    samples[1].advantage = samples[3].advantage = 0.0
    assert [s.sample_id for s in samples_with_gradient(samples, kl_coef=0.0)] == ["s0", "s2"]
    assert samples_with_gradient(samples, kl_coef=0.1) == samples
    for sample in samples:
        sample.advantage = 0.0
    assert [s.sample_id for s in samples_with_gradient(samples, kl_coef=0.0)] == ["s0"]
