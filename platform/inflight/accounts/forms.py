from __future__ import annotations

from django import forms
from django.conf import settings

MAX_TOKEN_NAME = 100
# Lifetimes a user may pick for a token they make, bounded by the operator's INFLIGHT_API_TOKEN_DAYS.
TOKEN_DAY_CHOICES = (7, 30, 90, 365)


def token_day_choices() -> list[tuple[int, str]]:
    limit = settings.INFLIGHT_API_TOKEN_DAYS
    days = [d for d in TOKEN_DAY_CHOICES if limit <= 0 or d < limit] + ([limit] if limit > 0 else [])
    choices = [(d, f"{d} days") for d in sorted(set(days))]
    return choices + ([(0, "never expires")] if limit <= 0 else [])


class TokenForm(forms.Form):
    name = forms.CharField(
        label="Name", max_length=MAX_TOKEN_NAME, initial="cli",
        help_text="What the token is for (e.g. 'laptop', 'ci'), to tell your tokens apart.",
    )
    days = forms.TypedChoiceField(label="Valid for", coerce=int, choices=(), help_text="After this the token is refused.")

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.fields["days"].choices = token_day_choices()
        limit = settings.INFLIGHT_API_TOKEN_DAYS
        self.fields["days"].initial = limit if limit > 0 else 0
