"""GET /api/runs/<id>/logs/… and …/checkpoints/<step>/download/: what `inflight logs` and
`inflight download` read, on the real database and real files in the runs directory."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from inflight.runs import run_paths, services

pytestmark = pytest.mark.django_db


@pytest.fixture
def run_with_files(owner, tmp_path):
    run = services.create_run(owner, "files", {})
    run_dir = run_paths.runs_dir() / str(run.pk)
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "logs" / "supervisor_child.log").write_text("".join(f"line {i}\n" for i in range(1000)))
    (run_dir / "logs" / "trainer.log").write_text("trainer says hi\n")
    secret = tmp_path / "secret.log"
    secret.write_text("not the run's\n")
    os.symlink(secret, run_dir / "logs" / "escape.log")
    checkpoint = run_paths.checkpoint_path(run.pk, 10)
    (checkpoint / "sub").mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(bytes(range(256)) * 5)
    (checkpoint / "trainer_state.json").write_text('{"t": 1.5, "step": 10}')
    (checkpoint / "sub" / "extra.txt").write_text("x")
    os.symlink(secret, checkpoint / "leak.log")
    (run_dir / "checkpoints" / "latest").symlink_to(checkpoint.name)
    return run


def test_log_list_tail_and_follow(owner_api, run_with_files) -> None:
    run = run_with_files
    listing = owner_api.get(f"/api/runs/{run.pk}/logs/").json()
    assert listing["files"] == [{"name": "supervisor_child.log", "size": 8890}, {"name": "trainer.log", "size": 16}] and listing["count"] == 2
    tail = owner_api.get(f"/api/runs/{run.pk}/logs/supervisor_child.log?tail=14").json()
    assert tail["text"] == "line 998\nline 999\n"[-14:] and tail["next_offset"] == tail["size"] == 8890
    # Following: read from an offset in chunks; each chunk ends at a line boundary.
    text, offset = "", 0
    while offset < 8890:
        chunk = owner_api.get(f"/api/runs/{run.pk}/logs/supervisor_child.log?offset={offset}&max_bytes=100").json()
        assert chunk["offset"] == offset and chunk["text"].endswith("\n")
        text, offset = text + chunk["text"], chunk["next_offset"]
    assert text.splitlines() == [f"line {i}" for i in range(1000)]
    default = owner_api.get(f"/api/runs/{run.pk}/logs/trainer.log").json()
    assert default["text"] == "trainer says hi\n" and default["offset"] == 0
    # An offset past the end (the log was rewritten) starts again from the top.
    assert owner_api.get(f"/api/runs/{run.pk}/logs/trainer.log?offset=999").json()["offset"] == 0
    both = owner_api.get(f"/api/runs/{run.pk}/logs/trainer.log?offset=0&tail=4")
    assert both.status_code == 400 and "not both" in both.json()["error"]


@pytest.mark.parametrize("name", ["escape.log", "..%2F..%2Fsettings.log", "nope.log", "trainer.txt", ".hidden.log"])
def test_logs_outside_the_run_or_missing_are_404(owner_api, run_with_files, name) -> None:
    response = owner_api.get(f"/api/runs/{run_with_files.pk}/logs/{name}")
    assert response.status_code == 404 and response.json()["error"]  # `/` in a name matches no route at all
    if "%2F" not in name:
        assert "has no log" in response.json()["error"]
    assert "not the run's" not in response.content.decode()


def test_checkpoint_download_is_the_folder_as_tar(owner_api, run_with_files, tmp_path) -> None:
    run = run_with_files
    response = owner_api.get(f"/api/runs/{run.pk}/checkpoints/10/download/")
    assert response.status_code == 200 and response["Content-Type"] == "application/x-tar"
    assert f'filename="run-{run.pk}-step_000010.tar"' in response["Content-Disposition"]
    archive = tarfile.open(fileobj=io.BytesIO(b"".join(response.streaming_content)))
    names = sorted(archive.getnames())
    assert names == ["step_000010", "step_000010/model.safetensors", "step_000010/sub", "step_000010/sub/extra.txt", "step_000010/trainer_state.json"]
    archive.extractall(tmp_path / "out", filter="data")
    assert (tmp_path / "out" / "step_000010" / "model.safetensors").read_bytes() == bytes(range(256)) * 5
    assert owner_api.get(f"/api/runs/{run.pk}/checkpoints/11/download/").status_code == 404


def test_other_users_and_anonymous_get_nothing(other_api, anonymous_api, run_with_files) -> None:
    run = run_with_files
    for url in (f"/api/runs/{run.pk}/logs/", f"/api/runs/{run.pk}/logs/trainer.log", f"/api/runs/{run.pk}/checkpoints/10/download/"):
        assert other_api.get(url).status_code == 404, url
        response = anonymous_api.get(url)
        assert response.status_code == 401 and response.json()["error"].startswith("authentication required"), url


def test_staff_may_read_any_runs_logs(staff_api, run_with_files) -> None:
    assert staff_api.get(f"/api/runs/{run_with_files.pk}/logs/trainer.log").json()["text"] == "trainer says hi\n"
