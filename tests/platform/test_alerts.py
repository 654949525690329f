"""Alerts on the real database: each built-in rule fires once per episode (not once per
point), re-sent lines are not evaluated twice, the API and page show them, and the webhook
receives one Slack-compatible POST (a real local HTTP receiver)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any, Iterator

import pytest

from inflight.alerts import services as alerts
from inflight.alerts.models import Alert, AlertWebhook
from inflight.runs import evaluations
from inflight.runs.models import Run

pytestmark = pytest.mark.django_db


def make_run(owner, status: str = "running", **alert_settings: Any) -> Run:
    config = {"actor": {"max_lag": 2}, "monitoring": {"alerts": alert_settings}}
    return Run.objects.create(owner=owner, name="alerting", config=config, status=status)


def lines(start: int, *records: dict[str, Any]) -> list[tuple[int, dict[str, Any]]]:
    return [(start + i, {"t": 1.0 + i, **record}) for i, record in enumerate(records)]


def rules(run: Run) -> list[str]:
    return list(Alert.objects.filter(run=run).order_by("id").values_list("rule", flat=True))


def test_nonfinite_loss_fires_once_per_episode(owner) -> None:
    run = make_run(owner)
    nan = {"nonfinite/train/loss": 1.0, "nonfinite/train/grad_norm": 1.0}
    alerts.evaluate_metric_lines(run.pk, lines(0, {"step": 1, "train/loss": 0.5}, {"step": 2, **nan}, {"step": 3, **nan}))
    assert rules(run) == ["nonfinite"]
    alert = Alert.objects.get(run=run)
    assert alert.step == 2 and alert.values["metrics"] == ["train/loss", "train/grad_norm"]
    alerts.evaluate_metric_lines(run.pk, lines(1, {"step": 2, **nan}, {"step": 3, **nan}))  # re-sent: not again
    alerts.evaluate_metric_lines(run.pk, lines(3, {"step": 4, **nan}))  # same episode
    assert rules(run) == ["nonfinite"]
    alerts.evaluate_metric_lines(run.pk, lines(4, {"step": 5, "train/loss": 0.4}, {"step": 6, **nan}))  # recovered, then again
    assert rules(run) == ["nonfinite", "nonfinite"]


def test_collapse_lag_entropy_and_stale_rules(owner) -> None:
    run = make_run(owner, reward_window=2, reward_drop=0.3, entropy_min=0.1, entropy_window=2)
    records = [{"step": s, "train/reward_mean": r, "train/entropy": 1.0, "policy_lag/max": 1, "train/dropped_stale": 0} for s, r in
               enumerate([0.2, 0.6, 0.8, 0.8, 0.7], start=1)]
    records += [{"step": 6, "train/reward_mean": 0.3, "train/entropy": 0.05, "policy_lag/max": 3, "train/dropped_stale": 2},
                {"step": 7, "train/reward_mean": 0.2, "train/entropy": 0.01, "policy_lag/max": 3, "train/dropped_stale": 5}]
    alerts.evaluate_metric_lines(run.pk, lines(0, *records))
    assert sorted(rules(run)) == ["entropy_collapse", "policy_lag", "reward_collapse", "stale_dropped"]
    collapse = Alert.objects.get(run=run, rule="reward_collapse")
    assert collapse.step == 6 and collapse.values["best"] == pytest.approx(0.8) and collapse.values["mean"] == pytest.approx(0.5)


def test_heldout_collapse_and_eval_drop(owner, django_assert_num_queries) -> None:
    run = make_run(owner, heldout_window=1, heldout_drop=0.2, eval_drop=0.1)
    alerts.evaluate_metric_lines(run.pk, lines(0, {"step": 0, "success/heldout": 0.5}, {"step": 5, "success/heldout": 0.7}, {"step": 10, "success/heldout": 0.45}))
    assert rules(run) == ["heldout_collapse"]
    for step, score in ((10, 0.6), (20, 0.55), (30, 0.45), (40, 0.4)):
        scored = evaluations.ingest_eval(run.pk, {"benchmark": "math500", "step": step, "k": 4, "mean_at_k": score, "pass_at_k": 1.0, "num_problems": 1, "num_samples": 4}, [])
        alerts.evaluate_eval(run.pk, scored)
    assert rules(run) == ["heldout_collapse", "eval_drop"]  # once: steps 30 and 40 are one episode
    assert Alert.objects.get(rule="eval_drop").step == 30
    # The held-out set's evaluation lines (issue 26) add no eval_drop: heldout_collapse is its rule.
    for step, score in ((5, 0.7), (10, 0.45)):
        scored = evaluations.ingest_eval(run.pk, {"benchmark": "heldout", "step": step, "k": 4, "mean_at_k": score, "pass_at_k": 1.0, "num_problems": 1, "num_samples": 4}, [])
        with django_assert_num_queries(0):  # not a benchmark the rule judges: not even read
            assert alerts.evaluate_eval(run.pk, scored) == []
    assert rules(run) == ["heldout_collapse", "eval_drop"]


def test_stalled_only_while_running_and_ends_when_metrics_return(owner) -> None:
    starting = make_run(owner, status="starting", stall_s=5)
    assert alerts.check_stalled(starting.pk, 60, None) == []
    run = make_run(owner, stall_s=5)
    assert alerts.check_stalled(run.pk, 3, 4) == []
    assert [a.rule for a in alerts.check_stalled(run.pk, 6, 4)] == ["stalled"]
    assert alerts.check_stalled(run.pk, 9, 4) == []  # same episode
    alerts.check_stalled(run.pk, 0, 5)
    assert [a.rule for a in alerts.check_stalled(run.pk, 6, 5)] == ["stalled"]


def test_disabled_rules_store_nothing(owner) -> None:
    run = make_run(owner, enabled=False)
    alerts.evaluate_metric_lines(run.pk, lines(0, {"step": 1, "nonfinite/train/loss": 1.0}))
    assert rules(run) == []


def test_api_and_page_show_alerts(owner_api, other_api, client, owner, other_user) -> None:
    run = make_run(owner)
    alerts.evaluate_metric_lines(run.pk, lines(0, {"step": 3, "nonfinite/train/loss": 1.0}))
    body = owner_api.get(f"/api/runs/{run.pk}/alerts/").json()
    assert [(a["rule"], a["step"]) for a in body["alerts"]] == [("nonfinite", 3)] and "train/loss" in body["alerts"][0]["message"]
    assert other_api.get(f"/api/runs/{run.pk}/alerts/").status_code == 404
    client.force_login(owner)
    listing = client.get("/").content.decode()
    assert f'data-alerts-of="{run.pk}"' in listing and "⚠ 1" in listing
    assert client.get(f"/runs/{run.pk}/alerts.json").json()["alerts"][0]["rule"] == "nonfinite"
    client.force_login(other_user)
    assert client.get(f"/runs/{run.pk}/alerts.json").status_code == 404


class Receiver:
    """A local HTTP server that records the JSON bodies POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        received = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while len(self.bodies) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.bodies


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.server.shutdown()


def test_webhook_gets_one_slack_compatible_post_per_episode(owner, receiver, django_capture_on_commit_callbacks, settings) -> None:
    settings.INFLIGHT_ALERT_WEBHOOKS = True
    AlertWebhook.objects.create(user=owner, url=receiver.url)
    run = make_run(owner)
    with django_capture_on_commit_callbacks(execute=True):
        alerts.evaluate_metric_lines(run.pk, lines(0, *({"step": s, "nonfinite/train/loss": 1.0} for s in range(1, 6))))
    bodies = receiver.wait_for(1)
    time.sleep(0.3)
    assert len(bodies) == 1
    assert bodies[0]["text"].startswith(":warning: Inflight run #") and "non-finite" in bodies[0]["text"]
    assert bodies[0]["inflight"]["rule"] == "nonfinite" and bodies[0]["inflight"]["step"] == 1


def test_operator_can_switch_webhooks_off(owner, receiver, django_capture_on_commit_callbacks, settings) -> None:
    settings.INFLIGHT_ALERT_WEBHOOKS = False
    AlertWebhook.objects.create(user=owner, url=receiver.url)
    run = make_run(owner)
    with django_capture_on_commit_callbacks(execute=True):
        alerts.evaluate_metric_lines(run.pk, lines(0, {"step": 1, "nonfinite/train/loss": 1.0}))
    time.sleep(0.5)
    assert receiver.bodies == [] and rules(run) == ["nonfinite"]


def test_settings_page_saves_and_validates_the_webhook(client, owner) -> None:
    client.force_login(owner)
    assert client.get("/settings/alerts/").status_code == 200
    response = client.post("/settings/alerts/", {"url": "not a url"})
    assert response.status_code == 200 and not AlertWebhook.objects.filter(user=owner).exists()
    client.post("/settings/alerts/", {"url": "https://hooks.example.com/T1/B2"})
    assert AlertWebhook.objects.get(user=owner).url == "https://hooks.example.com/T1/B2"
    client.post("/settings/alerts/", {"url": ""})
    assert not AlertWebhook.objects.filter(user=owner).exists()
