"""The run page's Timeline tab: the spans every process of the run wrote to `timeline/<lane>.jsonl`
(`rl_core/rundir/timeline.py`), read from the run's directory on request.

Why a JSON endpoint over the run directory rather than the worker's tail into PostgreSQL and
the live socket: spans are a diagnostic read when someone opens the tab, not a series every
page needs, and they are many (a busy server writes one a second) — storing and pushing them
would cost every run, read or not. The run directory is where the run page already reads a
run's files from (logs, checkpoints, mirrors) under the same access rule
(`visible_run_or_404`, `run_paths.run_dir`), and a cluster run's roles write it on the shared
path, so one reader covers every node. Live is a poll: the page asks again every few seconds
while the run runs, sending each lane's byte offset, so only new lines travel.
"""

from __future__ import annotations

import re
from pathlib import Path

from django.http import HttpRequest, HttpResponse
from django.views.decorators.http import require_GET

from inflight.api.errors import error_response, json_response
from inflight.runs import run_paths
from inflight.runs.selectors import visible_run_or_404
from inflight.web.views import json_login_required
from rl_core.rundir.layout import read_cluster
from rl_core.rundir.timeline import lane_files, read_lane

LANE_RE = re.compile(r"^[a-z]{1,16}[0-9]{0,4}$")  # the launcher's child names: server0, trainer, trainer1, actor
MAX_BYTES_PER_LANE = 2 * 1024 * 1024  # one answer's share of a lane (~20k spans); the page asks again for the rest
MAX_LANES = 256
LANE_ORDER = {"server": 0, "trainer": 1, "actor": 2}


def parse_offsets(text: str) -> dict[str, int] | None:
    """`server0:1234,trainer:88` → {lane: byte offset}; None when malformed."""
    offsets: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        lane, _, value = item.partition(":")
        if not LANE_RE.match(lane) or not value.isdigit() or len(offsets) >= MAX_LANES:
            return None
        offsets[lane] = int(value)
    return offsets


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def lane_sort_key(lane: str) -> tuple[int, int, str]:
    role = lane.rstrip("0123456789")
    digits = lane[len(role):]
    return LANE_ORDER.get(role, 3), int(digits or 0), lane


@json_login_required
@require_GET
def run_timeline_json(request: HttpRequest, run_id: int) -> HttpResponse:
    """New spans of every lane since the offsets the page sent: `{"lanes": [{lane, role, node}],
    "spans": [...], "offsets": {lane: bytes}, "more": bool, "live": bool}`."""
    run = visible_run_or_404(request.user, run_id)
    offsets = parse_offsets(request.GET.get("offsets", ""))
    if offsets is None:
        return error_response(400, "offsets: send lane:bytes pairs separated by commas (as the last answer's offsets)")
    run_dir = run_paths.run_dir(run.pk)
    cluster = read_cluster(run_dir)
    nodes = {role.role: role.node for role in cluster.roles} if cluster else {}
    lanes, spans, new_offsets, more = [], [], {}, False
    for path in sorted(lane_files(run_dir), key=lambda p: lane_sort_key(p.stem))[:MAX_LANES]:
        lane = path.stem
        if not LANE_RE.match(lane):
            continue
        start = offsets.get(lane, 0)
        read, end = read_lane(path, start, MAX_BYTES_PER_LANE)
        # More than a line or two left past this answer's share: the page asks again at once.
        more = more or _size(path) - end > 4096
        spans.extend(read)
        new_offsets[lane] = end
        lanes.append({"lane": lane, "role": lane.rstrip("0123456789"), "node": nodes.get(lane)})
    return json_response({"lanes": lanes, "spans": spans, "offsets": new_offsets, "more": more, "live": not run.is_terminal})
