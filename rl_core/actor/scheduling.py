"""Where rollouts run: routing across inference servers (least-loaded, HistoPipe).

- A `Router` picks the inference server for each prompt group. `LeastLoadedRouter` sends a
  group to the server with the fewest sequences in flight. `HistoPipeRouter` (RhymeRL) predicts
  each group's length from the prompt's previous responses (`LengthPredictor`), orders a batch
  longest-predicted-first and places each group on the server with the least *predicted*
  outstanding work (greedy LPT), so servers finish a step together instead of one straggling.

Which rollouts wait (RollPacker's tail batching) is `actor/tail_batching.py`. Nothing here touches
torch or the network: these are pure bookkeeping objects, driven by the actor with prompt ids
and finished groups' response lengths.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Protocol, Sequence

from rl_core.config.run_config import HistoPipeConfig, RunConfig


class Router(Protocol):
    """What the actor calls. `server_loads[i]` is the actor's own count of sequences in flight
    on server i (the router may use it or its own predicted accounting)."""

    def pick(self, prompt_id: str, n: int, server_loads: Sequence[float]) -> int:
        """Server index for a group of `n` responses to `prompt_id`; call once per launched group."""
        ...

    def observe(self, prompt_id: str, response_lengths: Sequence[int]) -> None:
        """The group launched for `prompt_id` is over: its response token counts (empty when it
        was aborted and nothing should be learned). Releases the group's load."""
        ...

    def order(self, prompt_ids: Sequence[str]) -> list[str]:
        """The order in which to launch a batch of prompts."""
        ...

    def metrics(self) -> dict[str, float]:
        """`sched/...` figures since the last call."""
        ...


def least_loaded(server_loads: Sequence[float]) -> int:
    """Index of the smallest load; ties go to the lowest index (deterministic)."""
    if not server_loads:
        raise ValueError("server_loads is empty: there must be at least one server")
    return min(range(len(server_loads)), key=lambda index: (server_loads[index], index))


class LeastLoadedRouter:
    """Plain routing: the server with the fewest sequences in flight, launch order unchanged."""

    def pick(self, prompt_id: str, n: int, server_loads: Sequence[float]) -> int:
        return least_loaded(server_loads)

    def observe(self, prompt_id: str, response_lengths: Sequence[int]) -> None:
        return None

    def order(self, prompt_ids: Sequence[str]) -> list[str]:
        return list(prompt_ids)

    def metrics(self) -> dict[str, float]:
        return {}


class LengthPredictor:
    """Per-prompt response-length history → predicted length of the next response.

    Only the most recent group of each prompt is kept (RhymeRL's observation: a prompt's
    response lengths are similar from one epoch to the next), and the prediction is that
    group's mean. A prompt never seen is predicted at the running mean over all observed
    responses, or `prior_len` before anything was observed."""

    def __init__(self, prior_len: float) -> None:
        if prior_len <= 0:
            raise ValueError(f"prior_len must be > 0, got {prior_len}")
        self.prior_len = float(prior_len)
        self.last_lengths: dict[str, list[int]] = {}
        self._global_sum = 0.0
        self._global_count = 0

    def has_history(self, prompt_id: str) -> bool:
        return prompt_id in self.last_lengths

    def predict(self, prompt_id: str) -> float:
        lengths = self.last_lengths.get(prompt_id)
        if lengths:
            return sum(lengths) / len(lengths)
        if self._global_count:
            return self._global_sum / self._global_count
        return self.prior_len

    def observe(self, prompt_id: str, response_lengths: Sequence[int]) -> None:
        lengths = [int(length) for length in response_lengths]
        if not lengths:
            return
        if any(length < 0 for length in lengths):
            raise ValueError(f"response lengths of {prompt_id!r} must be >= 0, got {lengths}")
        self.last_lengths[prompt_id] = lengths
        self._global_sum += sum(lengths)
        self._global_count += len(lengths)


def pearson_correlation(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson r of two equally long sequences; NaN when either is constant or too short."""
    if len(xs) != len(ys):
        raise ValueError(f"sequences differ in length: {len(xs)} vs {len(ys)}")
    count = len(xs)
    if count < 2:
        return math.nan
    mean_x = sum(xs) / count
    mean_y = sum(ys) / count
    cov = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
    var_x = sum((x - mean_x) ** 2 for x in xs)
    var_y = sum((y - mean_y) ** 2 for y in ys)
    if var_x <= 0 or var_y <= 0:
        return math.nan
    return cov / math.sqrt(var_x * var_y)


def load_spread(loads: Sequence[float]) -> float:
    """(max − min) / mean of per-server loads: 0 is perfectly balanced."""
    if not loads:
        return 0.0
    mean = sum(loads) / len(loads)
    return (max(loads) - min(loads)) / mean if mean > 0 else 0.0


class HistoPipeRouter:
    """RhymeRL HistoPipe: longest-predicted-first, each group to the least predicted load.

    The router keeps its own per-server tally of predicted outstanding tokens: `pick` adds
    `n × predicted length` to the chosen server, `observe` removes it again (groups of the
    same prompt in flight at once are released first-in first-out). `server_loads` from the
    actor only breaks ties, so several actors' routers would not fight over the same server."""

    def __init__(self, predictor: LengthPredictor) -> None:
        self.predictor = predictor
        self.predicted_load: list[float] = []
        self._in_flight: dict[str, deque[tuple[int, float, float]]] = {}  # prompt -> (server, load, predicted len)
        self._predicted: list[float] = []  # for the predicted-vs-actual correlation since last metrics()
        self._actual: list[float] = []
        self._assigned_since_metrics: list[float] = []

    def order(self, prompt_ids: Sequence[str]) -> list[str]:
        # Stable sort: equal predictions keep the caller's order.
        return sorted(prompt_ids, key=lambda prompt_id: -self.predictor.predict(prompt_id))

    def pick(self, prompt_id: str, n: int, server_loads: Sequence[float]) -> int:
        if not server_loads:
            raise ValueError("server_loads is empty: there must be at least one server")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        while len(self.predicted_load) < len(server_loads):
            self.predicted_load.append(0.0)
            self._assigned_since_metrics.append(0.0)
        candidates = range(len(server_loads))
        server = min(candidates, key=lambda index: (self.predicted_load[index], server_loads[index], index))
        predicted_len = self.predictor.predict(prompt_id)
        load = n * predicted_len
        self.predicted_load[server] += load
        self._assigned_since_metrics[server] += load
        self._in_flight.setdefault(prompt_id, deque()).append((server, load, predicted_len))
        return server

    def observe(self, prompt_id: str, response_lengths: Sequence[int]) -> None:
        queue = self._in_flight.get(prompt_id)
        if queue:
            server, load, predicted_len = queue.popleft()
            if not queue:
                del self._in_flight[prompt_id]
            # max(): float sums of many adds/removes must not drift below zero.
            self.predicted_load[server] = max(0.0, self.predicted_load[server] - load)
            if response_lengths:
                self._predicted.append(predicted_len)
                self._actual.append(sum(response_lengths) / len(response_lengths))
        self.predictor.observe(prompt_id, response_lengths)

    def metrics(self) -> dict[str, float]:
        out: dict[str, float] = {}
        correlation = pearson_correlation(self._predicted, self._actual)
        if not math.isnan(correlation):
            out["sched/predicted_vs_actual_len"] = correlation
        if self._assigned_since_metrics:
            out["sched/load_spread"] = load_spread(self._assigned_since_metrics)
        self._predicted.clear()
        self._actual.clear()
        self._assigned_since_metrics = [0.0] * len(self._assigned_since_metrics)
        return out


def make_router(config: RunConfig | HistoPipeConfig) -> Router:
    """The router a run's config asks for (HistoPipe when `accelerations.histopipe.enabled`)."""
    histopipe = config.accelerations.histopipe if isinstance(config, RunConfig) else config
    if histopipe.enabled:
        return HistoPipeRouter(LengthPredictor(histopipe.prior_len))
    return LeastLoadedRouter()


def assign_batch(
    router: Router, prompt_ids: Sequence[str], n: int, server_loads: Sequence[float]
) -> list[tuple[str, int]]:
    """Place the groups the actor launches together (a sync batch, an async refill): the
    router's launch order, then a server for each. Returns (prompt_id, server) in launch
    order; equal prompt ids keep their relative order (the router's order is stable).

    `server_loads` are the sequences already in flight per server; the groups placed here
    are added to a copy as they are placed, which is what least-loaded needs; HistoPipe
    uses its predicted tallies instead. The actor calls this; so does bench/histopipe.py."""
    if not server_loads:
        raise ValueError("server_loads is empty: there must be at least one server")
    loads = [float(load) for load in server_loads]
    placement = []
    for prompt_id in router.order(prompt_ids):
        server = router.pick(prompt_id, n, loads)
        loads[server] += n
        placement.append((prompt_id, server))
    return placement
