"""The built-in alert rules, as pure functions of metric lines and rolling windows (no database).

Each check returns the conditions that hold now: `{(rule, key): Firing}`, and those it shows to be
clear (`Verdicts.clear`: the episode ends). A rule on a measured level is neither while the level
sits between its threshold and its recovery margin (`RECOVERED_SHARE`): one reward collapse
hovering at the threshold is one episode and one alert, not one per crossing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rl_core.config.benchmarks import HELDOUT_BENCHMARK
from rl_core.common import metric_names as mn
from rl_core.config.monitoring import AlertsConfig
from rl_core.rundir.metrics import NONFINITE_PREFIX
from rl_core.launch.watchdog import SILENT_METRIC

RULES = {
    "nonfinite": "non-finite loss or gradient norm",
    "reward_collapse": "reward collapse",
    "heldout_collapse": "held-out success collapse",
    "entropy_collapse": "entropy collapse",
    "policy_lag": "policy lag above max_lag",
    "stale_dropped": "stale samples dropped",
    "stalled": "throughput stalled",  # key "": no metrics at all; key "watchdog": a role stopped answering
    "eval_drop": "evaluation score fell from its best",
    "no_learning_signal": "no learning signal",
}
# A drop rule (reward/held-out collapse, eval_drop) clears once the drop is back under this share
# of its threshold, and entropy_collapse once the entropy is back above entropy_min / this share:
# clearly recovered, not one step across the line (which fired four alerts for one collapse).
RECOVERED_SHARE = 0.5
# `no_learning_signal`: the watched values that mean nothing can be learned, each "none" when
# |value - its none| <= NO_SIGNAL_EPS over the whole window. A reward of exactly 0 (wrong answer
# format), every finished group's advantages 0 (all right or all wrong: share 1), a zero gradient.
NO_SIGNAL_WATCHED = (
    (mn.TRAIN_REWARD_MEAN, 0.0, "the training reward is 0"),
    (mn.ZERO_ADVANTAGE_SHARE, 1.0, "every group's advantages are 0 (all its answers equally right or wrong)"),
    (mn.TRAIN_GRAD_NORM, 0.0, "the gradient norm is 0"),
)
NO_SIGNAL_EPS = 1e-9
NO_SIGNAL_STATE = "no_learning_signal"  # its key in the rolling windows (metric names hold a "/")
NONFINITE_WATCHED = (mn.TRAIN_LOSS, mn.TRAIN_GRAD_NORM)
# (rule, metric, window setting, drop setting)
COLLAPSES = (
    ("reward_collapse", mn.TRAIN_REWARD_MEAN, "reward_window", "reward_drop"),
    ("heldout_collapse", mn.HELDOUT_SUCCESS, "heldout_window", "heldout_drop"),
)


@dataclass
class Firing:
    message: str
    values: dict[str, Any]


@dataclass
class Verdicts:
    """What one line says: conditions that hold (`firing`) and rules it shows to be clear."""

    firing: dict[tuple[str, str], Firing] = field(default_factory=dict)
    clear: set[tuple[str, str]] = field(default_factory=set)


def _update_window(windows: dict[str, Any], metric: str, value: float, size: int) -> tuple[float | None, float | None]:
    """Push `value`; returns (rolling mean over the last `size`, best rolling mean so far), or
    (None, best) while fewer than `size` values were seen."""
    entry = windows.setdefault(metric, {"values": [], "best": None})
    entry["values"] = (entry["values"] + [value])[-size:]
    if len(entry["values"]) < size:
        return None, entry["best"]
    mean = sum(entry["values"]) / size
    entry["best"] = mean if entry["best"] is None else max(entry["best"], mean)
    return mean, entry["best"]


def check_line(record: dict[str, Any], cfg: AlertsConfig, max_lag: int, windows: dict[str, Any]) -> Verdicts:
    out = Verdicts()
    step = record.get("step")
    bad = [name for name in NONFINITE_WATCHED if record.get(NONFINITE_PREFIX + name)]
    if bad:
        out.firing[("nonfinite", "")] = Firing(f"{' and '.join(bad)} became non-finite (NaN/inf) at step {step}", {"metrics": bad})
    elif any(name in record for name in NONFINITE_WATCHED):
        out.clear.add(("nonfinite", ""))
    for rule, metric, window_name, drop_name in COLLAPSES:
        if not isinstance(record.get(metric), (int, float)):
            continue
        size, drop = int(getattr(cfg, window_name)), float(getattr(cfg, drop_name))
        mean, best = _update_window(windows, metric, float(record[metric]), size)
        if mean is not None and best is not None and best - mean >= drop:
            out.firing[(rule, "")] = Firing(
                f"{metric}: mean of the last {size} is {mean:.3f}, {best - mean:.3f} below its best {best:.3f} (threshold {drop})",
                {"metric": metric, "mean": mean, "best": best, "drop": best - mean, "threshold": drop},
            )
        elif mean is not None and best is not None and best - mean < drop * RECOVERED_SHARE:
            out.clear.add((rule, ""))
    entropy = record.get(mn.TRAIN_ENTROPY)
    if isinstance(entropy, (int, float)):
        # A rolling mean: one step's value covers only that step's trained tokens and is noisy.
        size = int(cfg.entropy_window)
        mean, _ = _update_window(windows, mn.TRAIN_ENTROPY, float(entropy), size)
        if mean is not None and mean < cfg.entropy_min:
            out.firing[("entropy_collapse", "")] = Firing(
                f"{mn.TRAIN_ENTROPY}: mean of the last {size} steps is {mean:.4f}, below {cfg.entropy_min}",
                {"entropy": mean, "window": size, "threshold": cfg.entropy_min},
            )
        elif mean is not None and mean >= cfg.entropy_min / RECOVERED_SHARE:
            out.clear.add(("entropy_collapse", ""))
    lag = record.get(mn.POLICY_LAG_MAX)
    if isinstance(lag, (int, float)):
        if lag > max_lag:
            out.firing[("policy_lag", "")] = Firing(f"{mn.POLICY_LAG_MAX} {lag:g} is above max_lag {max_lag}", {"lag": lag, "max_lag": max_lag})
        else:
            out.clear.add(("policy_lag", ""))
    dropped = record.get(mn.TRAIN_DROPPED_STALE)
    if isinstance(dropped, (int, float)):
        if dropped > cfg.stale_dropped_max:
            out.firing[("stale_dropped", "")] = Firing(
                f"{dropped:g} stale samples dropped (more than {cfg.stale_dropped_max})", {"dropped": dropped, "threshold": cfg.stale_dropped_max}
            )
        else:
            out.clear.add(("stale_dropped", ""))
    _check_learning_signal(record, cfg, windows, out)
    _check_silent_roles(record, cfg, out)
    return out


def _check_silent_roles(record: dict[str, Any], cfg: AlertsConfig, out: Verdicts) -> None:
    """`stalled` (key "watchdog"): the launcher's watchdog says a role (a server, a trainer rank,
    the actor) has answered nothing for `role_silent_s` (rl_core/launch/watchdog.py): a stopped or wedged
    process, which logs nothing itself while the launcher's own lines keep the run looking alive."""
    longest = record.get(SILENT_METRIC)
    if not isinstance(longest, (int, float)):
        return
    pair = ("stalled", "watchdog")
    silent = {key.removeprefix(SILENT_METRIC + "/"): value for key, value in record.items()
              if key.startswith(SILENT_METRIC + "/") and isinstance(value, (int, float)) and value >= cfg.role_silent_s}
    if silent:
        roles = ", ".join(f"{role} for {seconds:.0f} s" for role, seconds in sorted(silent.items()))
        out.firing[pair] = Firing(
            f"stopped answering: {roles} (threshold {cfg.role_silent_s:g} s); the run fails after monitoring.hang_limit_s",
            {"roles": silent, "threshold": cfg.role_silent_s},
        )
    elif longest < cfg.role_silent_s * RECOVERED_SHARE:
        out.clear.add(pair)


def _check_learning_signal(record: dict[str, Any], cfg: AlertsConfig, windows: dict[str, Any], out: Verdicts) -> None:
    """`no_learning_signal`: the last `no_signal_window` values of a watched metric all say
    "nothing to learn" (NO_SIGNAL_WATCHED). One episode for the run whichever metrics say it (a
    reward of 0 makes every advantage and the gradient 0 too: one cause, one alert); it clears
    once every watched metric that has a full window shows a signal again."""
    size = int(cfg.no_signal_window)
    state = windows.setdefault(NO_SIGNAL_STATE, {})
    seen = False
    for metric, none_value, _words in NO_SIGNAL_WATCHED:
        value = record.get(metric)
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        seen = True
        recent = (state.get(metric, {}).get("recent", []) + [abs(float(value) - none_value) <= NO_SIGNAL_EPS])[-size:]
        state[metric] = {"recent": recent, "none": len(recent) == size and all(recent), "signal": len(recent) == size and not any(recent)}
    if not seen:
        return
    silent = [metric for metric, _none, _words in NO_SIGNAL_WATCHED if state.get(metric, {}).get("none")]
    if silent:
        words = "; ".join(words for metric, _none, words in NO_SIGNAL_WATCHED if metric in silent)
        out.firing[("no_learning_signal", "")] = Firing(
            f"nothing to learn from for the last {size} values: {words}. Check the answer format the reward expects, "
            f"the task's difficulty for this model, and actor.group_size",
            {"metrics": silent, "window": size},
        )
    elif all(entry.get("signal") for entry in state.values()):
        out.clear.add(("no_learning_signal", ""))


def eval_drop_watches(benchmark: str) -> bool:
    """Whether `eval_drop` judges this benchmark's evaluations. Not the held-out set's: it has its
    own rule on its `success/heldout` metric (`heldout_collapse`, with its window and threshold),
    one alert per signal, not two."""
    return benchmark != HELDOUT_BENCHMARK


def check_eval(benchmark: str, step: int, k: int, mean_at_k: float, best_earlier: float | None, cfg: AlertsConfig) -> Verdicts:
    """`eval_drop`: one evaluation's mean@k against the best of the benchmark's earlier steps."""
    out = Verdicts()
    if not eval_drop_watches(benchmark):
        return out
    pair = ("eval_drop", benchmark)
    if best_earlier is not None and best_earlier - mean_at_k >= cfg.eval_drop:
        out.firing[pair] = Firing(
            f"{benchmark} mean@{k} {mean_at_k:.3f} at step {step} is {best_earlier - mean_at_k:.3f} below its best {best_earlier:.3f}",
            {"benchmark": benchmark, "mean_at_k": mean_at_k, "best": best_earlier, "threshold": cfg.eval_drop},
        )
    elif best_earlier is None or best_earlier - mean_at_k < cfg.eval_drop * RECOVERED_SHARE:
        out.clear.add(pair)
    return out


def check_stall(idle_s: float, running: bool, cfg: AlertsConfig) -> Verdicts:
    """`stalled`: a running run logged no metric for `stall_s` seconds; `idle_s` = 0 (metrics
    arrived) or a run no longer running clears it."""
    out = Verdicts()
    if idle_s >= cfg.stall_s and running:
        out.firing[("stalled", "")] = Firing(
            f"no metrics for {idle_s:.0f} s while running (threshold {cfg.stall_s:g} s)", {"idle_s": idle_s, "threshold": cfg.stall_s}
        )
    else:
        out.clear.add(("stalled", ""))
    return out


def advance_episodes(active: set[tuple[str, str]], verdicts: Verdicts) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """An alert fires once per episode: a condition that holds starts one unless one is active,
    and a verdict that shows it clear ends it. Updates `active`; returns (started, ended)."""
    started = [pair for pair in verdicts.firing if pair not in active]
    ended = [pair for pair in verdicts.clear if pair not in verdicts.firing and pair in active]
    active.update(started)
    active.difference_update(ended)
    return started, ended
