from __future__ import annotations

from django.urls import path

from inflight.api import views

app_name = "api"

urlpatterns = [
    path("runs/", views.runs, name="runs"),
    path("runs/<int:run_id>/", views.run_detail, name="run-detail"),
    path("runs/<int:run_id>/cancel/", views.run_cancel, name="run-cancel"),
    path("runs/<int:run_id>/metrics/", views.run_metrics, name="run-metrics"),
    path("runs/<int:run_id>/evals/", views.run_evals, name="run-evals"),
    path("evals/<int:eval_id>/", views.eval_detail, name="eval-detail"),
    path("leaderboard/", views.leaderboard, name="leaderboard"),
    path("workers/", views.workers, name="workers"),
]
