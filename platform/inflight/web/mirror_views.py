"""The run page's download of a metric mirror folder (W&B, TensorBoard) as a .tar.gz: the same
stream as the API's (`api.mirror_files.mirror_archive_response`), with the page's session auth."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from inflight.api.errors import ApiError
from inflight.api.mirror_files import mirror_archive_response
from inflight.runs.selectors import visible_run_or_404


@login_required
@require_GET
def run_mirror(request: HttpRequest, run_id: int, kind: str) -> HttpResponse:
    run = visible_run_or_404(request.user, run_id)
    try:
        return mirror_archive_response(run.pk, kind)
    except ApiError as exc:
        raise Http404(exc.message) from exc
