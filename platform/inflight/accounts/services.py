"""Writes of the accounts app: creating users and their API tokens."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from inflight.accounts.models import ApiToken


def create_token(user: AbstractBaseUser, name: str = "default") -> ApiToken:
    return ApiToken.objects.create(user=user, name=name)


def authenticate_token(key: str) -> AbstractBaseUser | None:
    """The active user owning `key`, or None. Records when the token was last used."""
    if not key:
        return None
    token = ApiToken.objects.select_related("user").filter(key=key).first()
    if token is None or not token.user.is_active:
        return None
    ApiToken.objects.filter(pk=token.pk).update(last_used_at=timezone.now())
    return token.user


@transaction.atomic
def ensure_demo_user(username: str, password: str) -> tuple[AbstractBaseUser, ApiToken]:
    """Create (or reset the password of) a demo user; returns it with an API token."""
    user_model = get_user_model()
    user, _ = user_model.objects.get_or_create(username=username)
    user.set_password(password)
    user.save()
    token = ApiToken.objects.filter(user=user, name="demo").first() or create_token(user, "demo")
    return user, token
