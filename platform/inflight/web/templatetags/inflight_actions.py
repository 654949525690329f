"""The run page's lineage line and actions panel (clone, checkpoints + fork, resume, tags,
note, archive, delete), as one inclusion tag so the shared run page template only includes it."""

from __future__ import annotations

from typing import Any

from django import template

from inflight.runs import actions
from inflight.runs.selectors import can_manage_run, runs_visible_to
from rl_core.rundir.layout import read_cluster

register = template.Library()


def run_cluster(run: Any) -> dict[str, Any] | None:
    """A cluster run's `cluster.json` (which role runs on which node), None for a one-node run."""
    if not (run.config or {}).get("cluster", {}).get("enabled") or not run.run_dir:
        return None
    record = read_cluster(run.run_dir)
    if record is None:
        return None
    return {"nodes": len({role.node for role in record.roles}), "placement_wait_s": record.placement_wait_s,
            "roles": [role.model_dump() for role in record.roles]}


@register.inclusion_tag("inflight/_run_actions.html", takes_context=True)
def run_actions_panel(context: template.Context, run: Any) -> dict[str, Any]:
    user = context["request"].user
    # Tags refused by the last save, as typed (run_actions.run_edit): shown back to be corrected.
    from inflight.web.run_actions import LABELS_DRAFT_KEY

    session = getattr(context["request"], "session", None)
    draft = session.pop(LABELS_DRAFT_KEY.format(run_id=run.pk), None) if session is not None else None
    visible = runs_visible_to(user)
    parent = visible.filter(pk=run.parent_id).first() if run.parent_id else None
    return {
        "run": run,
        "csrf_token": context.get("csrf_token"),
        "is_owner": run.owner_id == user.pk,
        "can_manage": can_manage_run(user, run),
        "parent": parent,
        "parent_hidden": bool(run.parent_id) and parent is None,
        # A deleted parent's label, to whom made the run (they saw the parent) or staff only.
        "deleted_parent_label": run.parent_label if not run.parent_id and can_manage_run(user, run) else "",
        "children": list(visible.filter(parent=run).select_related(None).order_by("id").only("pk", "name", "parent_step", "status")[:50]),
        "checkpoints": actions.run_checkpoints(run),
        "cluster": run_cluster(run),
        "resume_problem": actions.resume_problem(run) if run.is_resumable else None,
        "tags_text": ", ".join(run.tags or []) if draft is None else draft,
        "labels_draft": draft is not None,
    }
