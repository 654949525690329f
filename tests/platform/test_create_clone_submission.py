"""The new-run page and the clone page read a submission one way (web/views.read_submission): the
same text or form is refused alike on both, naming every problem in one round trip (issue 32 §4)."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.platform.test_run_actions_api import make_run
from tests.platform.test_run_actions_pages import form_post_data

pytestmark = pytest.mark.django_db


def _summary(html: str) -> set[str]:
    """The paths the refused page's error summary links to (form tab) or names (YAML tab)."""
    linked = set(re.findall(r'data-error-link="[^"]*"><b>([^<]+)</b>', html))
    listed = {line.split(":", 1)[0] for line in re.findall(r'<div class="field-error">([^<]+)</div>', html)}
    return linked | listed


def test_an_unknown_key_in_the_yaml_tab_is_refused_alike_by_create_and_clone(owner, owner_web, tiny_config, django_capture_on_commit_callbacks) -> None:
    source = make_run(owner, tiny_config, django_capture_on_commit_callbacks)
    text = yaml.safe_dump({**tiny_config, "trainer": {**tiny_config["trainer"], "max_stepz": 3}})
    answers = {}
    for url in ("/runs/new/", f"/runs/{source.pk}/clone/"):
        with django_capture_on_commit_callbacks(execute=False):
            response = owner_web.post(url, {"mode": "yaml", "config_yaml": text})
        assert response.status_code == 400, url
        answers[url] = _summary(response.content.decode())
    assert answers["/runs/new/"] == answers[f"/runs/{source.pk}/clone/"] and "trainer.max_stepz" in answers["/runs/new/"]


def test_a_clone_form_that_does_not_parse_still_names_the_schemas_problems(owner, owner_web, tiny_config, django_capture_on_commit_callbacks) -> None:
    """The clone page named only the field that did not parse; the new-run page named the schema's
    problems with it. Both now do."""
    source = make_run(owner, tiny_config, django_capture_on_commit_callbacks)
    answers = {}
    for url in ("/runs/new/", f"/runs/{source.pk}/clone/"):
        data = form_post_data(owner_web.get(f"/runs/{source.pk}/clone/").content.decode())
        data["inference.max_batch_size"] = "not a number"  # does not parse
        data["actor.group_size"] = "1"  # parses, and the schema refuses it
        with django_capture_on_commit_callbacks(execute=False):
            response = owner_web.post(url, data)
        assert response.status_code == 400, url
        answers[url] = _summary(response.content.decode())
    for url, paths in answers.items():
        assert {"inference.max_batch_size", "actor.group_size"} <= paths, (url, paths)
