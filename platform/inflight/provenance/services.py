"""Store a run's provenance records (the worker, once the run is running) and read them back."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from inflight.provenance.models import RunProvenance
from rl_core.launch.provenance import ProvenanceRecord, read_provenance


def ingest_provenance(run_id: int, run_dir: str | Path) -> int:
    """Store what the run directory's provenance.jsonl holds now; returns how many launches."""
    records = read_provenance(run_dir)
    if records:
        RunProvenance.objects.update_or_create(run_id=run_id, defaults={"launches": [r.model_dump(mode="json") for r in records]})
    return len(records)


def latest_launches(run_ids: Sequence[int]) -> dict[int, ProvenanceRecord]:
    """Each run's latest launch record (runs without one are absent)."""
    found = {}
    for row in RunProvenance.objects.filter(run_id__in=list(run_ids)):
        if row.launches:
            found[row.run_id] = ProvenanceRecord.model_validate(row.launches[-1])
    return found


def launches_of(run_id: int) -> list[ProvenanceRecord]:
    row = RunProvenance.objects.filter(run_id=run_id).first()
    return [ProvenanceRecord.model_validate(item) for item in row.launches] if row else []
