"""The default demo's own run raises no alert on the real platform (issue 26, defect 7).

A run of examples/tiny-cpu.yaml, recorded by bench/demo_health.py (fixtures/demo_run/: the
metrics.jsonl lines cut to the fields the alert rules read, and evals.jsonl), goes through the
platform's real alert services on the real database, as the worker feeds them: every metrics
line to `evaluate_metric_lines`, every evaluation to `ingest_eval` then `evaluate_eval`. Not
timed; the recording is checked to be of the demo as it is configured today."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from inflight.alerts import services as alerts
from inflight.alerts.models import Alert
from inflight.runs import services
from inflight.runs.models import Run
from rl_core.config import load_config
from tests.metrics_file import read_metrics

pytestmark = pytest.mark.django_db

REPO = Path(__file__).resolve().parents[2]
DEMO_CONFIG = REPO / "examples" / "tiny-cpu.yaml"
RECORDING = Path(__file__).parent / "fixtures" / "demo_run"
# What decides how the demo learns; the recording must have been made with today's values.
# (model.path is left out: the recording holds the resolved cache directory.)
LEARNING_SECTIONS = ("task", "sampling", "actor", "trainer", "eval", "monitoring")


def test_recording_is_of_todays_demo() -> None:
    """Every setting the recording has must still have its value (settings added since are not
    in it: they take their defaults, which a change of behaviour would show elsewhere)."""
    recorded = yaml.safe_load((RECORDING / "config.yaml").read_text())
    today = load_config(DEMO_CONFIG).model_dump(mode="json")
    changed = [
        f"{section}.{key}: recorded {value!r}, today {today[section][key]!r}"
        for section in LEARNING_SECTIONS for key, value in recorded[section].items()
        if key in today[section] and today[section][key] != value
    ]
    assert changed == [], "the demo changed since it was recorded: re-record with bench/demo_health.py --record"


def test_recorded_demo_run_fires_no_alert(owner) -> None:
    config = load_config(DEMO_CONFIG).model_dump(mode="json")
    run = Run.objects.create(owner=owner, name="tiny-cpu", config=config, status="running")
    metrics = read_metrics(RECORDING / "metrics.jsonl")
    assert max(int(record.get("step", 0)) for record in metrics) == config["trainer"]["max_steps"]
    alerts.evaluate_metric_lines(run.pk, list(enumerate(metrics)))
    evals = read_metrics(RECORDING / "evals.jsonl")
    assert {line["benchmark"] for line in evals} == {"heldout"}
    for line in evals:
        alerts.evaluate_eval(run.pk, services.ingest_eval(run.pk, line, []))
    fired = [(a.rule, a.step, a.message) for a in Alert.objects.filter(run=run).order_by("id")]
    assert fired == []


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
