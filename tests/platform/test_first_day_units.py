"""Issue 33's smaller defects, each on Django's test client and the real database: a config that
can learn nothing is refused naming its field, unknown addresses get the site's 404 page, the
wide CSV has one row per step, a tag refused keeps the note typed with it. The pages themselves
are tested in a browser (test_first_day_browser.py)."""

from __future__ import annotations

import json

import pytest

from inflight.runs import services
from inflight.live import ingest as live_ingest

pytestmark = pytest.mark.django_db


def test_a_group_of_one_is_refused_naming_the_field(owner_api, owner) -> None:
    response = owner_api.post("/api/runs/", json.dumps({"name": "solo", "config": {"actor": {"group_size": 1}}}), content_type="application/json")
    assert response.status_code == 400, response.content
    fields = response.json()["fields"]
    assert list(fields) == ["actor.group_size"] and "group-relative" in fields["actor.group_size"][0]
    with pytest.raises(services.InvalidRunConfig) as refused:
        services.create_run(owner, "solo", {"actor": {"group_size": 1, "advantage": "group_mean_std"}})
    assert "actor.group_size" in refused.value.errors


@pytest.mark.parametrize("path", ["/runs/abc/", "/no/such/page/", "/runs/12/nothing/"])
def test_unknown_addresses_get_the_sites_404_page(owner_web, path: str) -> None:
    response = owner_web.get(path)
    assert response.status_code == 404
    page = response.content.decode()
    # The site's layout (its top bar and navigation), the address named, a way back.
    assert 'class="topbar"' in page and 'id="error-page"' in page
    assert f"No page at {path}" in page and "Back to runs" in page


def test_an_unknown_api_path_answers_json(owner_api) -> None:
    response = owner_api.get("/api/nothing-here/")
    assert response.status_code == 404 and "error" in response.json()


def test_a_refused_tag_keeps_the_note_typed_with_it(owner, owner_web) -> None:
    from inflight.runs.models import Run

    run = services.create_run(owner, "labels", {})
    response = owner_web.post(f"/runs/{run.pk}/edit/", {"tags": "baseline, not a tag!", "note": "lr 3e-4 diverged at step 40"}, follow=True)
    run = Run.objects.get(pk=run.pk)
    assert run.note == "lr 3e-4 diverged at step 40"  # saved although a tag was refused
    assert run.tags == []  # the tags are not saved half-way
    page = response.content.decode()
    assert "not a tag!" in page and "Note saved." in page
    # The tags as typed are back in the form, its section open, to be corrected.
    assert 'value="baseline, not a tag!"' in page and '<details class="edit-labels" open>' in page
    # Shown back once: the next view of the page has the stored tags again.
    assert 'value="baseline, not a tag!"' not in owner_web.get(f"/runs/{run.pk}/").content.decode()


def test_the_wide_csv_has_one_row_per_step(owner, owner_web) -> None:
    import csv
    import io

    from inflight.live.ingest import PointIn

    run = services.create_run(owner, "wide", {})
    # Step 5 is logged over three lines (training, system, held-out), as the engine writes it.
    live_ingest.ingest_metrics(run.pk, [
        PointIn(0, "train/loss", 5, 10.0, 0.5), PointIn(1, "system/cpu_util", 5, 10.5, 80.0),
        PointIn(2, "success/heldout", 5, 11.0, 0.75), PointIn(3, "train/loss", 6, 12.0, 0.4),
    ])
    table = list(csv.reader(io.StringIO(b"".join(owner_web.get(f"/runs/{run.pk}/export/metrics_wide.csv").streaming_content).decode())))
    assert table == [
        ["step", "t", "success/heldout", "system/cpu_util", "train/loss"],
        ["5", "11.0", "0.75", "80.0", "0.5"],
        ["6", "12.0", "", "", "0.4"],
    ]


LEARNING_DYNAMICS = {"actor.max_lag": 2, "actor.advantage": "group_mean_std", "trainer.warmup_steps": 20, "trainer.schedule": "cosine", "trainer.samples_per_step": 64}


def _dynamics(config: dict) -> dict:
    return {path: config[path.split(".")[0]][path.split(".")[1]] for path in LEARNING_DYNAMICS}


def test_every_entry_point_gets_the_same_run_defaults(owner, owner_api, owner_web, tmp_path) -> None:
    """Issue 33: the API (the README's own example), a minimal YAML on the create page's YAML tab,
    the form and the engine's command line all resolve a silent field to the same value."""
    from inflight.runs.models import Run
    from rl_core.config.files import load_config

    api = owner_api.post("/api/runs/", json.dumps({"name": "from-api", "config": {"trainer": {"max_steps": 20}}}), content_type="application/json")
    assert api.status_code == 201, api.content
    assert _dynamics(Run.objects.get(pk=api.json()["id"]).config) == LEARNING_DYNAMICS

    yaml_tab = owner_web.post("/runs/new/", {"mode": "yaml", "config_yaml": "name: from-yaml\ntrainer:\n  max_steps: 20\n"})
    assert yaml_tab.status_code == 302, yaml_tab.content.decode()[-2000:]
    assert _dynamics(Run.objects.get(name="from-yaml").config) == LEARNING_DYNAMICS

    # The form opens with them (from the demo preset, which no longer restates them) ...
    form = owner_web.get("/runs/new/").content.decode()
    assert 'name="actor.max_lag" id="f-actor.max_lag" value="2"' in form
    # ... and so does the form with no preset at all: a run's defaults alone.
    bare = owner_web.get("/runs/new/?preset=").content.decode()
    assert 'name="trainer.samples_per_step" id="f-trainer.samples_per_step" value="64"' in bare

    minimal = tmp_path / "minimal.yaml"
    minimal.write_text("trainer:\n  max_steps: 20\n")
    assert _dynamics(load_config(minimal).model_dump(mode="json")) == LEARNING_DYNAMICS
    # Given values win over the defaults everywhere.
    given = owner_api.post("/api/runs/", json.dumps({"name": "given", "config": {"actor": {"max_lag": 4}, "trainer": {"schedule": "constant"}}}), content_type="application/json")
    config = Run.objects.get(pk=given.json()["id"]).config
    assert config["actor"]["max_lag"] == 4 and config["trainer"]["schedule"] == "constant" and config["trainer"]["warmup_steps"] == 20


def test_the_run_page_marks_defaulted_and_set_values(owner, owner_web) -> None:
    run = services.create_run(owner, "marked", {"trainer": {"max_steps": 20, "lr": 3e-4}})
    page = owner_web.get(f"/runs/{run.pk}/").content.decode()
    assert '<tr class="config-set" data-path="trainer.max_steps">' in page
    assert '<tr class="config-set" data-path="trainer.lr">' in page
    assert '<tr class="config-default" data-path="trainer.schedule">' in page  # cosine: a run's default
    assert '<tr class="config-default" data-path="actor.max_lag">' in page


def test_benchmark_samples_show_the_problem_not_its_id(owner, owner_web) -> None:
    from inflight.runs.evaluations import ingest_eval
    from rl_core.evaluation.evaluator import ProblemResult

    # The engine writes the statement beside the id (evaluation.ProblemResult.to_json) ...
    row = ProblemResult(problem_id="math500/42", problem="What is $2 + 3$?", answer="5", samples=["\\boxed{5}"], extracted=["5"], verdicts=[True]).to_json()
    assert row["problem"] == "What is $2 + 3$?"
    run = services.create_run(owner, "evals", {})
    score = ingest_eval(run.pk, {"benchmark": "math500", "step": 4, "k": 1, "mean_at_k": 1.0, "pass_at_k": 1.0, "num_problems": 1, "num_samples": 1}, [row])
    # ... and the run page's per-problem table and the sample view show it, not only the id.
    page = owner_web.get(f"/runs/{run.pk}/").content.decode()
    assert '<td title="math500/42">What is $2 + 3$?</td>' in page
    sample = owner_web.get(f"/runs/{run.pk}/evals/{score.pk}/problem.json?problem_id=math500/42").json()
    assert sample["problem"] == "What is $2 + 3$?" and sample["problem_id"] == "math500/42"
