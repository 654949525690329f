"""Writes of the accounts app: creating users and their API tokens."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from inflight.accounts.models import ApiToken, generate_token_key, token_digest

MAX_KEY_LENGTH = 128


def _expiry(days: int | None) -> timezone.datetime | None:
    days = settings.INFLIGHT_API_TOKEN_DAYS if days is None else days
    return timezone.now() + timedelta(days=days) if days > 0 else None


def create_token(user: AbstractBaseUser, name: str = "default", days: int | None = None, key: str | None = None) -> ApiToken:
    """A new token; its plain `key` is on the returned instance only (the database keeps a digest).
    `days`: validity (default INFLIGHT_API_TOKEN_DAYS; 0 = no expiry)."""
    key = key or generate_token_key()
    token = ApiToken.objects.create(user=user, name=name, digest=token_digest(key), prefix=key[:8], expires_at=_expiry(days))
    token.key = key
    return token


def authenticate_token(key: str) -> AbstractBaseUser | None:
    """The active user owning `key` (not expired), or None. Records when the token was last used."""
    if not key or len(key) > MAX_KEY_LENGTH or "\x00" in key:
        return None
    token = ApiToken.objects.select_related("user").filter(digest=token_digest(key)).first()
    now = timezone.now()
    if token is None or not token.user.is_active or (token.expires_at is not None and token.expires_at <= now):
        return None
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
    return token.user


@transaction.atomic
def ensure_demo_user(username: str, password: str, token_key: str) -> tuple[AbstractBaseUser, ApiToken]:
    """Create (or reset the password of) a demo user; returns it with the API token `token_key`
    (kept by the demo next to its password, so a re-run prints the same one)."""
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(username=username)
    user.set_password(password)
    user.save()
    digest = token_digest(token_key)
    ApiToken.objects.filter(user=user, name="demo").exclude(digest=digest).delete()
    token = ApiToken.objects.filter(digest=digest).first()
    if token is None or (token.expires_at is not None and token.expires_at <= timezone.now()):
        ApiToken.objects.filter(digest=digest).delete()
        token = create_token(user, "demo", key=token_key)
    token.key = token_key
    return user, token


def revoke_token(user: AbstractBaseUser, token_id: int) -> ApiToken | None:
    """Delete one of `user`'s own tokens (refused from then on); None if `user` has no such token."""
    token = ApiToken.objects.filter(user=user, pk=token_id).first()
    if token is not None:
        token.delete()
    return token
