"""Pages and page JSON of the rollout viewer, alerts and exports (session auth, like the rest of
the site). Every view of one run goes through `visible_run_or_404`: others' runs answer 404."""

from __future__ import annotations

from functools import wraps
from typing import Any, Callable

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from inflight.alerts.models import AlertWebhook
from inflight.api.errors import error_response
from inflight.alerts.services import run_alerts
from inflight.rollouts import selectors
from inflight.rollouts.exports import EXPORT_KINDS, export_response
from inflight.rollouts.models import StoredRollout
from inflight.rollouts.params import BadParam, rollout_filter
from inflight.runs.models import EvalProblemResult
from inflight.runs.selectors import visible_run_or_404

MAX_ID = 2**63 - 1


def _json_view(view: Callable[..., Any]) -> Callable[..., HttpResponse]:
    """Signed-in GET returning JSON; 401/404/400 as JSON errors."""

    @wraps(view)
    @require_GET
    def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if not request.user.is_authenticated:
            return error_response(401, "sign in to read this run")
        try:
            result = view(request, *args, **kwargs)
        except Http404 as exc:
            return error_response(404, str(exc) or "not found")
        except BadParam as exc:
            return error_response(400, str(exc))
        return result if isinstance(result, HttpResponse) else JsonResponse(result)

    return wrapper


def _rollout(request: HttpRequest, run_id: int, rollout_id: int) -> tuple[Any, StoredRollout]:
    run = visible_run_or_404(request.user, run_id)
    try:
        if rollout_id > MAX_ID:
            raise StoredRollout.DoesNotExist
        return run, selectors.rollout_detail(run, rollout_id)
    except StoredRollout.DoesNotExist as exc:
        raise Http404(f"rollout {rollout_id} not found (it may have been thinned)") from exc


@_json_view
def rollouts_json(request: HttpRequest, run_id: int) -> Any:
    run = visible_run_or_404(request.user, run_id)
    return selectors.rollouts_page(run, rollout_filter(request.GET))


@_json_view
def rollout_counts_json(request: HttpRequest, run_id: int) -> Any:
    """The Rollouts tab's counts under its filters, asked again while live rows arrive (rollouts.js):
    a page of rows (18 KB at the demo's sizes) each time was what the tab cost the web node."""
    run = visible_run_or_404(request.user, run_id)
    return selectors.rollout_counts(run, rollout_filter(request.GET))


@_json_view
def rollout_json(request: HttpRequest, run_id: int, rollout_id: int) -> Any:
    run, row = _rollout(request, run_id, rollout_id)
    return selectors.detail_json(row, selectors.trainer_kl_coef(run))


@_json_view
def rollout_group_json(request: HttpRequest, run_id: int, rollout_id: int) -> Any:
    run, row = _rollout(request, run_id, rollout_id)
    return selectors.group_json(run, row)


@_json_view
def eval_problem_json(request: HttpRequest, run_id: int, eval_id: int) -> Any:
    """One evaluation problem's samples, for the same sample view as rollouts."""
    run = visible_run_or_404(request.user, run_id)
    problem_id = request.GET.get("problem_id", "")[:200]
    row = EvalProblemResult.objects.filter(eval__run_id=run.pk, eval_id=min(eval_id, MAX_ID), problem_id=problem_id).select_related("eval").first()
    if row is None:
        raise Http404(f"problem {problem_id!r} of evaluation {eval_id} not found")
    return {
        "run": run.pk, "benchmark": row.eval.benchmark, "step": row.eval.step, "policy_versions": row.eval.policy_versions,
        "problem_id": row.problem_id, "problem": row.problem, "answer": row.answer, "mean": row.mean, "pass": row.passed,
        "used_tool": row.used_tool,
        "samples": [
            {"text": text, "extracted": extracted, "correct": bool(verdict), "used_tool": used}
            for text, extracted, verdict, used in zip(
                row.samples, row.extracted + [None] * len(row.samples), row.verdicts + [False] * len(row.samples),
                (row.samples_used_tool or []) + [None] * len(row.samples),
            )
        ],
    }


@_json_view
def alerts_json(request: HttpRequest, run_id: int) -> Any:
    run = visible_run_or_404(request.user, run_id)
    return {"run": run.pk, "alerts": run_alerts(run)}


@login_required
@require_GET
def run_export(request: HttpRequest, run_id: int, kind: str) -> HttpResponse:
    run = visible_run_or_404(request.user, run_id)
    if kind not in EXPORT_KINDS:
        raise Http404(f"unknown export {kind[:40]!r}")
    return export_response(run, kind)


class WebhookForm(forms.Form):
    url = forms.URLField(
        label="Webhook URL", required=False, max_length=500, assume_scheme="https",
        help_text="Alerts of your runs are POSTed here as Slack-compatible JSON ({\"text\": ...}). Empty: no webhook.",
    )


@login_required
def alert_settings(request: HttpRequest) -> HttpResponse:
    from django.conf import settings

    hook = AlertWebhook.objects.filter(user=request.user).first()
    if request.method == "POST":
        form = WebhookForm(request.POST)
        if form.is_valid():
            url = form.cleaned_data["url"]
            if url:
                AlertWebhook.objects.update_or_create(user=request.user, defaults={"url": url, "enabled": True})
                messages.success(request, "Alert webhook saved.")
            else:
                AlertWebhook.objects.filter(user=request.user).delete()
                messages.success(request, "Alert webhook removed.")
            return redirect("web:alert_settings")
    else:
        form = WebhookForm(initial={"url": hook.url if hook else ""})
    return render(request, "inflight/alert_settings.html", {"form": form, "webhooks_enabled": settings.INFLIGHT_ALERT_WEBHOOKS})
