"""Page URLs of run actions, the filtered run list and the shareable compare view
(`web.run_actions`). Included before `web.urls`, so `""` and `compare/` here take precedence
(the names `web:run_list` and `web:compare` still reverse to the same paths)."""

from __future__ import annotations

from django.urls import path

from inflight.web import run_actions

app_name = "web_actions"

urlpatterns = [
    path("", run_actions.run_list, name="run_list"),
    path("compare/", run_actions.compare, name="compare"),
    path("leaderboard/", run_actions.leaderboard, name="leaderboard"),
    path("runs/<int:run_id>/clone/", run_actions.run_clone, name="run_clone"),
    path("runs/<int:run_id>/clone/diff.json", run_actions.run_clone_diff, name="run_clone_diff"),
    path("runs/<int:run_id>/resume/", run_actions.run_resume, name="run_resume"),
    path("runs/<int:run_id>/edit/", run_actions.run_edit, name="run_edit"),
    path("runs/<int:run_id>/delete/", run_actions.run_delete, name="run_delete"),
]
