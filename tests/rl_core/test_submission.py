"""The actor's small submission objects without servers: the prompt order (`PromptSource`),
the eval schedule, the sync-batch throttle, and the fan-out/abort helper on a fake client."""

from __future__ import annotations

import asyncio
from typing import Any

from rl_core.config.run_config import EvalConfig, RunConfig
from rl_core.common.contracts import GenerationResult, SamplingParams
from rl_core.actor.submission import (
    EvalSchedule, LagBound, PlainGroups, PromptSource, Request, SyncBatches, TailRounds, TailWindow, fan_out,
    make_plan, make_throttle,
)
from rl_core.envs.problems import Problem


def problem(index: int) -> Problem:
    return Problem(id=f"p{index}", problem=f"q{index}", answer=str(index))


def stream(count: int = 100):
    for index in range(count):
        yield index // 10, problem(index)


def test_prompt_source_draws_in_order_and_a_pushed_back_prompt_comes_next() -> None:
    prompts = PromptSource(stream())
    prompts.skip(2)
    first = prompts.draw()
    assert first[1].id == "p2"
    prompts.push_front(first)  # a long-tail prompt went first: the fresh one is next
    assert prompts.draw() is first
    second, third = prompts.draw(), prompts.draw()
    assert [second[1].id, third[1].id] == ["p3", "p4"]
    # Two handed back: the last one pushed is drawn first, then the stream continues unchanged.
    prompts.push_front(third)
    prompts.push_front(second)
    assert [prompts.draw()[1].id for _ in range(4)] == ["p3", "p4", "p5", "p6"]


def test_prompt_source_skip_counts_handed_back_prompts() -> None:
    prompts = PromptSource(stream())
    item = prompts.draw()
    prompts.push_front(item)
    prompts.skip(3)
    assert prompts.draw()[1].id == "p3"


def test_eval_schedule_heldout_at_zero_then_every_n_and_benchmarks_from_their_first_interval() -> None:
    schedule = EvalSchedule(EvalConfig(heldout_every_n_steps=3, every_n_steps=5, benchmarks=["math500"]))
    due = {version: schedule.due(version) for version in range(12)}
    assert [v for v, kinds in due.items() if "heldout" in kinds] == [0, 3, 6, 9]
    assert [v for v, kinds in due.items() if "benchmarks" in kinds] == [5, 10]
    assert schedule.final(10) == ["heldout"]  # the benchmarks already ran at 10
    assert schedule.final(9) == ["benchmarks"]
    assert schedule.final(11) == ["heldout", "benchmarks"]


def test_eval_schedule_counts_from_the_version_it_sees() -> None:
    """A version jump (a resumed run, a slow loop) evaluates once and schedules from there."""
    schedule = EvalSchedule(EvalConfig(heldout_every_n_steps=2, every_n_steps=0, benchmarks=[]))
    assert schedule.due(5) == ["heldout"]
    assert schedule.due(6) == []
    assert schedule.due(7) == ["heldout"]
    assert schedule.final(7) == []


def test_eval_schedule_without_intervals_evaluates_heldout_at_zero_and_at_the_end_only() -> None:
    schedule = EvalSchedule(EvalConfig(heldout_every_n_steps=0, every_n_steps=0, benchmarks=["math500"]))
    assert schedule.due(0) == ["heldout"]
    assert all(schedule.due(version) == [] for version in range(1, 50))
    assert schedule.final(0) == ["benchmarks"]
    assert schedule.final(49) == ["heldout", "benchmarks"]


def test_sync_batches_write_a_whole_batch_once_the_last_group_is_in() -> None:
    batches = SyncBatches(batch=4, samples_per_step=4, group_size=2)
    assert batches.may_submit(written=0, consumed=0)
    batches.on_submitted(0, 0)
    batches.on_submitted(1, 0)
    assert not batches.may_submit(0, 0)
    group: Any = ["a", "b"]
    assert batches.on_finished(0, group, written=0, idle=False) == []
    assert batches.on_finished(1, [], written=0, idle=True) == []  # dropped: refilled, not written short
    assert batches.may_submit(0, 0) and batches.launched == 2
    batches.on_submitted(2, 0)
    assert batches.on_finished(2, ["c", "d"], written=0, idle=True) == [["a", "b", "c", "d"]]  # type: ignore[list-item]
    assert not batches.may_submit(written=4, consumed=0)  # the trainer has not taken it yet
    assert batches.may_submit(written=4, consumed=4)


def test_the_config_picks_throttle_and_plan() -> None:
    base: dict[str, Any] = {"model": {"path": "unused"}}
    tail = {"accelerations": {"tail_batching": {"enabled": True}}}
    host: Any = object()
    cases = [({}, LagBound, PlainGroups), ({"mode": "sync"}, SyncBatches, PlainGroups),
             (tail, LagBound, TailWindow), ({"mode": "sync", **tail}, SyncBatches, TailRounds)]
    for extra, throttle_type, plan_type in cases:
        config = RunConfig.model_validate({**base, **extra})
        throttle = make_throttle(config)
        assert isinstance(throttle, throttle_type) and isinstance(make_plan(config, host, throttle), plan_type)
        if isinstance(throttle, SyncBatches):
            assert throttle.refill_dropped == (plan_type is PlainGroups)  # a tail round keeps exactly its batch


class FakeClient:
    def __init__(self) -> None:
        self.aborted: list[str] = []

    async def abort(self, prefixes: list[str]) -> None:
        self.aborted += prefixes


class FakeHost:
    """Responses finish in request-id order (r0 first); an aborted request ends as "abort"."""

    def __init__(self) -> None:
        self.clients = [FakeClient()]
        self.sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=4)

    async def generate_on(self, server, messages, sampling, n, prompt_id, request_id_prefix=None):
        await asyncio.sleep(0.01 * (1 + int(request_id_prefix.rsplit("r", 1)[1])))
        aborted = any(request_id_prefix.startswith(prefix) for prefix in self.clients[server].aborted)
        return [GenerationResult(request_id=request_id_prefix, prompt_token_ids=[1], token_ids=[2], logprobs=[-0.1],
                                 token_versions=[0], finish_reason="abort" if aborted else "stop")]


def test_fan_out_reports_finished_responses_and_aborts_what_the_callback_names() -> None:
    host: Any = FakeHost()
    requests = {i: Request(0, [], "p", f"g1-r{i}") for i in range(4)}
    seen: list[int] = []

    def on_result(key: int, result: GenerationResult) -> list[tuple[int, str]]:
        seen.append(key)
        return [(0, "g1")] if len(seen) == 2 else []  # two are enough: abort the rest

    asyncio.run(fan_out(host, requests, on_result))
    assert seen == [0, 1]  # r2 and r3 ended aborted: never reported
    assert host.clients[0].aborted == ["g1"]
