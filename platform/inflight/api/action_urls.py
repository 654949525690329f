"""API URLs of run actions and the filtered run list (`api.run_actions`). Included before
`api.urls`, so `runs/` and `runs/<id>/` here (which also answer filters, PATCH and DELETE)
take precedence; creating a run is still `api.views.runs`."""

from __future__ import annotations

from django.urls import path

from inflight.api import run_actions

app_name = "api_actions"

urlpatterns = [
    path("runs/", run_actions.runs, name="runs"),
    path("runs/<int:run_id>/", run_actions.run_detail, name="run-detail"),
    path("runs/<int:run_id>/clone/", run_actions.run_clone, name="run-clone"),
    path("runs/<int:run_id>/resume/", run_actions.run_resume, name="run-resume"),
    path("runs/<int:run_id>/checkpoints/", run_actions.run_checkpoints, name="run-checkpoints"),
]
