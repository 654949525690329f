"""Issue 33, mirrors you can fetch: a run's TensorBoard and W&B mirror folders come as a .tar.gz
from the run page, the API and `inflight download --mirrors` (a user without shell access can
`wandb sync` / `tensorboard --logdir` them); other users' runs answer 404."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from inflight.runs import run_paths
from inflight.runs.models import Run
from tests.platform.test_browser import daphne_server  # noqa: F401 - the fixture is used by name
from tests.platform.test_cli import INFLIGHT, Cli
from tests.rl_core.test_metrics_mirror import expected_scalars, mirror_file, tensorboard_scalars, write_lines

pytestmark = pytest.mark.django_db(transaction=True)
WANDB_FILE = "offline-run-20261128_000000-abc123/run-abc123.wandb"


def mirrored_run(owner, tmp_path: Path) -> Run:
    """A run whose directory holds a real TensorBoard mirror of its metrics.jsonl, a W&B offline
    run folder, and a link out of it (never followed)."""
    run = Run.objects.create(owner=owner, name="mirrored", status="succeeded",
                             config={"monitoring": {"mirror": {"sinks": ["wandb", "tensorboard"]}}})
    folder = run_paths.run_dir(run.pk)
    folder.mkdir(parents=True)
    write_lines(folder)
    mirror_file(folder, ["tensorboard"])
    wandb_file = folder / "wandb" / WANDB_FILE
    wandb_file.parent.mkdir(parents=True)
    wandb_file.write_bytes(b"W&B offline records" * 100)
    (tmp_path / "secret").write_text("not yours")
    (folder / "wandb" / "escape").symlink_to(tmp_path / "secret")
    return run


def unpacked(body: bytes, into: Path) -> Path:
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        tar.extractall(into, filter="data")
    return into


def test_the_api_and_the_page_stream_each_mirror_to_its_owner_only(owner, owner_api, other_api, owner_web, other_web, tmp_path: Path) -> None:
    run = mirrored_run(owner, tmp_path)
    response = owner_api.get(f"/api/runs/{run.pk}/mirrors/tensorboard/download/")
    assert response.status_code == 200 and response["Content-Type"] == "application/gzip"
    assert response["Content-Disposition"] == f'attachment; filename="run-{run.pk}-tensorboard.tar.gz"'
    folder = unpacked(b"".join(response.streaming_content), tmp_path / "tb") / f"run-{run.pk}-tensorboard"
    assert tensorboard_scalars(folder) == expected_scalars()  # a real, readable event file

    page = owner_web.get(f"/runs/{run.pk}/mirrors/wandb.tar.gz")
    wandb = unpacked(b"".join(page.streaming_content), tmp_path / "wb") / f"run-{run.pk}-wandb"
    assert (wandb / WANDB_FILE).read_bytes() == b"W&B offline records" * 100
    assert not (wandb / "escape").exists()  # links are not followed out of the run
    assert f'href="/runs/{run.pk}/mirrors/wandb.tar.gz"' in owner_web.get(f"/runs/{run.pk}/").content.decode()

    assert other_api.get(f"/api/runs/{run.pk}/mirrors/wandb/download/").status_code == 404
    assert other_web.get(f"/runs/{run.pk}/mirrors/wandb.tar.gz").status_code == 404
    unknown = owner_api.get(f"/api/runs/{run.pk}/mirrors/mlflow/download/")
    assert unknown.status_code == 404 and "its mirrors: wandb, tensorboard" in unknown.json()["error"]
    plain = Run.objects.create(owner=owner, name="plain", status="succeeded", config={})
    missing = owner_api.get(f"/api/runs/{plain.pk}/mirrors/wandb/download/").json()["error"]
    assert "its mirrors: none" in missing and "monitoring.mirror.sinks" in missing


@pytest.mark.slow
@pytest.mark.skipif(not INFLIGHT.exists(), reason="the inflight console script is not installed (pip install -e .)")
def test_inflight_download_mirrors_unpacks_them(daphne_server: str, owner, tmp_path: Path) -> None:  # noqa: F811
    from inflight.accounts.services import create_token

    run = mirrored_run(owner, tmp_path)
    cli = Cli(tmp_path, {"INFLIGHT_URL": daphne_server, "INFLIGHT_TOKEN": create_token(owner).key})
    cli("download", str(run.pk), "--mirrors", "--no-metrics", "-o", "got")
    assert (tmp_path / "got" / f"run-{run.pk}-wandb" / WANDB_FILE).read_bytes() == b"W&B offline records" * 100
    assert tensorboard_scalars(tmp_path / "got" / f"run-{run.pk}-tensorboard") == expected_scalars()
    plain = Run.objects.create(owner=owner, name="plain", status="succeeded", config={})
    refused = cli("download", str(plain.pk), "--mirrors", "-o", "none", check=False)
    assert refused.returncode == 1 and "monitoring.mirror.sinks" in refused.stderr and not (tmp_path / "none").exists()
