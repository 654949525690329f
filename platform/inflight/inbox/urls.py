"""Inbox pages, included at / by the root urlconf."""

from __future__ import annotations

from django.urls import path

from inflight.inbox import views

app_name = "inbox"

urlpatterns = [
    path("inbox/", views.inbox, name="inbox"),
    path("inbox/read/", views.mark_read, name="mark_read"),
    path("settings/alerts/test/", views.webhook_test, name="webhook_test"),
]
