"""The inbox page (a user's alerts and run ends across all runs, unread first-class) and the
webhook's "send a test" button. Session auth like every page; each user sees only their own."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from inflight.inbox import services
from inflight.inbox.models import Notification, NotificationKind

PAGE_SIZE = 50
FILTERS = ("all", "unread")


@login_required
def inbox(request: HttpRequest) -> HttpResponse:
    shown = request.GET.get("show", "all")
    shown = shown if shown in FILTERS else "all"
    entries = Notification.objects.filter(user=request.user).select_related("run")
    if shown == "unread":
        entries = entries.filter(read_at__isnull=True)
    page = Paginator(entries, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(request, "inflight/inbox.html", {
        "page": page, "shown": shown, "unread": services.unread_count(request.user), "kinds": NotificationKind,
    })


@login_required
@require_POST
def mark_read(request: HttpRequest) -> HttpResponse:
    raw = request.POST.getlist("id")
    ids = [int(value) for value in raw if value.isdigit() and len(value) < 19]
    if raw and not ids:
        messages.error(request, "Nothing to mark: the entry ids were not numbers.")
        return redirect("inbox:inbox")
    count = services.mark_read(request.user, ids if raw else None)
    messages.success(request, f"{count} entr{'y' if count == 1 else 'ies'} marked read.")
    return redirect(reverse("inbox:inbox") + ("?show=unread" if request.POST.get("show") == "unread" else ""))


@login_required
@require_POST
def webhook_test(request: HttpRequest) -> HttpResponse:
    result = services.send_test(request.user)
    (messages.success if result.ok else messages.error)(request, f"Test message: {result.said}.")
    return redirect("web:alert_settings")
