"""bench/demo_health.py counts the alerts a demo run fires by replaying its files through the
platform's own pure rules; it must count what the platform would store, no more: the held-out
set's evaluation lines have their own rule (`heldout_collapse`), not `eval_drop`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from rl_core.config.run_config import RunConfig
from rl_core.rundir.layout import CONFIG_FILE, EVALS_FILE, METRICS_FILE

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import demo_health  # noqa: E402  (a bench script: its folder is its import root)


def write_run(run_dir: Path, metrics: list[dict], evals: list[dict]) -> None:
    alerts = {"heldout_window": 1, "heldout_drop": 0.2, "eval_drop": 0.1, "stall_s": 30}
    config = RunConfig.model_validate({"name": "replayed", "monitoring": {"alerts": alerts}})
    (run_dir / CONFIG_FILE).write_text(yaml.safe_dump(config.model_dump(mode="json")))
    (run_dir / METRICS_FILE).write_text("".join(json.dumps(line) + "\n" for line in metrics))
    (run_dir / EVALS_FILE).write_text("".join(json.dumps(line) + "\n" for line in evals))


def test_the_demo_replay_counts_what_the_platform_stores(tmp_path: Path) -> None:
    metrics = [
        {"t": 100.0, "step": 0, "success/heldout": 0.5},
        {"t": 110.0, "step": 5, "success/heldout": 0.7},
        {"t": 200.0, "step": 10, "success/heldout": 0.45},  # 90 s after the last line: stalled too
        {"t": 205.0, "step": 11, "train/loss": 0.3},
    ]
    evals = [
        {"step": 5, "benchmark": "heldout", "k": 4, "mean_at_k": 0.7},
        {"step": 10, "benchmark": "heldout", "k": 4, "mean_at_k": 0.45},  # heldout_collapse's, not eval_drop's
        {"step": 10, "benchmark": "math500", "k": 4, "mean_at_k": 0.6},
        {"step": 20, "benchmark": "math500", "k": 4, "mean_at_k": 0.45},
        {"step": 30, "benchmark": "math500", "k": 4, "mean_at_k": 0.4},  # the same episode
    ]
    write_run(tmp_path, metrics, evals)
    fired = demo_health.replay_alerts(tmp_path)
    assert [(alert.rule, alert.key, alert.step) for alert in fired] == [
        ("heldout_collapse", "", 10), ("stalled", "", 10), ("eval_drop", "math500", 20),
    ]
    assert fired[1].message.startswith("no metrics for 90 s")
