"""API tokens: store a SHA-256 digest instead of the key, and an expiry."""

from __future__ import annotations

import hashlib
from datetime import timedelta

from django.conf import settings
from django.db import migrations, models
from django.utils import timezone


def hash_existing_keys(apps, schema_editor) -> None:
    token_model = apps.get_model("accounts", "ApiToken")
    days = getattr(settings, "INFLIGHT_API_TOKEN_DAYS", 90)
    expires = timezone.now() + timedelta(days=days) if days > 0 else None
    for token in token_model.objects.all():
        token.digest = hashlib.sha256(token.key.encode("utf-8")).hexdigest()
        token.prefix = token.key[:8]
        token.expires_at = expires
        token.save(update_fields=["digest", "prefix", "expires_at"])


class Migration(migrations.Migration):
    dependencies = [("accounts", "0001_initial")]

    operations = [
        migrations.AddField("apitoken", "digest", models.CharField(max_length=64, null=True, editable=False)),
        migrations.AddField("apitoken", "prefix", models.CharField(max_length=8, default="", editable=False, help_text="The key's first characters, to tell tokens apart.")),
        migrations.AddField("apitoken", "expires_at", models.DateTimeField(null=True, blank=True, help_text="After this the token is refused (empty: never).")),
        migrations.RunPython(hash_existing_keys, migrations.RunPython.noop),
        migrations.RemoveField("apitoken", "key"),
        migrations.AlterField("apitoken", "digest", models.CharField(max_length=64, unique=True, editable=False, help_text="SHA-256 of the key (the key itself is not stored).")),
    ]
