from __future__ import annotations

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "inflight.accounts"
    label = "accounts"
    verbose_name = "Accounts and API tokens"
