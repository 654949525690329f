"""Per-user API tokens: `Authorization: Token <key>` on every /api/ request."""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models


def generate_token_key() -> str:
    return secrets.token_hex(20)


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    key = models.CharField(max_length=64, unique=True, default=generate_token_key, help_text="The secret sent in the Authorization header.")
    name = models.CharField(max_length=100, default="default", help_text="What the token is for (e.g. 'laptop', 'ci').")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.user} / {self.name}"
