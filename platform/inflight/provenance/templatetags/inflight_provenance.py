"""`{% run_provenance run %}` (run page: what ran it) and `{% provenance_diff runs %}` (compare:
what differs between the runs' latest launches). Each reads the stored records in one query."""

from __future__ import annotations

import shlex
from typing import Any, Sequence

from django import template

from inflight.provenance.services import latest_launches, launches_of
from rl_core.launch.provenance import differences

register = template.Library()


@register.inclusion_tag("inflight/_run_provenance.html")
def run_provenance(run: Any) -> dict[str, Any]:
    launches = launches_of(run.pk)
    latest = launches[-1] if launches else None
    first = launches[0] if launches else None
    changed = differences([first, latest]) if first is not None and latest is not first else None
    return {
        "run": run, "latest": latest, "launches": len(launches), "command": shlex.join(latest.command) if latest else "",
        "packages": sorted(latest.packages.items()) if latest else [], "changed_since_first": changed,
    }


@register.inclusion_tag("inflight/_provenance_diff.html")
def provenance_diff(runs: Sequence[Any]) -> dict[str, Any]:
    runs = list(runs)
    latest = latest_launches([run.pk for run in runs])
    records = [latest.get(run.pk) for run in runs]
    found = differences(records) if len(runs) > 1 else {"fields": [], "packages": [], "missing": []}
    # Commands are not compared: each names its own run directory (the run page shows it whole).
    return {"runs": runs, "diff": found, "any_recorded": any(r is not None for r in records),
            "missing_runs": [runs[i] for i in found["missing"]]}
