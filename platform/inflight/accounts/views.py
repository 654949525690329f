"""The account page: a user makes and revokes their own API tokens (the CLI's and scripts'
credentials), without an operator. A new token's key is shown once, on the page the creation
redirects to; it is held for that one page in the server-side session, never in a cookie."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from inflight.accounts.forms import TokenForm
from inflight.accounts.models import ApiToken
from inflight.accounts.services import create_token, revoke_token

NEW_KEY_SESSION = "inflight_new_token"


@login_required
def account(request: HttpRequest) -> HttpResponse:
    if request.method == "POST":
        form = TokenForm(request.POST)
        if form.is_valid():
            token = create_token(request.user, form.cleaned_data["name"], days=form.cleaned_data["days"])
            request.session[NEW_KEY_SESSION] = {"id": token.pk, "key": token.key}
            return redirect("accounts:account")
    else:
        form = TokenForm()
    new = request.session.pop(NEW_KEY_SESSION, None)  # shown on this page only
    tokens = ApiToken.objects.filter(user=request.user).order_by("-created_at")
    status = 400 if request.method == "POST" else 200
    base_url = request.build_absolute_uri("/").rstrip("/")
    return render(request, "inflight/account.html", {"form": form, "tokens": tokens, "new_token": new, "base_url": base_url}, status=status)


@login_required
@require_POST
def token_revoke(request: HttpRequest, token_id: int) -> HttpResponse:
    token = revoke_token(request.user, token_id)
    if token is None:
        messages.error(request, f"You have no token {token_id}: nothing was revoked.")
    else:
        messages.success(request, f"Token '{token.name}' ({token.prefix}…) revoked: it is refused from now on.")
    return redirect("accounts:account")
