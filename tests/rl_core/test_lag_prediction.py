"""The lag prediction (`rl_core/actor/lag_prediction.py`): bounded by max_lag as the actor's throttle
bounds a run, growing with what runs ahead of the trainer, the sync closed form, and torch-free
(the platform imports it)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from rl_core.actor.lag_prediction import LAG_BINS, LagAssumptions, predict_lag
from rl_core.config.run_config import RunConfig


def config(**sections: dict) -> RunConfig:
    base = {
        "actor": {"group_size": 8, "groups_in_flight": 8, "max_lag": 2},
        "trainer": {"samples_per_step": 64, "max_steps": 100},
        "sampling": {"max_new_tokens": 48},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return RunConfig.model_validate(base)


def test_the_bound_holds_and_without_it_more_in_flight_means_more_lag() -> None:
    narrow = predict_lag(config())
    wide = predict_lag(config(actor={"groups_in_flight": 32}))
    assert len(narrow.shares) == LAG_BINS and sum(narrow.shares) == pytest.approx(1.0)
    # With the throttle (as a run keeps it) nothing is trained past max_lag.
    for prediction in (narrow, wide):
        assert sum(prediction.shares[prediction.max_lag + 1:]) == 0
    # 256 samples in flight against 64 a step run further ahead than 64 do.
    assert wide.unbounded_mean > narrow.unbounded_mean + 0.5
    assert wide.share_past_max_lag > narrow.share_past_max_lag
    assert wide.mean >= narrow.mean


def test_a_slower_trainer_leaves_generation_further_ahead() -> None:
    fast = predict_lag(config(), LagAssumptions(train_per_token_s=0.00001))
    slow = predict_lag(config(), LagAssumptions(train_per_token_s=0.003))
    assert slow.mean > fast.mean


def test_sync_mode_is_the_closed_form_of_its_batches() -> None:
    prediction = predict_lag(RunConfig.model_validate({"mode": "sync", "sync_steps_per_batch": 4, "actor": {"max_lag": 2}}))
    assert prediction.shares[:4] == pytest.approx([0.25] * 4) and prediction.mean == pytest.approx(1.5)
    assert prediction.share_past_max_lag == pytest.approx(0.25) and prediction.simulated_steps == 0


def test_a_prediction_is_fast_enough_to_follow_the_form() -> None:
    started = time.perf_counter()
    predict_lag(config(actor={"groups_in_flight": 32}, inference={"num_servers": 4}))
    # The create page asks again at each edit; generous for a loaded 2-core machine.
    assert time.perf_counter() - started < 10


def test_it_imports_without_torch() -> None:
    code = "import sys, rl_core.actor.lag_prediction; print('torch' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
