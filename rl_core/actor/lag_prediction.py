"""Before launch: the policy lag a config will see, predicted from the config alone.

The lag of a trained token is the trainer's version when it trains the token minus the version
that sampled it (docs/ARCHITECTURE.md "Versions and lag"). What sets it is how far generation
runs ahead of training: how many samples are in flight (`actor.groups_in_flight` x
`actor.group_size`) against the batch (`trainer.samples_per_step`), how long a response takes
(`sampling.max_new_tokens`, the servers' decode speed, their number) against a step, and the
bound the actor keeps at submission (`actor.max_lag`, `actor/lag_throttle.py`).

Async mode is a fast discrete-event simulation, not a closed form: groups finish out of order and
the throttle's earliest-deadline rule decides what is written when, which no closed form follows.
It drives the actor's own `LagThrottle` (the same bookkeeping the run uses) over:

- servers: `inference.num_servers`, each decoding all its running sequences per step, a step
  taking `decode_base_s + decode_per_seq_s x running` (at most `inference.max_batch_size`
  sequences; a group waits for room); a token is tagged with its server's version at its step;
- groups routed to the least-loaded server, G responses each, lengths drawn (seeded) uniformly
  in [0.25, 1.75] x the mean response length `response_fraction x max_new_tokens`, capped;
- the trainer: `samples_per_step` samples in stream order, a step of `train_base_s +
  train_per_token_s x completion tokens`, then the broadcast (`broadcast_s`; servers take the
  version when it ends) and the published progress the throttle reads.

It runs twice: with the throttle (the distribution a run logs as `policy_lag/share/<k>`), and
with only `groups_in_flight` (what the lag would be unbounded: its share past `max_lag` is how
often the bound must hold the actor back, which a run pays in waiting, not in stale samples;
a run's own share past the bound is `train/dropped_stale`, ~0). Sync mode is a closed form: a
batch of `sync_steps_per_batch` steps is sampled by one version, its k-th step trains it at lag k.

Not modelled: evaluations sharing the servers, zero-advantage drops and tail batching, start-up.
The speeds are assumptions (`LagAssumptions`): rough figures for the tiny model on an idle 2-core
CPU (the demo's ~0.5 s steps), not fitted to any run; the create page shows them and lets them be
changed. Only their ratios matter (generation against training). Measured error, and the same
prediction with the speeds fitted to each run's timeline (no better): bench/lag_prediction.py,
bench/RESULTS.md "Lag prediction". Torch-free and Django-free: the platform calls `predict_lag` as
the form changes.
"""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

from pydantic import BaseModel, Field

from rl_core.actor.lag_throttle import LagThrottle
from rl_core.config.run_config import RunConfig

LAG_BINS = 9  # as the trainer's histogram: lag 0 .. 7 and 8+ (trainer/loop.py LAG_HISTOGRAM_BINS)
MAX_SIMULATED_STEPS = 60  # enough for the steady state; keeps a prediction well under a second
UNBOUNDED_LAG = 10**6  # "no max_lag": the throttle then only counts, it never holds back


class LagAssumptions(BaseModel):
    """What the config cannot say: speeds and the response length. The defaults are rough figures for
    the tiny model on an idle 2-core CPU, not fitted (bench/RESULTS.md "Lag prediction")."""

    response_fraction: float = Field(0.3, gt=0, le=1, description="Mean response length as a share of sampling.max_new_tokens.")
    decode_base_s: float = Field(0.012, ge=0, description="Seconds of one server decode step, whatever its batch.")
    decode_per_seq_s: float = Field(0.0004, ge=0, description="Seconds a decode step adds per running sequence.")
    train_base_s: float = Field(0.05, ge=0, description="Seconds of an optimizer step whatever its batch.")
    train_per_token_s: float = Field(0.0003, ge=0, description="Trainer seconds per trained completion token.")
    broadcast_s: float = Field(0.03, ge=0, description="Seconds of a weight update (trainer broadcast until the servers hold it).")


class LagPrediction(BaseModel):
    """What the create page shows and the run page compares with the measured lag."""

    mode: str = Field(description="async or sync.")
    max_lag: int = Field(description="actor.max_lag of the config.")
    shares: list[float] = Field(description="Share of trained tokens at lag 0..7 and 8+ (as policy_lag/share/<k>).")
    mean: float = Field(description="Mean lag of trained tokens.")
    unbounded_shares: list[float] = Field(description="The same distribution without the max_lag bound (groups_in_flight only).")
    unbounded_mean: float = Field(description="Mean lag without the bound.")
    share_past_max_lag: float = Field(description="Share of samples that would be trained past max_lag without the bound "
                                                  "(the bound holds the actor back instead; a run drops ~0).")
    steps_per_s: float = Field(description="Simulated optimizer steps per second (0 in sync mode's closed form).")
    simulated_steps: int = Field(description="Optimizer steps simulated (0: closed form).")


@dataclass
class _Seq:
    group: int
    length: int
    runs: dict[int, int] = field(default_factory=dict)  # version -> tokens sampled by it

    @property
    def done(self) -> int:
        return sum(self.runs.values())


@dataclass
class _Server:
    version: int = 0
    running: list[_Seq] = field(default_factory=list)
    waiting: list[_Seq] = field(default_factory=list)
    busy: bool = False
    step_version: int = 0


def _histogram(lags: list[tuple[int, int]]) -> tuple[list[float], float]:
    """(lag, tokens) pairs → shares per bin and the mean."""
    counts = [0] * LAG_BINS
    total = weighted = 0
    for lag, tokens in lags:
        counts[min(lag, LAG_BINS - 1)] += tokens
        total += tokens
        weighted += lag * tokens
    total = max(1, total)
    return [count / total for count in counts], weighted / total


def simulate_async(config: RunConfig, assumptions: LagAssumptions, max_lag: int, steps: int,
                   seed: int = 0) -> tuple[list[tuple[int, int]], list[tuple[int, int]], float]:
    """The async pipeline for `steps` optimizer steps: (lag, tokens) of every trained sample's
    token runs, (sample max lag, 1) per sample, and the simulated seconds."""
    rng = random.Random(seed)
    a = assumptions
    group_size, in_flight_limit = config.actor.group_size, config.actor.groups_in_flight
    batch = config.trainer.samples_per_step
    slots = config.inference.max_batch_size
    mean_len = max(1.0, a.response_fraction * config.sampling.max_new_tokens)
    cap = config.sampling.max_new_tokens
    throttle: LagThrottle[int, _Seq] = LagThrottle(max_lag=max_lag, samples_per_step=batch, group_size=group_size)
    servers = [_Server() for _ in range(config.inference.num_servers)]
    events: list[tuple[float, int, str, int]] = []  # (time, tie-break, what, server index)
    tie = 0
    now = 0.0
    stream: list[_Seq] = []
    read = 0  # stream samples the trainer took
    consumed = 0  # published by the trainer after its broadcast (what the actor reads)
    version = 0
    trainer_busy = False
    groups_started = 0
    in_flight: dict[int, list[_Seq]] = {}
    token_lags: list[tuple[int, int]] = []
    sample_lags: list[tuple[int, int]] = []
    trained_steps = 0

    def push(at: float, what: str, index: int) -> None:
        nonlocal tie
        tie += 1
        heapq.heappush(events, (at, tie, what, index))

    def start_step(server: _Server, index: int) -> None:
        if server.busy:
            return  # a sequence joins at the next step boundary, under the version of that step
        room = slots - len(server.running)
        while server.waiting and room > 0:
            server.running.append(server.waiting.pop(0))
            room -= 1
        if server.running:
            server.busy = True
            server.step_version = server.version
            push(now + a.decode_base_s + a.decode_per_seq_s * len(server.running), "decode", index)

    def launch() -> None:
        nonlocal groups_started
        while len(in_flight) < in_flight_limit and throttle.may_submit(len(stream), consumed):
            index = groups_started
            groups_started += 1
            throttle.on_submitted(index, consumed)
            target = min(range(len(servers)), key=lambda i: (len(servers[i].running) + len(servers[i].waiting), i))
            seqs = [_Seq(index, max(1, min(cap, round(rng.uniform(0.25, 1.75) * mean_len)))) for _ in range(group_size)]
            in_flight[index] = seqs
            servers[target].waiting.extend(seqs)
            start_step(servers[target], target)

    def train_if_ready() -> None:
        nonlocal trainer_busy, read
        if trainer_busy or len(stream) - read < batch:
            return
        taken = stream[read:read + batch]
        read += batch
        tokens = 0
        for seq in taken:
            worst = 0
            for sampled_at, count in seq.runs.items():
                token_lags.append((version - sampled_at, count))
                tokens += count
                worst = max(worst, version - sampled_at)
            sample_lags.append((worst, 1))
        trainer_busy = True
        push(now + a.train_base_s + a.train_per_token_s * tokens, "trained", -1)

    launch()
    while events and trained_steps < steps:
        now, _, what, index = heapq.heappop(events)
        if what == "decode":
            server = servers[index]
            server.busy = False
            finished = []
            for seq in server.running:
                seq.runs[server.step_version] = seq.runs.get(server.step_version, 0) + 1
                if seq.done >= seq.length:
                    finished.append(seq)
            for seq in finished:
                server.running.remove(seq)
                group = in_flight.get(seq.group)
                if group is not None and all(member.done >= member.length for member in group):
                    del in_flight[seq.group]
                    throttle.on_finished(seq.group, group)
                    for written in throttle.take_writable(len(stream)):
                        stream.extend(written)
            start_step(server, index)
        elif what == "trained":
            version += 1
            trained_steps += 1
            push(now + a.broadcast_s, "broadcast", -1)
        elif what == "broadcast":
            for server in servers:
                server.version = version
            consumed = read
            trainer_busy = False
        launch()
        train_if_ready()
    return token_lags, sample_lags, now


def predict_lag(config: RunConfig, assumptions: LagAssumptions | None = None) -> LagPrediction:
    """The lag distribution `config` should see, bounded and unbounded (module docstring)."""
    assumptions = assumptions or LagAssumptions()
    max_lag = config.actor.max_lag
    if config.mode == "sync":
        per_batch = config.sync_steps_per_batch
        shares = [0.0] * LAG_BINS
        for k in range(per_batch):
            shares[min(k, LAG_BINS - 1)] += 1 / per_batch
        mean = (per_batch - 1) / 2
        past = sum(1 for k in range(per_batch) if k > max_lag) / per_batch
        return LagPrediction(mode="sync", max_lag=max_lag, shares=shares, mean=mean, unbounded_shares=shares,
                             unbounded_mean=mean, share_past_max_lag=past, steps_per_s=0.0, simulated_steps=0)
    steps = min(config.trainer.max_steps, MAX_SIMULATED_STEPS)
    tokens, _, seconds = simulate_async(config, assumptions, max_lag, steps)
    shares, mean = _histogram(tokens)
    free_tokens, free_samples, _ = simulate_async(config, assumptions, UNBOUNDED_LAG, steps)
    free_shares, free_mean = _histogram(free_tokens)
    past = sum(1 for lag, _ in free_samples if lag > max_lag) / max(1, len(free_samples))
    return LagPrediction(mode="async", max_lag=max_lag, shares=shares, mean=mean, unbounded_shares=free_shares,
                         unbounded_mean=free_mean, share_past_max_lag=past, steps_per_s=steps / max(seconds, 1e-9),
                         simulated_steps=steps)
