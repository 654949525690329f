"""A run across two machines through the platform, end to end: API submit -> the `cluster` queue ->
a Celery worker that drives its Ray cluster -> the launcher on the head node -> metrics, roles and
nodes on the pages. The cluster is two Ray nodes in network namespaces (tests/multinode/
netns_cluster.py); the worker runs in the machine's own namespace, as the platform's workers do,
and starts the engine and its node inventory on the head node through INFLIGHT_RL_COMMAND
(`ip netns exec <head> python -m rl_core`), the documented way to run them from where the cluster is."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
from django.test import Client

from inflight.runs.models import MetricPoint, Run, RunQueue, RunStatus, Worker
from tests.multinode.netns_cluster import NetnsCluster, demo_on_cluster, ray_cluster_or_skip
from tests.platform.test_browser import CHROMIUM, CHROMIUM_ARGS, daphne_server, playwright_session  # noqa: F401 (fixture)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

from tests.platform.screenshots import SCREENSHOTS  # noqa: E402  (docs/screenshots/ only when asked)

@pytest.fixture
def cluster() -> Iterator[NetnsCluster]:
    with ray_cluster_or_skip(nodes=2, cpus_per_node=3) as cluster:
        yield cluster


def cluster_run_config(model: Path, nodes: int) -> dict[str, Any]:
    return demo_on_cluster(model, {"name": "two-nodes-platform", "max_wall_time_s": 400, "trainer.max_steps": 12,
                                   "trainer.checkpoint_every": 6, "eval.heldout_every_n_steps": 6, "cluster.nodes": nodes})


def test_a_cluster_run_through_the_platform(cluster: NetnsCluster, start_worker, owner, owner_api, staff_user, tiny_model: Path,
                                            wait: Callable[..., Any], daphne_server: str) -> None:
    env = cluster.env()
    worker = start_worker("cluster", extra_env={
        "INFLIGHT_RL_COMMAND": f"ip netns exec {cluster.head.netns} {sys.executable} -m rl_core",
        "RAY_ADDRESS": cluster.address, **{key: env[key] for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_USAGE_STATS_ENABLED")},
    })

    # 1. The Workers page shows the cluster's nodes, alive, with their CPUs (addresses to staff only).
    row = wait(lambda: (w := Worker.objects.filter(name=worker.name).first()) and len(w.cluster_nodes) == 2 and w,
               timeout=120, interval=1, message=f"the worker's Ray inventory (log {worker.log_path})")
    assert all(node["alive"] and node["cpus"] == 3.0 for node in row.cluster_nodes), row.cluster_nodes
    staff = Client()
    staff.force_login(staff_user)
    page = staff.get("/workers/").content.decode()
    assert "Ray cluster of" in page and cluster.nodes[1].address in page and page.count('data-node-alive="1"') == 2
    mine = Client()
    mine.force_login(owner)
    assert cluster.nodes[1].address not in mine.get("/workers/").content.decode()

    # 2. A request the cluster cannot hold is refused at submit, naming the field; so is another cluster.
    too_big = owner_api.post("/api/runs/", json.dumps({"config": cluster_run_config(tiny_model, nodes=3)}), content_type="application/json")
    assert too_big.status_code == 400 and "cluster.nodes" in too_big.json()["fields"], too_big.content
    elsewhere = cluster_run_config(tiny_model, nodes=2)
    elsewhere["cluster"]["ray_address"] = "10.9.9.9:6379"
    refused = owner_api.post("/api/runs/", json.dumps({"config": elsewhere}), content_type="application/json")
    assert refused.status_code == 400 and "cluster.ray_address" in refused.json()["fields"], refused.content

    # 3. Submitted through the API, it goes to the cluster queue, runs on both nodes and reports as any run.
    response = owner_api.post("/api/runs/", json.dumps({"config": cluster_run_config(tiny_model, nodes=2)}), content_type="application/json")
    assert response.status_code == 201, response.content
    run_id = response.json()["id"]
    assert Run.objects.get(pk=run_id).queue == RunQueue.CLUSTER
    wait(lambda: MetricPoint.objects.filter(run_id=run_id, name="train/loss").exists(), timeout=400, interval=1,
         message=f"the cluster run's first trainer step (worker log {worker.log_path})")
    assert Run.objects.get(pk=run_id).status == RunStatus.RUNNING  # metrics arrive live, not at the end
    done = wait(lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r, timeout=400, interval=1, message="the cluster run to end")
    assert done.status == RunStatus.SUCCEEDED, (done.error, worker.log()[-3000:])
    assert done.status_detail == ""
    steps = sorted(MetricPoint.objects.filter(run_id=run_id, name="train/loss").values_list("step", flat=True))
    assert steps == list(range(1, 13))
    # The rollout viewer has the run's samples: the worker read them from the run's password-protected
    # Redis (its unix socket asks for the password too), live and in the final drain.
    from inflight.rollouts.models import StoredRollout

    assert StoredRollout.objects.filter(run_id=run_id).exists()
    # The held-out evaluation ran on the remote server at the weights it had received by then.
    served = MetricPoint.objects.filter(run_id=run_id, name="success/heldout_version_max").values_list("value", flat=True)
    assert served and max(served) >= 6, list(served)

    # 4. The run page says where each role ran: the trainer on node 0, the server on node 1.
    html = mine.get(f"/runs/{run_id}/").content.decode()
    assert 'id="cluster-roles-table"' in html, html[:2000]
    assert f'data-role="server0"><td class="mono">server0</td><td class="num">1</td><td class="mono">{cluster.nodes[1].address}' in html
    assert f'data-role="trainer"><td class="mono">trainer</td><td class="num">0</td><td class="mono">{cluster.head.address}' in html

    # 5. As a person sees them, in Chromium: the Workers page (staff) and the run's page.

    from tests.platform.test_run_actions_browser import sign_in

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with playwright_session() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 1100})
            sign_in(page, daphne_server, "staff", "staff-password-1", "/workers/")
            assert page.locator("table.ray-nodes tbody tr[data-node-alive='1']").count() == 2
            page.screenshot(path=str(SCREENSHOTS / "workers_cluster.png"), full_page=True)
            page.goto(f"{daphne_server}/runs/{run_id}/")
            assert page.locator("#cluster-roles-table tbody tr").count() >= 3  # server0, trainer, actor
            page.wait_for_selector(".chart-card .main-svg")  # its metrics, as for any run
            page.screenshot(path=str(SCREENSHOTS / "run_page_cluster.png"), full_page=False)
        finally:
            browser.close()
