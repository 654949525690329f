"""Page URLs, included at / by the root urlconf."""

from __future__ import annotations

from django.urls import path

from inflight.web import lag_views, mirror_views, rollout_views, run_actions, run_live_views, timeline_views, views

app_name = "web"

urlpatterns = [
    path("", run_actions.run_list, name="run_list"),
    path("runs/status.json", views.runs_status_json, name="runs_status"),
    path("runs/new/", views.run_create, name="run_create"),
    path("runs/new/sync.json", views.run_create_sync, name="run_create_sync"),
    path("runs/new/lag.json", lag_views.run_create_lag_json, name="run_create_lag"),
    path("runs/<int:run_id>/", views.run_detail, name="run_detail"),
    path("runs/<int:run_id>/snapshot.json", views.run_snapshot_json, name="run_snapshot"),
    path("runs/<int:run_id>/status.json", views.run_status_json, name="run_status"),
    path("runs/<int:run_id>/panel.json", run_live_views.run_panel_json, name="run_panel"),
    path("runs/<int:run_id>/timeline.json", timeline_views.run_timeline_json, name="run_timeline"),
    path("runs/<int:run_id>/lag.json", lag_views.run_lag_json, name="run_lag"),
    path("runs/<int:run_id>/stop/", views.run_stop, name="run_stop"),
    path("compare/", run_actions.compare, name="compare"),
    path("compare/snapshots.json", views.runs_snapshots_json, name="compare_snapshots"),
    path("leaderboard/", run_actions.leaderboard, name="leaderboard"),
    path("runs/<int:run_id>/clone/", run_actions.run_clone, name="run_clone"),
    path("runs/<int:run_id>/clone/diff.json", run_actions.run_clone_diff, name="run_clone_diff"),
    path("runs/<int:run_id>/resume/", run_actions.run_resume, name="run_resume"),
    path("runs/<int:run_id>/edit/", run_actions.run_edit, name="run_edit"),
    path("runs/<int:run_id>/delete/", run_actions.run_delete, name="run_delete"),
    path("workers/", views.workers, name="workers"),
    path("runs/<int:run_id>/rollouts.json", rollout_views.rollouts_json, name="run_rollouts"),
    path("runs/<int:run_id>/rollouts/counts.json", rollout_views.rollout_counts_json, name="run_rollout_counts"),
    path("runs/<int:run_id>/rollouts/<int:rollout_id>.json", rollout_views.rollout_json, name="run_rollout"),
    path("runs/<int:run_id>/rollouts/<int:rollout_id>/group.json", rollout_views.rollout_group_json, name="run_rollout_group"),
    path("runs/<int:run_id>/evals/<int:eval_id>/problem.json", rollout_views.eval_problem_json, name="run_eval_problem"),
    path("runs/<int:run_id>/alerts.json", rollout_views.alerts_json, name="run_alerts"),
    path("runs/<int:run_id>/export/<str:kind>", rollout_views.run_export, name="run_export"),
    path("runs/<int:run_id>/mirrors/<str:kind>.tar.gz", mirror_views.run_mirror, name="run_mirror"),
    path("settings/alerts/", rollout_views.alert_settings, name="alert_settings"),
]
