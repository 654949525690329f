"""`read_metrics`: every complete record of a run's `metrics.jsonl` or `evals.jsonl` at once, for
tests and benches (`from tests.metrics_file import read_metrics`; benchlib puts the checkout on
sys.path). The product reads these files as they grow, through `rl_core.common.jsonl_tail.JsonlTail`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All complete records of a metrics file (a torn last line is skipped)."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            if not line.endswith("\n"):
                break
            records.append(json.loads(line))
    return records
