from __future__ import annotations

from django.contrib import admin

from inflight.runs.models import EvalScore, Run, Worker


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "owner", "status", "queue", "worker_name", "created_at", "metrics_seq")
    list_filter = ("status", "queue")
    search_fields = ("name", "owner__username")
    readonly_fields = ("metrics_seq", "created_at", "started_at", "finished_at")


@admin.register(EvalScore)
class EvalScoreAdmin(admin.ModelAdmin):
    list_display = ("run", "benchmark", "step", "k", "mean_at_k", "pass_at_k")
    list_filter = ("benchmark",)


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ("name", "hostname", "queues", "cpu_count", "last_heartbeat")
