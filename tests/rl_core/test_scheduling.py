"""Routing (least-loaded, HistoPipe), on hand-made length lists.

These are pure bookkeeping objects: no fakes are needed, the tests drive them exactly as
the actor does (prompt ids in, finished groups' lengths in, decisions out)."""

from __future__ import annotations

import math
import random

import pytest

from rl_core.config.run_config import HistoPipeConfig, RunConfig
from rl_core.actor.scheduling import (
    HistoPipeRouter,
    LeastLoadedRouter,
    LengthPredictor,
    assign_batch,
    least_loaded,
    load_spread,
    make_router,
    pearson_correlation,
)

# ---------------------------------------------------------------------------------------------
# Routing
# ---------------------------------------------------------------------------------------------


def test_least_loaded_picks_smallest_and_breaks_ties_low() -> None:
    assert least_loaded([3, 1, 2]) == 1
    assert least_loaded([2, 1, 1]) == 1
    with pytest.raises(ValueError, match="server_loads is empty"):
        least_loaded([])
    router = LeastLoadedRouter()
    assert router.order(["b", "a"]) == ["b", "a"]
    assert router.pick("a", 4, [5, 0, 5]) == 1


def test_length_predictor_prior_then_global_mean_then_last_epoch() -> None:
    predictor = LengthPredictor(prior_len=50)
    assert predictor.predict("p") == 50
    predictor.observe("a", [10, 20])
    # Unseen prompts are predicted at the running global mean, seen ones at their own mean.
    assert predictor.predict("p") == 15
    assert predictor.predict("a") == 15
    predictor.observe("b", [100, 100])
    assert predictor.predict("p") == pytest.approx((10 + 20 + 200) / 4)
    # Only the latest epoch of a prompt counts.
    predictor.observe("a", [40, 60])
    assert predictor.predict("a") == 50
    predictor.observe("a", [])  # an aborted group teaches nothing
    assert predictor.predict("a") == 50
    with pytest.raises(ValueError, match="must be >= 0"):
        predictor.observe("a", [-1])
    with pytest.raises(ValueError, match="prior_len"):
        LengthPredictor(0)


def _long_tailed_lengths(rng: random.Random, count: int) -> dict[str, float]:
    # Most prompts are short, a few are very long: the shape RL rollouts have.
    lengths = {}
    for index in range(count):
        lengths[f"p{index}"] = rng.choice([8, 10, 12, 14]) if rng.random() < 0.8 else rng.choice([120, 200, 300])
    return lengths


def _makespan(placement: list[tuple[str, int]], lengths: dict[str, float], num_servers: int, n: int) -> float:
    per_server = [0.0] * num_servers
    for prompt_id, server in placement:
        per_server[server] += n * lengths[prompt_id]
    return max(per_server)


@pytest.mark.parametrize("seed", range(5))
def test_histopipe_balances_better_than_least_count(seed: int) -> None:
    rng = random.Random(seed)
    lengths = _long_tailed_lengths(rng, 32)
    prompts = list(lengths)
    rng.shuffle(prompts)
    num_servers, n = 4, 4

    histopipe = HistoPipeRouter(LengthPredictor(prior_len=20))
    # Epoch 1: no history, every prompt predicted alike; record the lengths they had.
    for prompt_id, server in assign_batch(histopipe, prompts, n, [0.0] * num_servers):
        histopipe.observe(prompt_id, [int(lengths[prompt_id])] * n)
    assert histopipe.predicted_load == [0.0] * num_servers  # all groups released

    # Epoch 2: the same prompts, lengths now predicted from epoch 1.
    balanced = assign_batch(histopipe, prompts, n, [0.0] * num_servers)
    baseline = assign_batch(LeastLoadedRouter(), prompts, n, [0.0] * num_servers)
    round_robin = [(prompt_id, index % num_servers) for index, prompt_id in enumerate(prompts)]
    lower_bound = max(max(lengths.values()) * n, sum(lengths.values()) * n / num_servers)

    assert sorted(p for p, _ in balanced) == sorted(prompts)
    histopipe_makespan = _makespan(balanced, lengths, num_servers, n)
    assert histopipe_makespan <= _makespan(baseline, lengths, num_servers, n)
    assert histopipe_makespan <= _makespan(round_robin, lengths, num_servers, n)
    # Greedy LPT is within 4/3 of optimal, and the optimum is at least the lower bound.
    assert histopipe_makespan <= lower_bound * 4 / 3 + 1e-9
    # Longest predicted first.
    order = [lengths[p] for p, _ in balanced]
    assert order == sorted(order, reverse=True)


def test_histopipe_balances_strictly_better_on_a_crafted_case() -> None:
    lengths = {"long0": 100, "long1": 100, "s0": 10, "s1": 10, "s2": 10, "s3": 10}
    router = HistoPipeRouter(LengthPredictor(prior_len=10))
    for prompt_id, length in lengths.items():
        router.predictor.observe(prompt_id, [length])
    # Counting groups alternates servers, which puts both long prompts on server 0 in this order.
    prompts = ["long0", "s0", "long1", "s1", "s2", "s3"]
    baseline = assign_batch(LeastLoadedRouter(), prompts, 1, [0.0, 0.0])
    assert _makespan(baseline, lengths, 2, 1) == 210
    assert _makespan(assign_batch(router, prompts, 1, [0.0, 0.0]), lengths, 2, 1) == 120


def test_histopipe_release_is_fifo_per_prompt_and_metrics_report_correlation() -> None:
    router = HistoPipeRouter(LengthPredictor(prior_len=10))
    first = router.pick("a", 2, [0, 0])
    second = router.pick("a", 2, [0, 0])
    assert first != second  # the second group sees the first one's predicted load
    assert sorted(router.predicted_load) == [20.0, 20.0]
    router.observe("a", [5, 5])
    assert router.predicted_load[first] == 0.0 and router.predicted_load[second] == 20.0
    router.observe("a", [])
    assert router.predicted_load == [0.0, 0.0]

    for prompt_id, length in [("x", 10), ("y", 50), ("z", 90)]:
        router.predictor.observe(prompt_id, [length])
    for prompt_id, length in [("x", 12), ("y", 48), ("z", 95)]:
        router.pick(prompt_id, 1, [0, 0])
        router.observe(prompt_id, [length])
    metrics = router.metrics()
    assert metrics["sched/predicted_vs_actual_len"] > 0.95
    assert "sched/load_spread" in metrics
    assert "sched/predicted_vs_actual_len" not in router.metrics()  # reset after reading


def test_helpers_and_make_router() -> None:
    assert pearson_correlation([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert pearson_correlation([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(pearson_correlation([1, 1], [1, 2]))
    with pytest.raises(ValueError, match="differ in length"):
        pearson_correlation([1], [1, 2])
    assert load_spread([10, 10]) == 0.0
    assert load_spread([5, 15]) == 1.0
    assert isinstance(make_router(RunConfig()), LeastLoadedRouter)
    config = RunConfig.model_validate({"accelerations": {"histopipe": {"enabled": True, "prior_len": 7}}})
    router = make_router(config)
    assert isinstance(router, HistoPipeRouter) and router.predictor.prior_len == 7
    assert isinstance(make_router(HistoPipeConfig(enabled=True)), HistoPipeRouter)
