"""Alert rules on the ingest path cost no write while nothing fires: every metrics line clears
every quiet rule, and an UPDATE per cleared rule per line was a quarter of ingest time at 200 live
runs (bench/platform_scale.py, py-spy). Firing and clearing episodes: tests/platform/test_alerts.py."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

pytestmark = pytest.mark.django_db


def test_quiet_lines_write_no_episode(owner: Any, tiny_config: dict) -> None:
    from inflight.alerts.models import AlertEpisode
    from inflight.alerts.services import evaluate_metric_lines
    from inflight.runs import services

    run = services.create_run(owner, "quiet", tiny_config)
    lines = [(n, {"t": 1_700_000_000.0 + n, "step": n, "reward/mean": 0.5, "success/mean": 0.5, "train/loss": 1.0}) for n in range(20)]
    with CaptureQueriesContext(connection) as queries:
        evaluate_metric_lines(run.pk, lines)
    episode_writes = [q["sql"] for q in queries.captured_queries if "alerts_alertepisode" in q["sql"] and not q["sql"].startswith("SELECT")]
    assert episode_writes == []
    assert len(queries.captured_queries) < 12, len(queries.captured_queries)
    assert not AlertEpisode.objects.filter(run=run, active=True).exists()
