"""Issue 33, bring your own data without an operator: a user uploads (or registers by path) a
JSONL of problems and answers from the page, the API and the CLI; it is checked on upload (each
bad line named), stored in the user's own folder, listed, deletable, usable as a run's
task.train_path / eval_path, and never readable by another user (API, page, or a run's path)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterator

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from inflight.datasets import validation
from inflight.datasets.models import Dataset
from inflight.runs import services
from tests.platform.test_browser import daphne_server  # noqa: F401 - the fixture is used by name
from tests.platform.test_cli import INFLIGHT, Cli

pytestmark = pytest.mark.django_db(transaction=True)

GOOD = b"".join(json.dumps(row).encode() + b"\n" for row in (
    {"id": "a", "problem": "What is 3+4?", "answer": "7"},
    {"question": "What is 2*5?", "answer": 10},
    {"id": "c", "problem": "What is 9-1?", "answer": "8", "solution": "9-1=\\boxed{8}"},
))
BAD = b'{"problem": "1+1?", "answer": "2"}\n{"problem": "no answer"}\nnot json\n\n{"answer": "3"}\n{"problem": "2+2?", "answer": "4"}\n'


@pytest.fixture(autouse=True)
def dataset_roots(tmp_path: Path, settings) -> Iterator[tuple[Path, Path]]:
    """Each test's own datasets folder and data root; set in the environment too, first (autouse),
    so a Daphne server started for the test uses the same."""
    datasets_dir, data_root = tmp_path / "datasets", tmp_path / "shared-data"
    data_root.mkdir()
    settings.INFLIGHT_DATASETS_DIR = datasets_dir
    roots = [data_root, *settings.INFLIGHT_DATA_ROOTS]  # the default one holds eval.data_dir's benchmarks
    settings.INFLIGHT_DATA_ROOTS = roots
    saved = {key: os.environ.get(key) for key in ("INFLIGHT_DATASETS_DIR", "INFLIGHT_DATA_ROOTS")}
    os.environ.update({"INFLIGHT_DATASETS_DIR": str(datasets_dir), "INFLIGHT_DATA_ROOTS": ",".join(map(str, roots))})
    yield datasets_dir, data_root
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def upload(client, name: str, body: bytes):
    return client.post(f"/api/datasets/upload/?name={name}", data=body, content_type="application/x-ndjson")


def test_upload_through_the_api_is_checked_stored_per_user_and_hidden_from_others(owner, owner_api, other_api, dataset_roots) -> None:
    made = upload(owner_api, "arith", GOOD)
    assert made.status_code == 201, made.content
    dataset = made.json()
    stored = Path(dataset["path"])
    assert dataset["rows"] == 3 and dataset["source"] == "uploaded" and dataset["use"]["task.train_path"] == str(stored)
    assert stored == dataset_roots[0].resolve() / str(owner.pk) / "arith.jsonl" and stored.read_bytes() == GOOD
    assert [d["name"] for d in owner_api.get("/api/datasets/").json()["datasets"]] == ["arith"]

    # Another user: not listed, not readable, not deletable (404: its existence is not told).
    assert other_api.get("/api/datasets/").json() == {"datasets": [], "count": 0}
    assert other_api.get(f"/api/datasets/{dataset['id']}/").status_code == 404
    assert other_api.delete(f"/api/datasets/{dataset['id']}/").status_code == 404
    assert stored.is_file()

    again = upload(owner_api, "arith", GOOD)
    assert again.status_code == 400 and "already have a dataset named 'arith'" in again.json()["error"]
    assert upload(owner_api, "../up", GOOD).json()["fields"] == {"name": [f"name must be {validation.NAME_RULE}"]}

    assert owner_api.delete(f"/api/datasets/{dataset['id']}/").json() == {"deleted": dataset["id"]}
    assert not stored.exists() and not Dataset.objects.exists()


def test_a_bad_file_names_each_bad_line_and_leaves_nothing(owner, owner_api, dataset_roots, monkeypatch) -> None:
    refused = upload(owner_api, "broken", BAD)
    assert refused.status_code == 400
    assert refused.json()["fields"]["file"] == [
        "line 2: row has no 'answer'", "line 3: not valid JSON (Expecting value)", "line 5: row has no 'problem' text",
    ]
    duplicate = upload(owner_api, "dup", b'{"id": "x", "problem": "a", "answer": "1"}\n{"id": "x", "problem": "b", "answer": "2"}\n')
    assert duplicate.json()["fields"]["file"] == ["line 2: duplicate id 'x' (first on line 1)"]
    assert upload(owner_api, "empty", b"\n\n").json()["fields"]["file"][0].startswith("the file has no rows")

    monkeypatch.setattr(validation, "MAX_DATASET_BYTES", 64)  # the one size limit
    too_big = upload(owner_api, "big", GOOD)
    assert too_big.status_code == 413 and "the limit of a dataset" in too_big.json()["error"]
    assert not Dataset.objects.exists()
    folder = dataset_roots[0] / str(owner.pk)
    assert not folder.exists() or not any(folder.iterdir())  # no part file left behind


def test_register_by_path_only_under_a_data_root(owner, owner_api, other_api, dataset_roots) -> None:
    shared = dataset_roots[1] / "gsm8k-mini.jsonl"
    shared.write_bytes(GOOD)
    made = owner_api.post("/api/datasets/", {"name": "gsm", "path": str(shared)}, content_type="application/json")
    assert made.status_code == 201 and made.json()["source"] == "registered" and made.json()["rows"] == 3
    outside = owner_api.post("/api/datasets/", {"name": "etc", "path": "/etc/hostname"}, content_type="application/json")
    assert outside.status_code == 400 and "must be a file under the data roots" in outside.json()["fields"]["path"][0], outside.json()
    mine = Path(upload(owner_api, "mine", GOOD).json()["path"])
    theirs = other_api.post("/api/datasets/", {"name": "stolen", "path": str(mine)}, content_type="application/json")
    assert theirs.status_code == 400  # another user's upload is not a data root's file
    assert owner_api.post("/api/datasets/", {"name": "x"}, content_type="application/json").status_code == 400
    owner_api.delete(f"/api/datasets/{made.json()['id']}/")
    assert shared.is_file()  # a registered file is the operator's: only forgotten


def test_runs_may_read_their_owners_datasets_and_no_one_elses(owner, other_user, owner_api, dataset_roots) -> None:
    path = upload(owner_api, "arith", GOOD).json()["path"]
    own = {"task": {"kind": "math_jsonl", "train_path": path, "eval_path": path}}
    services.check_run_for_owner(owner, services.validate_run_config(own))
    services.check_run_for_owner(owner, services.validate_run_config(own), on_worker=True)
    with pytest.raises(services.InvalidRunConfig) as refused:
        services.check_run_for_owner(other_user, services.validate_run_config(own))
    assert set(refused.value.errors) == {"task.train_path", "task.eval_path"}
    assert "not one of your datasets" in refused.value.errors["task.train_path"][0]
    # A link in the other user's own folder to the owner's file passes the lexical check, not the worker's.
    theirs = dataset_roots[0].resolve() / str(other_user.pk)
    theirs.mkdir(parents=True)
    (theirs / "link.jsonl").symlink_to(path)
    linked = {"task": {"kind": "math_jsonl", "train_path": str(theirs / "link.jsonl")}}
    services.check_run_for_owner(other_user, services.validate_run_config(linked))
    with pytest.raises(services.InvalidRunConfig, match="task.train_path"):
        services.check_run_for_owner(other_user, services.validate_run_config(linked), on_worker=True)


def test_the_page_uploads_names_bad_lines_and_deletes(owner, owner_web, other_web, dataset_roots) -> None:
    bad = owner_web.post("/datasets/", {"action": "upload", "upload-name": "broken", "upload-file": SimpleUploadedFile("b.jsonl", BAD)})
    assert bad.status_code == 400
    page = bad.content.decode()
    assert "line 2: row has no &#x27;answer&#x27;" in page and "line 5: row has no &#x27;problem&#x27; text" in page
    good = owner_web.post("/datasets/", {"action": "upload", "upload-name": "arith", "upload-file": SimpleUploadedFile("a.jsonl", GOOD)}, follow=True)
    listed = good.content.decode()
    assert 'data-dataset="arith"' in listed and "3 problems" in listed
    dataset = Dataset.objects.get()
    assert 'data-dataset="arith"' not in other_web.get("/datasets/").content.decode()
    assert other_web.post(f"/datasets/{dataset.pk}/delete/").status_code == 404
    owner_web.post(f"/datasets/{dataset.pk}/delete/")
    assert not Dataset.objects.exists() and not Path(dataset.path).exists()


@pytest.mark.slow
@pytest.mark.skipif(not INFLIGHT.exists(), reason="the inflight console script is not installed (pip install -e .)")
def test_the_cli_uploads_lists_and_deletes(daphne_server: str, owner, tmp_path: Path) -> None:  # noqa: F811
    from inflight.accounts.services import create_token

    cli = Cli(tmp_path, {"INFLIGHT_URL": daphne_server, "INFLIGHT_TOKEN": create_token(owner).key})
    (tmp_path / "arith.jsonl").write_bytes(GOOD)
    (tmp_path / "bad.jsonl").write_bytes(BAD)
    made = cli("datasets", "upload", "arith.jsonl")
    assert "arith: 3 problems" in made.stdout and "task.train_path=" in made.stdout
    refused = cli("datasets", "upload", "bad.jsonl", check=False)
    assert refused.returncode == 1 and "line 2: row has no 'answer'" in refused.stderr and "line 5" in refused.stderr
    listed = cli("datasets", "list").stdout
    assert "arith" in listed and "bad" not in listed
    assert "deleted" in cli("datasets", "delete", "arith").stdout
    missing = cli("datasets", "delete", "arith", check=False)
    assert missing.returncode == 1 and "you have no dataset 'arith'" in missing.stderr


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_run_trains_on_an_uploaded_dataset_through_the_worker(start_worker, owner, owner_api, untrained_tiny_model: Path, wait, settings) -> None:
    """The first-day path through the real worker: upload, submit a run whose task reads the
    upload, it succeeds; what ran it and its per-process figures are stored."""
    from inflight.provenance.models import RunProvenance
    from inflight.runs.models import MetricPoint, Run, RunStatus

    models_root = str(untrained_tiny_model.parent)  # the untrained tiny model is a models root for this test
    saved = os.environ.get("INFLIGHT_MODELS_ROOTS")
    settings.INFLIGHT_MODELS_ROOTS = [untrained_tiny_model.parent, *settings.INFLIGHT_MODELS_ROOTS]
    os.environ["INFLIGHT_MODELS_ROOTS"] = ",".join([models_root, *map(str, settings.INFLIGHT_MODELS_ROOTS[1:])])
    try:
        worker = start_worker()
        path = upload(owner_api, "sums", b"".join(
            json.dumps({"id": f"s{i}", "problem": f"Compute {i % 7} + {i % 5}.", "answer": str(i % 7 + i % 5)}).encode() + b"\n" for i in range(40))).json()["path"]
        config = {
            "name": "on-my-data", "model": {"path": str(untrained_tiny_model)},
            "task": {"kind": "math_jsonl", "train_path": path, "eval_path": path, "heldout_size": 4},
            "sampling": {"max_new_tokens": 16}, "actor": {"group_size": 4, "groups_in_flight": 2, "max_lag": 1},
            "trainer": {"samples_per_step": 8, "max_steps": 2, "lr": 1e-4}, "eval": {"heldout_every_n_steps": 1, "heldout_k": 1},
        }
        response = owner_api.post("/api/runs/", json.dumps({"name": "on-my-data", "config": config}), content_type="application/json")
        assert response.status_code == 201, response.content
        run_id = response.json()["id"]
        done = wait(lambda: (r := Run.objects.get(pk=run_id)).is_terminal and r, timeout=500, interval=1, message="the run to end")
        assert done.status == RunStatus.SUCCEEDED, (done.error, worker.log()[-3000:])
        assert MetricPoint.objects.filter(run_id=run_id, name="train/loss").count() == 2
        assert MetricPoint.objects.filter(run_id=run_id, name="system/proc/trainer/cpu_percent").exists()
        launches = RunProvenance.objects.get(run_id=run_id).launches
        assert len(launches) == 1 and launches[0]["command"][-2:] == ["--out", done.run_dir]
    finally:
        if saved is None:
            os.environ.pop("INFLIGHT_MODELS_ROOTS", None)
        else:
            os.environ["INFLIGHT_MODELS_ROOTS"] = saved
