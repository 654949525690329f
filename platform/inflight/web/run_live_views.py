"""What an open run page refreshes without a reload: its status line and its actions panel.

The metrics reach the page as pushes (`live/consumers.py`); the rest of the page — the
checkpoint list, Resume / Delete, the worker the run is on — changes with the run's status, with
files the trainer writes and with users' actions, so the page asks for it again when a push says
it changed (`run.status`, `run.panel`, `eval.score`), when its socket (re)connects, and on a slow
safety poll (`static/inflight/run_page.js`); it no longer polls every few seconds. The panel is the
same server-rendered fragment the page was built with (`inflight_actions.run_actions_panel`):
one template, so a reloaded page and a refreshed one cannot disagree.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.views.decorators.http import require_GET

from inflight.runs.selectors import visible_run_or_404
from inflight.web.selectors import status_rows
from inflight.web.views import json_login_required


@json_login_required
@require_GET
def run_panel_json(request: HttpRequest, run_id: int) -> HttpResponse:
    """The run's status row plus its worker, stop-ability and the rendered actions panel."""
    run = visible_run_or_404(request.user, run_id)
    row = status_rows([run])[0]
    row.update(
        worker_name=run.worker_name or "",
        detail=run.status_note,
        can_stop=not run.is_terminal and run.status != "cancelling",
        actions_html=render_to_string("inflight/_run_actions_live.html", {"run": run}, request=request),
    )
    return JsonResponse(row)
