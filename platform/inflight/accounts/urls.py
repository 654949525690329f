"""Account pages, included at / by the root urlconf."""

from __future__ import annotations

from django.urls import path

from inflight.accounts import views

app_name = "accounts"

urlpatterns = [
    path("settings/account/", views.account, name="account"),
    path("settings/account/tokens/<int:token_id>/revoke/", views.token_revoke, name="token_revoke"),
]
