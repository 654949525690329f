"""Per-user API tokens: `Authorization: Token <key>` on every /api/ request.

Only a SHA-256 digest of the key is stored (a key is 160 random bits, so a fast digest is
enough: there is nothing to guess), with its first characters to tell tokens apart, and an
expiry (settings.INFLIGHT_API_TOKEN_DAYS). The key itself is shown once, when it is made.
"""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models


def generate_token_key() -> str:
    return secrets.token_hex(20)


def token_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    digest = models.CharField(max_length=64, unique=True, editable=False, help_text="SHA-256 of the key (the key itself is not stored).")
    prefix = models.CharField(max_length=8, editable=False, default="", help_text="The key's first characters, to tell tokens apart.")
    name = models.CharField(max_length=100, default="default", help_text="What the token is for (e.g. 'laptop', 'ci').")
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="After this the token is refused (empty: never).")
    last_used_at = models.DateTimeField(null=True, blank=True)

    # The plain key, only on the instance that `services.create_token` just made.
    key: str | None = None

    def __str__(self) -> str:
        return f"{self.user} / {self.name} ({self.prefix}…)"
