"""Issue 33's smaller defects, each on Django's test client and the real database: a config that
can learn nothing is refused naming its field, unknown addresses get the site's 404 page, the
wide CSV has one row per step, a tag refused keeps the note typed with it. The pages themselves
are tested in a browser (test_first_day_browser.py)."""

from __future__ import annotations

import json

import pytest

from inflight.runs import services

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

    from inflight.runs.services import PointIn

    run = services.create_run(owner, "wide", {})
    # Step 5 is logged over three lines (training, system, held-out), as the engine writes it.
    services.ingest_metrics(run.pk, [
        PointIn(0, "train/loss", 5, 10.0, 0.5), PointIn(1, "system/cpu_util", 5, 10.5, 80.0),
        PointIn(2, "success/heldout", 5, 11.0, 0.75), PointIn(3, "train/loss", 6, 12.0, 0.4),
    ])
    table = list(csv.reader(io.StringIO(b"".join(owner_web.get(f"/runs/{run.pk}/export/metrics_wide.csv").streaming_content).decode())))
    assert table == [
        ["step", "t", "success/heldout", "system/cpu_util", "train/loss"],
        ["5", "11.0", "0.75", "80.0", "0.5"],
        ["6", "12.0", "", "", "0.4"],
    ]
