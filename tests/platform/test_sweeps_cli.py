"""`inflight sweep` against a real server (Daphne on the test database), as a user runs it: the
runs are queued, not trained (no worker), which is what a sweep's creation is about."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.platform.test_browser import daphne_server  # noqa: F401 - the fixture is used by name
from tests.platform.test_cli import INFLIGHT, REPO_ROOT, Cli, token  # noqa: F401 - token: a fixture used by name

pytestmark = [pytest.mark.skipif(not INFLIGHT.exists(), reason="the inflight console script is not installed (pip install -e .)")]


def test_cli_sweep_of_two_lrs_by_two_seeds_queues_four_runs_in_one_group(daphne_server: str, token: str, owner, tmp_path: Path) -> None:  # noqa: F811
    from inflight.runs.models import Run, RunGroup

    config = tmp_path / "tiny.yaml"
    config.write_text((REPO_ROOT / "examples" / "tiny-cpu.yaml").read_text())
    cli = Cli(tmp_path, {"INFLIGHT_URL": daphne_server, "INFLIGHT_TOKEN": token})
    done = cli("sweep", str(config), "--grid", "trainer.lr=1e-4,3e-4", "--seeds", "2", "--name", "lr-sweep", "--set", "trainer.max_steps=4")
    group = RunGroup.objects.get()
    assert group.name == "lr-sweep" and group.owner == owner
    runs = list(Run.objects.filter(group=group).order_by("id"))
    assert len(runs) == 4 == Run.objects.count()
    assert sorted((run.config["trainer"]["lr"], run.config["seed"]) for run in runs) == [(1e-4, 0), (1e-4, 1), (3e-4, 0), (3e-4, 1)]
    assert all(run.config["trainer"]["max_steps"] == 4 for run in runs)
    assert f"sweep {group.pk} lr-sweep: 4 runs queued" in done.stdout and f"/compare/?groups={group.pk}" in done.stdout
    assert all(f"run {run.pk} " in done.stdout for run in runs)

    refused = cli("sweep", str(config), "--grid", "trainer.lr=-1,1e-4", check=False)
    assert refused.returncode == 1 and "trainer.lr" in refused.stderr and RunGroup.objects.count() == 1
    malformed = cli("sweep", str(config), "--grid", "trainer.lr", check=False)
    assert malformed.returncode == 2 and "KEY=V1,V2" in malformed.stderr
    assert cli("sweep", str(config), "--seeds", "many", check=False).returncode == 2
