"""The entropy-collapse rule judges a sustained low, not one noisy step (issue 26, defect 7), on the
platform's real alert services and database. Whether the default demo's own runs fire any alert
is measured by bench/demo_health.py on real runs (bench/RESULTS.md), not replayed from a recording
kept in the repository."""

from __future__ import annotations

from pathlib import Path

import pytest

from inflight.alerts import services as alerts
from inflight.alerts.models import Alert
from inflight.runs.models import Run
from rl_core.config.files import load_config

pytestmark = pytest.mark.django_db

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml"


def test_entropy_collapse_is_a_sustained_low_not_one_noisy_step(owner) -> None:
    """One step's train/entropy covers only its trained tokens: the demo's dipped from ~0.04 to
    0.010 for single steps (bench/RESULTS.md). The rule judges the mean of `entropy_window` steps."""
    config = load_config(DEMO_CONFIG).model_dump(mode="json")
    run = Run.objects.create(owner=owner, name="tiny-cpu", config=config, status="running")
    level = [0.04] * 30
    level[15] = 0.010  # a single noisy step: not a collapse
    records = [{"t": float(step), "step": step, "train/entropy": value} for step, value in enumerate(level, start=1)]
    records += [{"t": float(step), "step": step, "train/entropy": 0.005} for step in range(31, 46)]  # sustained
    alerts.evaluate_metric_lines(run.pk, list(enumerate(records)))
    fired = list(Alert.objects.filter(run=run).values_list("rule", "step"))
    # The mean of the last 10 first falls below 0.02 at step 36: (4 * 0.04 + 6 * 0.005) / 10 = 0.019.
    assert fired == [("entropy_collapse", 36)]
