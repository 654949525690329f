"""Metric names have one owner (rl_core/common/metric_names.py): the pages name and describe each
series from it, and their scripts read the names from the page, never spelling one themselves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from inflight.runs import services
from inflight.live.ingest import PointIn
from inflight.web.selectors import SPARKLINE_METRICS, TRIAGE_METRICS
from inflight.live import ingest as live_ingest
from rl_core.common import metric_names as mn

REPO = Path(__file__).resolve().parents[2]


def test_the_run_lists_reward_column_describes_the_actors_series_not_the_trainers_batch() -> None:
    metric, header, title = TRIAGE_METRICS["reward"]
    assert metric == mn.ROLLOUT_REWARD_MEAN and header == "Reward"
    # reward/mean is the actor's latest rollouts; "the latest training batch" is train/reward_mean.
    assert title == mn.DESCRIPTIONS[mn.ROLLOUT_REWARD_MEAN] and "training batch" not in title
    assert "batch trained" in mn.DESCRIPTIONS[mn.TRAIN_REWARD_MEAN]
    for metric, _header, title in TRIAGE_METRICS.values():
        assert title == mn.DESCRIPTIONS[metric], metric
    assert set(SPARKLINE_METRICS) <= set(mn.DESCRIPTIONS)


@pytest.mark.django_db
def test_the_run_list_hands_the_pages_their_metric_names_and_describes_each_column(owner) -> None:
    run = services.create_run(owner, "named", {})
    live_ingest.ingest_metrics(run.pk, [PointIn(line=0, name=mn.ROLLOUT_REWARD_MEAN, step=0, t=1.0, value=0.5)])
    client = Client()
    client.force_login(owner)
    html = client.get(reverse("web:run_list")).content.decode()
    blob = re.search(r'<script id="metric-names" type="application/json">(.*?)</script>', html, re.S)
    assert blob is not None and json.loads(blob.group(1)) == mn.METRIC_NAMES_FOR_PAGES
    assert f'title="{mn.DESCRIPTIONS[mn.ROLLOUT_REWARD_MEAN]} ({mn.ROLLOUT_REWARD_MEAN})"' in html
    assert f'data-spark="{mn.ROLLOUT_REWARD_MEAN}"' in html and f'data-spark="{mn.HELDOUT_SUCCESS}"' in html


def test_no_script_or_template_spells_a_metric_name_the_page_context_hands_it() -> None:
    files = [*(REPO / "static" / "inflight").glob("*.js"), *(REPO / "templates").rglob("*.html")]
    spelled = [f"{path.relative_to(REPO)}: {name}" for path in files for name in mn.METRIC_NAMES_FOR_PAGES.values()
               if re.search(rf"""["']{re.escape(name)}["']""", path.read_text())]
    assert spelled == []
