"""`python manage.py create_token USERNAME [--name NAME]`: print a new API token for a user."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from inflight.accounts.services import create_token


class Command(BaseCommand):
    help = "Create an API token (Authorization: Token <key>) for an existing user and print it."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("username", help="The user the token acts as.")
        parser.add_argument("--name", default="cli", help="What the token is for (shown in the admin).")
        parser.add_argument("--days", type=int, default=None, help="Days until it expires (default INFLIGHT_API_TOKEN_DAYS; 0: never).")

    def handle(self, *args: Any, **options: Any) -> None:
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"no user named {options['username']!r}")
        self.stdout.write(create_token(user, options["name"], days=options["days"]).key or "")
