"""Page URLs, included at / by the root urlconf."""

from __future__ import annotations

from django.urls import path

from inflight.web import views

app_name = "web"

urlpatterns = [
    path("", views.run_list, name="run_list"),
    path("runs/status.json", views.runs_status_json, name="runs_status"),
    path("runs/new/", views.run_create, name="run_create"),
    path("runs/<int:run_id>/", views.run_detail, name="run_detail"),
    path("runs/<int:run_id>/snapshot.json", views.run_snapshot_json, name="run_snapshot"),
    path("runs/<int:run_id>/status.json", views.run_status_json, name="run_status"),
    path("runs/<int:run_id>/stop/", views.run_stop, name="run_stop"),
    path("compare/", views.compare, name="compare"),
    path("leaderboard/", views.leaderboard, name="leaderboard"),
    path("workers/", views.workers, name="workers"),
]
