"""Tail batching (RollPacker), sync rounds and the async window, on random finish orders.

Pure bookkeeping objects: no fakes are needed, the tests drive them exactly as the actor does
(prompt ids in, finished-response events in, decisions out)."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from rl_core.config.run_config import RunConfig, TailBatchingConfig
from rl_core.actor.tail_batching import (
    AsyncTailTracker,
    LongTailHistory,
    TailBatchPlanner,
    make_async_tail_tracker,
    make_tail_planner,
)


# ---------------------------------------------------------------------------------------------
# Tail batching, sync rounds
# ---------------------------------------------------------------------------------------------


class _Source:
    """Fresh prompt ids p0, p1, ... up to `limit`, recording everything handed out."""

    def __init__(self, limit: int | None = None) -> None:
        self.counter = itertools.count()
        self.drawn: list[str] = []
        self.limit = limit

    def __call__(self, k: int) -> list[str]:
        out = []
        for _ in range(k):
            if self.limit is not None and len(self.drawn) >= self.limit:
                break
            prompt_id = f"p{next(self.counter)}"
            self.drawn.append(prompt_id)
            out.append(prompt_id)
        return out


def _run_round(planner: TailBatchPlanner, source: _Source, rng: random.Random, long_prompts: set[str]):
    round_ = planner.plan_round(source)
    # Every response gets a random finish time; "long" prompts are much slower.
    events = []
    for prompt_id in round_.prompt_ids:
        for key in range(round_.responses_per_prompt):
            slow = 20.0 if prompt_id in long_prompts else 1.0
            events.append((rng.random() * slow, prompt_id, key))
    events.sort()
    kept_events: dict[str, list[int]] = {}
    for _, prompt_id, key in events:
        if round_.done:
            break
        if round_.on_response(prompt_id, key):
            kept_events.setdefault(prompt_id, []).append(key)
    return round_, planner.close_round(round_), kept_events


@pytest.mark.parametrize("seed", range(20))
def test_tail_batching_never_loses_or_repeats_a_prompt(seed: int) -> None:
    rng = random.Random(seed)
    batch, group = rng.choice([(4, 4), (8, 2), (5, 3)])
    config = TailBatchingConfig(enabled=True, prompt_overprovision=rng.choice([1.25, 1.5]), response_overprovision=1.25)
    planner = TailBatchPlanner(batch, group, config)
    source = _Source()
    long_prompts: set[str] = set()
    trained: list[str] = []
    saw_long_round = False
    for _ in range(30):
        round_, outcome, kept_events = _run_round(planner, source, rng, long_prompts)
        if round_.kind == "long":
            saw_long_round = True
            assert round_.responses_per_prompt == group and len(round_.prompt_ids) == batch
            assert outcome.deferred == [] and outcome.aborted == 0
            assert planner.metrics()["sched/round"] == 1.0
        else:
            assert round_.kind == "short"
            assert len(round_.prompt_ids) == math.ceil(batch * config.prompt_overprovision)
            assert round_.responses_per_prompt == math.ceil(group * config.response_overprovision)
            assert planner.metrics()["sched/round"] == 0.0
            assert planner.metrics()["sched/aborted"] == outcome.aborted > 0
        assert len(outcome.kept) == batch
        # Held responses of kept prompts are exactly the trained ones; partial groups are dropped.
        assert outcome.kept == {prompt_id: kept_events[prompt_id] for prompt_id in outcome.kept}
        assert set(kept_events) - set(outcome.kept) <= set(outcome.deferred)
        for prompt_id, keys in outcome.kept.items():
            assert len(keys) == group and len(set(keys)) == group
        trained.extend(outcome.kept)
        # The invariant: trained exactly once, or waiting in the long-tail queue.
        assert len(trained) == len(set(trained))
        assert sorted(trained + planner.pending()) == sorted(source.drawn)
        assert planner.metrics()["sched/long_tail_queue"] == len(planner.pending())
        # Some deferred prompts are slow again when they run in a long round (the long tail).
        for prompt_id in outcome.deferred:
            if rng.random() < 0.5:
                long_prompts.add(prompt_id)
    assert saw_long_round


def test_long_round_waits_for_every_prompt_and_plain_rounds_when_disabled() -> None:
    config = TailBatchingConfig(enabled=True)
    planner = TailBatchPlanner(2, 2, config)
    planner.long_tail.extend(["x", "y"])
    round_ = planner.plan_round(_Source())
    assert round_.kind == "long" and round_.prompt_ids == ["x", "y"]
    assert round_.on_response("x", 0) and round_.on_response("x", 1)
    with pytest.raises(RuntimeError, match="closed before all 2 prompts finished"):
        planner.close_round(round_)
    with pytest.raises(RuntimeError, match="still open"):
        planner.plan_round(_Source())
    with pytest.raises(ValueError, match="reported twice"):
        round_.on_response("x", 1)
    with pytest.raises(KeyError, match="not part of round"):
        round_.on_response("zzz", 0)
    with pytest.raises(ValueError, match="outside"):
        round_.on_response("y", 5)
    assert round_.on_response("y", 1) and round_.on_response("y", 0)
    assert round_.done
    outcome = planner.close_round(round_)
    assert outcome.kept == {"x": [0, 1], "y": [1, 0]} and outcome.deferred == []

    plain = make_tail_planner(RunConfig.model_validate({"actor": {"group_size": 3}}), batch_prompts=4)
    source = _Source()
    round_ = plain.plan_round(source)
    assert round_.kind == "plain" and len(round_.prompt_ids) == 4 and round_.responses_per_prompt == 3


def test_short_round_surplus_responses_are_dropped_and_late_ones_refused() -> None:
    planner = TailBatchPlanner(1, 2, TailBatchingConfig(enabled=True, prompt_overprovision=2.0, response_overprovision=1.5))
    round_ = planner.plan_round(_Source())
    assert round_.prompt_ids == ["p0", "p1"] and round_.responses_per_prompt == 3
    assert round_.on_response("p1", 2)
    assert round_.prompts_to_abort() == []
    assert round_.on_response("p1", 0)
    assert round_.done and round_.prompts_to_abort() == ["p0", "p1"]
    assert not round_.on_response("p0", 0)  # arrived after the round was done: not trained
    outcome = planner.close_round(round_)
    assert outcome.kept == {"p1": [2, 0]} and outcome.deferred == ["p0"]
    assert outcome.aborted == 6 - 2


def test_data_running_out_shrinks_the_short_round() -> None:
    planner = TailBatchPlanner(4, 1, TailBatchingConfig(enabled=True))
    round_ = planner.plan_round(_Source(limit=3))
    assert len(round_.prompt_ids) == 3 and round_.keep_prompts == 3


def test_long_tail_history_flags_groups_far_above_the_typical_median() -> None:
    history = LongTailHistory(long_factor=2.0, min_groups=4)
    history.record_group("a", [10, 30, 20])
    history.record_group("d", [200, 180, 30])
    assert not history.is_long("d") and history.threshold() is None  # too few groups to know what is typical
    for prompt_id, lengths in (("b", [20]), ("c", [22])):
        history.record_group(prompt_id, lengths)
    # Group medians 20, 180, 20, 22: typical (low median) 20, so long means a median above 40.
    assert history.threshold() == 40.0
    assert history.is_long("d") and not history.is_long("c") and not history.is_long("unseen")
    history.record_group("d", [21, 19])  # long once, short when it ran again
    assert not history.is_long("d")
    history.record_group("c", [90, 95])
    history.record_group("c", [])  # an empty group teaches nothing: c stays long
    assert history.is_long("c")
    with pytest.raises(ValueError, match="long_factor"):
        LongTailHistory(long_factor=1.0)


class _EpochSource:
    """The same `count` prompt ids every epoch, skipping one still queued from an earlier epoch
    (as the actor does); records (prompt, epoch) handed out."""

    def __init__(self, count: int, planner: TailBatchPlanner) -> None:
        self.count, self.planner = count, planner
        self.position = 0
        self.drawn: list[tuple[str, int]] = []
        self.short_launches: dict[str, int] = {}  # prompt -> times launched in a short round
        self.short_in_long_rounds = 0  # launches of always-short prompts in long rounds

    def __call__(self, k: int) -> list[str]:
        out: list[str] = []
        while len(out) < k:
            prompt_id, epoch = f"p{self.position % self.count}", self.position // self.count
            self.position += 1
            if prompt_id in self.planner.long_tail or prompt_id in out:
                continue
            self.drawn.append((prompt_id, epoch))
            out.append(prompt_id)
        return out


def _run_epochs(defer_from_history: bool, seed: int) -> tuple[TailBatchPlanner, list[dict[str, float]], list[str], _EpochSource]:
    """Rounds over 24 prompts for 4 epochs; p0..p3 always run long, p4 only the first time (bad luck)."""
    rng = random.Random(seed)
    config = TailBatchingConfig(enabled=True, defer_from_history=defer_from_history)
    planner = TailBatchPlanner(4, 4, config)
    source = _EpochSource(24, planner)
    metrics, trained = [], []
    launched: set[str] = set()
    while source.position < 4 * 24:
        round_ = planner.plan_round(source)
        for prompt_id in round_.prompt_ids if round_.kind == "short" else []:
            source.short_launches[prompt_id] = source.short_launches.get(prompt_id, 0) + 1
        if round_.kind == "long":
            source.short_in_long_rounds += len(set(round_.prompt_ids) - {"p0", "p1", "p2", "p3", "p4"})
        events = []
        for prompt_id in round_.prompt_ids:
            for key in range(round_.responses_per_prompt):
                long = prompt_id in {"p0", "p1", "p2", "p3"} or (prompt_id == "p4" and prompt_id not in launched)
                length = int((200 if long else 20) * (0.8 + 0.4 * rng.random()))
                events.append((length, prompt_id, key))
        launched.update(round_.prompt_ids)
        for length, prompt_id, key in sorted(events):
            if round_.done:
                break
            round_.on_response(prompt_id, key, length)
        trained.extend(planner.close_round(round_).kept)
        metrics.append(planner.metrics())
    return planner, metrics, trained, source


@pytest.mark.parametrize("seed", range(5))
def test_history_sends_known_long_prompts_straight_to_long_rounds(seed: int) -> None:
    planner, metrics, trained, source = _run_epochs(True, seed)
    _, off_metrics, _, _ = _run_epochs(False, seed)
    # Nothing lost or repeated: every drawn prompt is trained once per draw, or still queued.
    assert sorted(trained + planner.pending()) == sorted(prompt_id for prompt_id, _ in source.drawn)
    assert sum(m["sched/deferred_from_history"] for m in off_metrics) == 0
    pre_deferred = sum(m["sched/deferred_from_history"] for m in metrics)
    assert pre_deferred >= 4 * 2  # p0..p3 in each of epochs 2-4 (one may still sit in the queue)
    assert all(planner.history.is_long(prompt_id) for prompt_id in ("p0", "p1", "p2", "p3"))
    # What it saves: a long prompt takes a short-round slot (to decode until it is cut) in its
    # first epoch (and while the first groups set the threshold), instead of in every epoch ...
    always_long = ("p0", "p1", "p2", "p3")
    assert sum(source.short_launches.get(prompt_id, 0) for prompt_id in always_long) <= 6
    off_source = _run_epochs(False, seed)[3]
    assert sum(off_source.short_launches.get(prompt_id, 0) for prompt_id in always_long) >= 10
    # ... and p4, long once by bad luck, short when it ran whole, is back in short rounds.
    assert source.short_launches["p4"] >= 2
    # Short prompts that a short round cut (its over-provisioning always cuts some) retry in the
    # next short round instead of taking long rounds' slots.
    assert source.short_in_long_rounds < off_source.short_in_long_rounds


def _teach_long(history: LongTailHistory, prompt_ids: list[str]) -> None:
    for index in range(history.min_groups):
        history.record_group(f"short{index}", [10])
    for prompt_id in prompt_ids:
        history.record_group(prompt_id, [100])


def test_history_deferral_refuses_a_prompt_already_queued() -> None:
    planner = TailBatchPlanner(2, 1, TailBatchingConfig(enabled=True))
    _teach_long(planner.history, ["p0"])
    planner.long_tail.append("p0")
    with pytest.raises(ValueError, match="already in the long-tail queue"):
        planner.plan_round(lambda k: ["p0"])


def test_all_drawn_prompts_known_long_runs_the_queue() -> None:
    planner = TailBatchPlanner(2, 1, TailBatchingConfig(enabled=True))
    _teach_long(planner.history, ["a", "b", "c"])
    pool = iter(["a", "b", "c"])
    round_ = planner.plan_round(lambda k: list(itertools.islice(pool, k)))
    assert round_.kind == "long" and round_.prompt_ids == ["a", "b"] and list(planner.long_tail) == ["c"]


# ---------------------------------------------------------------------------------------------
# Tail batching, async rolling window
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(10))
def test_async_tail_tracker_trains_each_prompt_once(seed: int) -> None:
    rng = random.Random(seed)
    window, group = 4, 3
    tracker = AsyncTailTracker(window, group, TailBatchingConfig(enabled=True))
    source = _Source(limit=40)
    slow = {f"p{index}" for index in range(40) if rng.random() < 0.2}
    clock = 0.0
    running: dict[str, tuple[str, str]] = {}  # group id -> (prompt id, kind)
    pending_events: list[tuple[float, str, int]] = []
    trained: list[str] = []
    kept_count: dict[str, int] = {}
    group_ids = itertools.count()
    saw_long = False

    def launch() -> bool:
        choice = tracker.next_prompt(source)
        if choice is None:
            return False
        prompt_id, kind = choice
        group_id = f"g{next(group_ids)}"
        responses = tracker.launch(group_id, prompt_id, kind)
        running[group_id] = (prompt_id, kind)
        for key in range(responses):
            duration = rng.random() * (30.0 if prompt_id in slow and kind != "long" else 1.0)
            pending_events.append((clock + duration, group_id, key))
        return True

    while len(running) < window and launch():
        pass
    while running:
        pending_events.sort()
        clock, group_id, _ = pending_events.pop(0)
        if not tracker.is_open(group_id):
            continue
        keep, to_abort = tracker.on_response(group_id)
        assert keep
        kept_count[group_id] = kept_count.get(group_id, 0) + 1
        if kept_count[group_id] == group:
            prompt_id, kind = running.pop(group_id)
            saw_long |= kind == "long"
            trained.append(prompt_id)
        for aborted in to_abort:
            running.pop(aborted, None)
            pending_events = [event for event in pending_events if event[1] != aborted]
        while len(running) < window and launch():
            pass
    assert len(trained) == len(set(trained)), "a prompt was trained twice"
    assert sorted(trained) == sorted(source.drawn), "a prompt was lost"
    assert tracker.long_tail == type(tracker.long_tail)()
    assert saw_long or not any(p in slow for p in source.drawn)


def test_async_tracker_disabled_is_plain() -> None:
    tracker = AsyncTailTracker(2, 4, TailBatchingConfig(enabled=False))
    prompt_id, kind = tracker.next_prompt(_Source())
    assert kind == "plain" and tracker.launch("g0", prompt_id, kind) == 4
    for _ in range(3):
        assert tracker.on_response("g0") == (True, [])
    assert tracker.on_response("g0") == (True, [])
    assert not tracker.is_open("g0")
    assert tracker.on_response("g0") == (False, [])


def test_flush_round_trains_what_is_left_in_the_queue() -> None:
    planner = TailBatchPlanner(3, 1, TailBatchingConfig(enabled=True))
    assert planner.plan_flush_round() is None
    planner.long_tail.extend(["a", "b"])
    round_ = planner.plan_flush_round()
    assert round_ is not None and round_.kind == "long" and round_.prompt_ids == ["a", "b"]
    assert round_.responses_per_prompt == 1 and round_.keep_prompts == 2
    round_.on_response("b", 0)
    round_.on_response("a", 0)
    outcome = planner.close_round(round_)
    assert set(outcome.kept) == {"a", "b"} and planner.pending() == []


def test_factories_size_the_planners_from_the_run_config() -> None:
    config = RunConfig.model_validate(
        {
            "sync_steps_per_batch": 2,
            "trainer": {"samples_per_step": 32},
            "actor": {"group_size": 8, "groups_in_flight": 6},
            "accelerations": {"tail_batching": {"enabled": True}},
        }
    )
    planner = make_tail_planner(config)
    assert planner.batch_prompts == 8 and planner.group_size == 8 and planner.config.enabled
    tracker = make_async_tail_tracker(config)
    # Response over-provisioning is off by default (it biases training towards short answers).
    assert tracker.window == 6 and tracker.group_size == 8 and tracker.responses_for("short") == 8


def test_async_tracker_counts_surplus_and_deferred_aborts() -> None:
    tracker = AsyncTailTracker(2, 2, TailBatchingConfig(enabled=True, prompt_overprovision=1.25, response_overprovision=1.5))
    assert tracker.overtake_limit == 1
    for group_id, prompt_id in (("g0", "a"), ("g1", "b"), ("g2", "c")):
        assert tracker.launch(group_id, prompt_id, "short") == 3
    assert tracker.on_response("g0") == (True, [])
    # g1 completes: its one surplus request is aborted; g0 is overtaken once (limit 1, not yet deferred).
    assert tracker.on_response("g1") == (True, [])
    assert tracker.on_response("g1") == (True, ["g1"])
    # g2 completes: g0 is overtaken a second time and deferred with its 2 unfinished requests.
    tracker.on_response("g2")
    keep, to_abort = tracker.on_response("g2")
    assert keep and to_abort == ["g2", "g0"]
    assert list(tracker.long_tail) == ["a"] and not tracker.is_open("g0")
    metrics = tracker.metrics()
    assert metrics["sched/aborted"] == 1 + 1 + 2
    assert metrics["sched/long_tail_queue"] == 1 and metrics["sched/round"] == 0.0
    assert tracker.metrics()["sched/aborted"] == 0
