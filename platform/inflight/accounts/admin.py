from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.http import HttpRequest

from inflight.accounts.models import ApiToken, generate_token_key, token_digest
from inflight.accounts.services import _expiry


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("user", "name", "prefix", "created_at", "expires_at", "last_used_at")
    search_fields = ("user__username", "name")
    readonly_fields = ("prefix", "created_at", "last_used_at")

    def save_model(self, request: HttpRequest, obj: ApiToken, form: Any, change: bool) -> None:
        if not change:
            # The key is shown once, here; only its digest is stored.
            key = generate_token_key()
            obj.digest, obj.prefix = token_digest(key), key[:8]
            if obj.expires_at is None:
                obj.expires_at = _expiry(None)
            super().save_model(request, obj, form, change)
            messages.warning(request, f"The new token's key (shown only now): {key}")
            return
        super().save_model(request, obj, form, change)
