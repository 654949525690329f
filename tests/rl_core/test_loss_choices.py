"""The loss choices around the objectives themselves (test_losses_reference.py checks those): which
importance corrections each loss allows, Dr. GRPO's advantages, and DAPO's dynamic sampling, where
a zero-advantage group's prompt is drawn again, a bounded number of times, through the same
max_lag throttle as any group."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from rl_core.actor.loop import Actor
from rl_core.envs.advantages import divides_by_group_std, group_advantages
from rl_core.config.run_config import IS_CORRECTIONS_BY_LOSS, RunConfig
from rl_core.config.files import ConfigError, parse_config
from rl_core.rundir.metrics import JsonlSink
from rl_core.rundir.stream import FileStreamReader, FileStreamWriter
from rl_core.actor.submission import PromptSource, ZeroAdvantageGroups
from rl_core.envs.problems import Problem
from tests.metrics_file import read_metrics
from tests.rl_core.test_actor import SlowGroupClient, actor_config, publish, wait_until


def test_each_loss_refuses_the_corrections_it_cannot_use_naming_the_field() -> None:
    for loss, allowed in IS_CORRECTIONS_BY_LOSS.items():
        assert parse_config({"trainer": {"loss": loss}}).trainer.importance_correction() == allowed[0]
        for correction in ("tis", "mis", "none"):
            data = {"trainer": {"loss": loss, "is_correction": correction}}
            if correction in allowed:
                assert parse_config(data).trainer.importance_correction() == correction
            else:
                with pytest.raises(ConfigError, match=rf"^trainer\.is_correction: .*'{correction}' is not allowed with "
                                                      rf"trainer\.loss '{loss}'"):
                    parse_config(data)


def test_dr_grpo_advantages_are_never_divided_by_the_std_and_dapo_refuses_tail_batching() -> None:
    rewards = [1.0, 0.0, 0.0, 0.0]
    assert divides_by_group_std("group_mean_std", "grpo_clip")
    assert not divides_by_group_std("group_mean_std", "dr_grpo") and not divides_by_group_std("group_mean", "grpo_clip")
    assert group_advantages(rewards, normalize_std=divides_by_group_std("group_mean", "dr_grpo")) == [0.75, -0.25, -0.25, -0.25]
    # The run defaults divide by the std (RUN_DEFAULTS): dr_grpo is chosen over them, not refused.
    assert parse_config({"trainer": {"loss": "dr_grpo"}, "actor": {"advantage": "group_mean_std"}}).trainer.loss == "dr_grpo"
    with pytest.raises(ConfigError, match="trainer.loss: 'dapo' .* tail batching"):
        parse_config({"trainer": {"loss": "dapo"}, "accelerations": {"tail_batching": {"enabled": True}}})


def test_a_zero_advantage_prompt_is_drawn_again_next_at_most_max_resamples_times() -> None:
    problems = [Problem(id=f"p{i}", problem=f"q{i}", answer="1") for i in range(4)]
    prompts = PromptSource(iter([(0, problem) for problem in problems]))
    groups = ZeroAdvantageGroups(drops=True, max_resamples=2)
    first = prompts.draw()
    drawn = [first[1].id]
    for _ in range(3):  # three all-equal groups in a row: drawn again twice, then dropped for good
        assert groups.on_group(*first, informative=False)
        groups.return_prompts(prompts)
        first = prompts.draw()
        drawn.append(first[1].id)
    assert drawn == ["p0", "p0", "p0", "p1"] and groups.take_count() == 2
    # An informative group resets the prompt's count; keeping (the default) never drops.
    assert groups.on_group(0, problems[2], informative=False) and not groups.on_group(0, problems[2], informative=True)
    assert groups.resamples == {}
    keeping = ZeroAdvantageGroups(drops=False, max_resamples=0)
    assert not keeping.on_group(0, problems[3], informative=False) and not keeping.waiting
    assert ZeroAdvantageGroups.from_config(RunConfig.model_validate({"trainer": {"loss": "dapo"}})).max_resamples == 3
    assert ZeroAdvantageGroups.from_config(RunConfig()).drops is False


class ZeroThenMixedClient(SlowGroupClient):
    """The first `zero_groups[prompt]` groups of a prompt all answer wrong (advantage 0); then half
    of each group is right, as in SlowGroupClient. Records the prompt of every training request."""

    def __init__(self, answers: dict[str, str], zero_groups: dict[str, int]) -> None:
        super().__init__(answers, slow_calls=set(), base_delay_s=0.02)
        self.zero_groups = dict(zero_groups)
        self.requested: list[str] = []

    async def generate(self, messages, sampling, n: int = 1, prompt_id=None, request_id_prefix=None):
        results = await super().generate(messages, sampling, n, prompt_id, request_id_prefix)
        if prompt_id is None:
            return results
        self.requested.append(prompt_id)
        if self.zero_groups.get(prompt_id, 0) > 0:
            self.zero_groups[prompt_id] -= 1
            for result in results:
                result.text = "so the answer is \\boxed{-12345}"
        return results


@pytest.mark.timeout(300)
async def test_dapo_resamples_zero_advantage_groups_within_the_lag_bound(untrained_tiny_model: Path, tmp_path: Path) -> None:
    """DAPO's dynamic sampling in a running actor: the first prompt answers all-wrong forever (drawn
    again twice, then dropped), the second all-wrong once (drawn again, then trained). No
    zero-advantage sample reaches the stream, and no token is trained past max_lag."""
    from rl_core.envs.problems import load_task

    config = actor_config(untrained_tiny_model, actor={"group_size": 4, "groups_in_flight": 4, "max_lag": 1,
                                             "dynamic_sampling_max_resamples": 2},
                          trainer={"samples_per_step": 8, "loss": "dapo"})
    task = load_task(config.task)
    order = [problem.id for _, (_, problem) in zip(range(2), task.train_stream())]
    client = ZeroThenMixedClient({p.id: p.answer for p in task.train}, {order[0]: 100, order[1]: 1})
    writer = FileStreamWriter(tmp_path)
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    actor = Actor(config, tmp_path, [client], writer, sink, task=task)
    runner = asyncio.create_task(actor.run())
    reader = FileStreamReader(tmp_path)
    version, consumed, lags, trained = 0, 0, [], []
    await wait_until(lambda: writer.count() >= 4, timeout_s=60)
    publish(tmp_path, version, consumed)
    while version < 6:  # the trainer, played here (as in test_actor)
        batch = []
        while len(batch) < 8:
            batch += reader.read(8 - len(batch), 0.0)
            await asyncio.sleep(0.01)
        lags += [version - v for sample in batch for v in sample.token_versions]
        trained += batch
        consumed += len(batch)
        version += 1
        client.version = version
        publish(tmp_path, version, consumed)
    publish(tmp_path, version, consumed, done=True)
    await asyncio.wait_for(runner, 120)
    sink.close()

    assert max(lags) <= 1
    assert all(sample.advantage != 0.0 for sample in trained)
    assert client.requested.count(order[0]) == 3  # once, then drawn again max_resamples = 2 times
    assert client.requested.count(order[1]) == 2 and order[1] in {s.prompt_id for s in trained}
    assert order[0] not in {s.prompt_id for s in trained}
    resampled = sum(line.get("rollout/resampled_zero_advantage_groups", 0.0) for line in read_metrics(tmp_path / "metrics.jsonl"))
    assert resampled == 3
