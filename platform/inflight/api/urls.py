from __future__ import annotations

from django.urls import path

from inflight.alerts import api_views as alert_api
from inflight.api import run_actions, run_files, schema, views
from inflight.rollouts import api_views as rollout_api

app_name = "api"

urlpatterns = [
    # The schema and its docs page (Swagger UI, served from django-ninja's own static files): public,
    # they describe the API, not anyone's data.
    path("openapi.json", schema.openapi_json, name="openapi-json"),
    path("docs/", schema.docs_page, name="docs"),
    path("runs/", run_actions.runs, name="runs"),
    path("runs/<int:run_id>/", run_actions.run_detail, name="run-detail"),
    path("runs/<int:run_id>/clone/", run_actions.run_clone, name="run-clone"),
    path("runs/<int:run_id>/resume/", run_actions.run_resume, name="run-resume"),
    path("runs/<int:run_id>/checkpoints/", run_actions.run_checkpoints, name="run-checkpoints"),
    path("runs/<int:run_id>/checkpoints/<int:step>/download/", run_files.checkpoint_download, name="run-checkpoint-download"),
    path("runs/<int:run_id>/logs/", run_files.run_logs, name="run-logs"),
    path("runs/<int:run_id>/logs/<str:name>", run_files.run_log_chunk, name="run-log"),
    path("runs/<int:run_id>/cancel/", views.run_cancel, name="run-cancel"),
    path("runs/<int:run_id>/metrics/", views.run_metrics, name="run-metrics"),
    path("runs/<int:run_id>/evals/", views.run_evals, name="run-evals"),
    path("evals/<int:eval_id>/", views.eval_detail, name="eval-detail"),
    path("leaderboard/", views.leaderboard, name="leaderboard"),
    path("workers/", views.workers, name="workers"),
    path("runs/<int:run_id>/rollouts/", rollout_api.run_rollouts, name="run-rollouts"),
    path("runs/<int:run_id>/rollouts/<int:rollout_id>/", rollout_api.rollout_detail, name="run-rollout"),
    path("runs/<int:run_id>/rollouts/<int:rollout_id>/group/", rollout_api.rollout_group, name="run-rollout-group"),
    path("runs/<int:run_id>/alerts/", alert_api.run_alerts_view, name="run-alerts"),
    path("runs/<int:run_id>/export/<str:kind>", rollout_api.run_export, name="run-export"),
]
