"""What the actor submits, and when: the prompt order, the throttle, the eval schedule, and one
submission plan per way of turning prompts into groups.

The actor's loop (`actor/loop.py`) is the same in every mode: refresh the trainer's progress, start
the evaluations that are due, let the plan launch what the throttle allows, collect finished
groups, hand them to the throttle, write what it releases. The modes differ only in the two
objects built here from the config:

- the throttle: `LagBound` (async: the `max_lag` bound of `actor/lag_throttle.py`) or `SyncBatches`
  (sync: whole batches with frozen weights, the next one only after the trainer took the last);
- the plan: `PlainGroups` (one request with n = G per group, a launch pass placed by
  `scheduling.assign_batch`), `TailWindow` (async RollPacker tail batching: one request per
  response, short groups overtaken too often are deferred) or `TailRounds` (sync RollPacker:
  each batch is one round of `tail_batching.TailBatchPlanner`).

The two RollPacker plans share one fan-out/abort helper (`fan_out`): every response is its own
request, so responses finish one by one and the surplus is aborted on the server.

Nothing here opens a connection: a plan reaches the servers through its host (the `Actor`,
which owns the transport, the scoring and the in-flight bookkeeping).
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Coroutine, Hashable, Iterator, Literal, Mapping, Protocol, Sequence, TypeVar

from rl_core.config.run_config import EvalConfig, RunConfig
from rl_core.common.contracts import GenerationResult, RolloutSample, SamplingParams
from rl_core.actor.lag_throttle import LagThrottle
from rl_core.actor.scheduling import Router, assign_batch
from rl_core.actor.tail_batching import (
    AsyncTailTracker, RoundKind, TailBatchPlanner, make_async_tail_tracker, make_tail_planner,
)
from rl_core.envs.problems import Problem, TaskData

Key = TypeVar("Key", bound=Hashable)
GroupSamples = list[RolloutSample]


# --- the prompt order -----------------------------------------------------------------


class PromptSource:
    """The training prompts in submission order: the task's endless `(epoch, problem)` stream
    behind a deque of prompts handed back. A plan that draws a prompt and then launches another
    one first (a long-tail prompt's turn) pushes the drawn one back to the front, so it is the
    next one drawn and the order of fresh prompts never changes."""

    def __init__(self, stream: Iterator[tuple[int, Problem]]) -> None:
        self._stream = stream
        self._returned: deque[tuple[int, Problem]] = deque()

    def skip(self, count: int) -> None:
        """Drop the first `count` prompts (a restarted actor continues where the stream ends)."""
        for _ in range(count):
            self.draw()

    def draw(self) -> tuple[int, Problem]:
        if self._returned:
            return self._returned.popleft()
        return next(self._stream)

    def push_front(self, item: tuple[int, Problem]) -> None:
        """Hand back a drawn prompt: it is drawn next (before anything handed back earlier)."""
        self._returned.appendleft(item)


# --- zero-advantage groups ------------------------------------------------------------


class ZeroAdvantageGroups:
    """What becomes of a group whose rewards are all equal (advantage 0 on every sample: no
    gradient). Kept by default (it counts in the step's normaliser, as TRL keeps it); dropped with
    `actor.drop_zero_advantage_groups`; with `trainer.loss` dapo dropped and its prompt drawn again
    (DAPO's dynamic sampling, Yu et al. 2025), at most `actor.dynamic_sampling_max_resamples` times
    per prompt and epoch. A prompt drawn again goes to the front of the prompt order, so it is
    launched by the plan like any prompt: through the same throttle, which keeps the max_lag bound."""

    def __init__(self, drops: bool, max_resamples: int) -> None:
        self.drops = drops
        self.max_resamples = max_resamples
        self.resamples: dict[tuple[int, str], int] = {}  # (epoch, prompt id) -> times drawn again
        self.waiting: deque[tuple[int, Problem]] = deque()  # to draw again, oldest first
        self.resampled = 0  # groups whose prompt was drawn again, since the last `take_count`

    @classmethod
    def from_config(cls, config: RunConfig) -> ZeroAdvantageGroups:
        dynamic = config.trainer.loss == "dapo"
        return cls(dynamic or config.actor.drop_zero_advantage_groups,
                   config.actor.dynamic_sampling_max_resamples if dynamic else 0)

    def on_group(self, epoch: int, problem: Problem, informative: bool) -> bool:
        """A group of `problem` was scored; True when it is dropped (its prompt perhaps queued again)."""
        key = (epoch, problem.id)
        if informative or not self.drops:
            self.resamples.pop(key, None)
            return False
        used = self.resamples.get(key, 0)
        if used < self.max_resamples:
            self.resamples[key] = used + 1
            self.waiting.append((epoch, problem))
            self.resampled += 1
        else:
            self.resamples.pop(key, None)
        return True

    def return_prompts(self, prompts: PromptSource) -> None:
        """Put the prompts to draw again at the front of `prompts`, the oldest first."""
        while self.waiting:
            prompts.push_front(self.waiting.pop())

    def take_count(self) -> int:
        count, self.resampled = self.resampled, 0
        return count


# --- the throttle ---------------------------------------------------------------------


class Throttle(Protocol):
    """Which groups may start, and which finished ones are written now. `written` is the
    stream's length, `consumed` the trainer's published sample count; the window of
    `actor.groups_in_flight` is the actor's own check, before this one."""

    def may_submit(self, written: int, consumed: int) -> bool: ...

    def on_submitted(self, index: int, consumed: int) -> None:
        """Group `index` is launched (counted before its task exists, so one launch pass stops in time)."""
        ...

    def on_finished(self, index: int | None, samples: GroupSamples, written: int, idle: bool) -> list[GroupSamples]:
        """A group (`index` None: a sync tail round) finished with `samples` (empty: dropped or
        deferred); `idle`: nothing else is in flight. Returns the sample lists to append, in order."""
        ...


class LagBound:
    """Async mode: the `max_lag` bound kept at submission (`lag_throttle.LagThrottle`): a group
    starts only if it can land before its stream-slot deadline, and a finished one is written
    only while every older pending group still fits before its own."""

    def __init__(self, lag: LagThrottle[int, RolloutSample]) -> None:
        self.lag = lag

    def may_submit(self, written: int, consumed: int) -> bool:
        return self.lag.may_submit(written, consumed)

    def on_submitted(self, index: int, consumed: int) -> None:
        self.lag.on_submitted(index, consumed)

    def on_finished(self, index: int | None, samples: GroupSamples, written: int, idle: bool) -> list[GroupSamples]:
        assert index is not None  # every async group is submitted under its index
        self.lag.on_finished(index, samples)
        return self.lag.take_writable(written)


@dataclass
class SyncBatches:
    """Sync mode: `batch` samples generated with frozen weights, written at once when the last
    group of the batch is in, and the next batch only once the trainer has taken every full step
    of the last one (it publishes after broadcasting, so the servers hold the new weights)."""

    batch: int
    samples_per_step: int
    group_size: int
    # Plain groups: a dropped (zero-advantage) group does not fill the batch, so another one is
    # launched with the same frozen weights. Otherwise the batch comes up short and its
    # remainder is trained with the next batch, after an update (lag 1 in sync mode). A tail
    # round keeps exactly its batch's groups, so it has nothing to refill.
    refill_dropped: bool = True
    launched: int = 0  # samples launched in the current batch
    buffer: GroupSamples = field(default_factory=list)

    def may_submit(self, written: int, consumed: int) -> bool:
        if self.launched == 0 and (written - consumed >= self.samples_per_step or self.buffer):
            return False
        return self.launched < self.batch

    def on_submitted(self, index: int, consumed: int) -> None:
        self.launched += self.group_size

    def launch_batch(self) -> None:
        """A tail round counts as the whole batch launched (it keeps exactly that many)."""
        self.launched = self.batch

    def on_finished(self, index: int | None, samples: GroupSamples, written: int, idle: bool) -> list[GroupSamples]:
        if not samples and self.refill_dropped:
            self.launched -= self.group_size
        self.buffer.extend(samples)
        if self.launched >= self.batch and idle:
            out, self.buffer, self.launched = [self.buffer], [], 0
            return out
        return []


def make_throttle(config: RunConfig) -> Throttle:
    samples_per_step, group_size = config.trainer.samples_per_step, config.actor.group_size
    if config.mode == "sync":
        return SyncBatches(config.sync_steps_per_batch * samples_per_step, samples_per_step, group_size,
                           refill_dropped=not config.accelerations.tail_batching.enabled)
    return LagBound(LagThrottle(config.actor.max_lag, samples_per_step, group_size))


# --- the eval schedule ----------------------------------------------------------------

EvalKind = Literal["heldout", "benchmarks"]


class EvalSchedule:
    """When the actor evaluates, by trainer version: `success/heldout` at version 0, then every
    `eval.heldout_every_n_steps`; the benchmarks of `eval.benchmarks` every `eval.every_n_steps`
    (not at 0); both at the final version unless that version was already evaluated (max_steps
    a multiple of the interval: the same weights twice would only log a duplicate line)."""

    def __init__(self, config: EvalConfig) -> None:
        self.heldout_every = config.heldout_every_n_steps
        self.benchmark_every = config.every_n_steps
        self.has_benchmarks = bool(config.benchmarks)
        self.next_heldout = 0
        self.next_benchmark: int | None = config.every_n_steps if config.every_n_steps else None
        self.evaluated: dict[EvalKind, set[int]] = {"heldout": set(), "benchmarks": set()}

    def due(self, version: int) -> list[EvalKind]:
        """The evaluations to start now (each marked as done for `version`)."""
        kinds: list[EvalKind] = []
        if version >= self.next_heldout:
            kinds.append("heldout")
            self.evaluated["heldout"].add(version)
            self.next_heldout = version + self.heldout_every if self.heldout_every else 10**12
        if self.has_benchmarks and self.next_benchmark is not None and version >= self.next_benchmark:
            kinds.append("benchmarks")
            self.evaluated["benchmarks"].add(version)
            self.next_benchmark = version + self.benchmark_every
        return kinds

    def final(self, version: int) -> list[EvalKind]:
        """The evaluations of the final version still to run."""
        kinds: list[EvalKind] = []
        if version not in self.evaluated["heldout"]:
            kinds.append("heldout")
        if self.has_benchmarks and version not in self.evaluated["benchmarks"]:
            kinds.append("benchmarks")
        return kinds


# --- what a plan needs from the actor -------------------------------------------------


class PlanHost(Protocol):
    """The actor as its plans see it: the transport, the scoring, the in-flight bookkeeping."""

    task: TaskData
    router: Router
    clients: list[Any]
    server_loads: list[float]
    sampling: SamplingParams
    group_size: int
    problems_by_id: dict[str, Problem]
    sink: Any
    version: int

    def may_submit(self) -> bool: ...

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        """A problem's first messages (the environment's `first_messages`)."""
        ...

    def reserve_group(self) -> int: ...

    def new_group_index(self) -> int: ...

    def start_group(self, index: int, coroutine: Coroutine[Any, Any, GroupSamples]) -> None: ...

    def start_round(self, coroutine: Coroutine[Any, Any, GroupSamples]) -> None: ...

    async def generate_on(self, server: int, messages: list[dict[str, str]], sampling: SamplingParams, n: int,
                          prompt_id: str | None, request_id_prefix: str | None = None) -> list[GenerationResult]: ...

    async def score_group(self, problem: Problem, epoch: int, group_id: str,
                          results: list[GenerationResult]) -> GroupSamples: ...


class SubmissionPlan(Protocol):
    def launch(self, prompts: PromptSource) -> None:
        """Start every group (or round) the host's throttle allows now, drawing from `prompts`."""
        ...

    def metrics(self) -> dict[str, float]:
        """Figures for the actor's periodic metric line (since the last call)."""
        ...


# --- one response per request: fan out, abort the surplus -----------------------------


@dataclass(frozen=True)
class Request:
    server: int
    messages: list[dict[str, str]]
    prompt_id: str
    request_id: str


async def fan_out(
    host: PlanHost,
    requests: Mapping[Key, Request],
    on_result: Callable[[Key, GenerationResult], Sequence[tuple[int, str]]],
    is_open: Callable[[], bool] = lambda: True,
) -> None:
    """Send every request (n=1 each) and report each finished response to `on_result`, which
    returns the (server, request id prefix) pairs to abort now; an aborted response is never
    reported (it does not count as finished). Stops reporting once `is_open()` is False.

    Requests are aborted on the server rather than cancelled here: an aborted request ends with
    its partial result within a step, while cancelling one mid-flight tears down its HTTP
    connection (runs died of httpx.ReadError). So what is left when reporting stops is awaited."""
    tasks = {
        asyncio.create_task(host.generate_on(r.server, r.messages, host.sampling, 1, r.prompt_id, r.request_id)): key
        for key, r in requests.items()
    }
    pending = set(tasks)
    try:
        while pending and is_open():
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                result = task.result()[0]
                if result.finish_reason == "abort":
                    continue
                for server, prefix in on_result(tasks[task], result):
                    await host.clients[server].abort([prefix])
    except BaseException:
        for task in pending:
            task.cancel()
        raise
    if pending:
        await asyncio.gather(*pending, return_exceptions=True)


# --- the plans ------------------------------------------------------------------------


class PlainGroups:
    """One request with n = G per group. A launch pass draws every group the throttle allows,
    then starts them in the router's order, each on its server (HistoPipe: longest predicted
    first, each to the least predicted load); a sync batch launches whole, an async window
    refills the groups that finished."""

    def __init__(self, host: PlanHost) -> None:
        self.host = host

    def launch(self, prompts: PromptSource) -> None:
        host = self.host
        drawn: dict[str, list[tuple[int, int, Problem]]] = {}  # prompt id -> (index, epoch, problem), in draw order
        prompt_ids: list[str] = []
        while host.may_submit():
            epoch, problem = prompts.draw()
            drawn.setdefault(problem.id, []).append((host.reserve_group(), epoch, problem))
            prompt_ids.append(problem.id)
        for prompt_id, server in assign_batch(host.router, prompt_ids, host.group_size, host.server_loads):
            index, epoch, problem = drawn[prompt_id].pop(0)
            host.start_group(index, self.run_group(problem, epoch, index, server=server))

    async def run_group(self, problem: Problem, epoch: int, index: int, server: int) -> GroupSamples:
        host = self.host
        try:
            results = await host.generate_on(server, host.messages(problem), host.sampling, host.group_size, problem.id)
        except BaseException:
            host.router.observe(problem.id, [])  # releases the group's predicted load
            raise
        host.router.observe(problem.id, [len(r.token_ids) for r in results])
        return await host.score_group(problem, epoch, f"g{index:08d}", results)

    def metrics(self) -> dict[str, float]:
        return {}


class TailWindow:
    """Async RollPacker tail batching (`tail_batching.AsyncTailTracker`): one group at a time, a
    long-tail prompt first when the tracker says so; one request per response; a short group asks
    for `response_overprovision` x G and keeps the first G to finish; a group overtaken by too
    many later ones is aborted and deferred, to run later among long ones."""

    def __init__(self, host: PlanHost, tracker: AsyncTailTracker) -> None:
        self.host = host
        self.tracker = tracker
        self.group_servers: dict[str, int] = {}  # group id -> its server, for aborts by other groups

    def launch(self, prompts: PromptSource) -> None:
        host = self.host
        while host.may_submit():
            epoch, problem = prompts.draw()
            chosen = self.tracker.next_prompt(lambda k: [problem.id][:k])
            assert chosen is not None  # the training stream is endless
            prompt_id, kind = chosen
            if prompt_id != problem.id:
                # A long-tail prompt goes first; the fresh one is next. The group keeps the fresh
                # prompt's epoch in its metadata (the tracker does not remember epochs).
                prompts.push_front((epoch, problem))
                problem = host.problems_by_id[prompt_id]
            index = host.reserve_group()
            host.start_group(index, self.run_group(problem, epoch, index, kind))

    async def run_group(self, problem: Problem, epoch: int, index: int, kind: RoundKind) -> GroupSamples:
        group_id = f"g{index:08d}"
        results = await self.generate(problem, group_id, kind)
        if results is None:
            return []  # deferred to the long-tail queue: it comes back as a long group
        return await self.host.score_group(problem, epoch, group_id, results)

    async def generate(self, problem: Problem, group_id: str, kind: RoundKind) -> list[GenerationResult] | None:
        """The group's first G responses, or None when it was deferred (or came up short)."""
        host, tracker = self.host, self.tracker
        count = tracker.launch(group_id, problem.id, kind)
        server = host.router.pick(problem.id, count, host.server_loads)
        self.group_servers[group_id] = server
        messages = host.messages(problem)
        requests = {i: Request(server, messages, problem.id, f"{group_id}-r{i}") for i in range(count)}
        kept: list[GenerationResult] = []

        def on_result(key: int, result: GenerationResult) -> list[tuple[int, str]]:
            if not tracker.is_open(group_id):
                return []  # closed by an earlier response of this batch, or deferred meanwhile
            keep, to_abort = tracker.on_response(group_id)
            if keep:
                kept.append(result)
            # Servers looked up now, before the first abort awaits: a deferred group may leave meanwhile.
            return [(self.group_servers[other], other) for other in to_abort]

        # Once the group is closed its unfinished requests were aborted on the server (by this
        # group when complete, by the overtaking group when deferred): `fan_out` awaits them.
        try:
            await fan_out(host, requests, on_result, is_open=lambda: tracker.is_open(group_id))
        finally:
            self.group_servers.pop(group_id, None)
        if len(kept) < host.group_size:
            host.router.observe(problem.id, [])
            return None
        host.router.observe(problem.id, [len(r.token_ids) for r in kept])
        return kept

    def metrics(self) -> dict[str, float]:
        return self.tracker.metrics()


class TailRounds:
    """Sync RollPacker tail batching: each sync batch is one round of `TailBatchPlanner`. A short
    round launches 1.25x the prompts with 1.25x responses each (one request per response, so they
    finish one by one), keeps the first prompts to complete and aborts the rest, whose prompts
    wait in the long-tail queue until a full long round of them runs."""

    def __init__(self, host: PlanHost, planner: TailBatchPlanner, batches: SyncBatches) -> None:
        self.host = host
        self.planner = planner
        self.batches = batches
        self.epochs: dict[str, int] = {}  # epoch of each prompt drawn into a round, until trained

    def launch(self, prompts: PromptSource) -> None:
        """Start the next round if the throttle allows; it counts as the whole batch launched."""
        if not self.host.may_submit():
            return
        epochs = self.epochs

        def draw_fresh(count: int) -> list[str]:
            drawn: list[str] = []
            while len(drawn) < count:
                epoch, problem = prompts.draw()
                if problem.id in epochs:  # already queued as long-tail from an earlier epoch
                    continue
                epochs[problem.id] = epoch
                drawn.append(problem.id)
            return drawn

        self.host.start_round(self.run_round(draw_fresh))
        self.batches.launch_batch()

    async def run_round(self, draw_fresh: Callable[[int], list[str]]) -> GroupSamples:
        """A prompt's surplus requests are aborted once it has its group, and every request still
        running once the round is done; the kept groups are scored."""
        host, planner = self.host, self.planner
        round_ = planner.plan_round(draw_fresh)
        tag = f"round{round_.index:06d}"
        results: dict[str, dict[int, GenerationResult]] = {pid: {} for pid in round_.prompt_ids}
        prefixes: dict[str, tuple[int, str]] = {}  # prompt id -> (server, request id prefix)
        requests: dict[tuple[str, int], Request] = {}
        for index, prompt_id in enumerate(round_.prompt_ids):
            messages = host.messages(host.problems_by_id[prompt_id])
            server = host.router.pick(prompt_id, round_.responses_per_prompt, host.server_loads)
            prefixes[prompt_id] = (server, f"{tag}-p{index}")
            for key in range(round_.responses_per_prompt):
                requests[(prompt_id, key)] = Request(server, messages, prompt_id, f"{tag}-p{index}-r{key}")
        aborted: set[str] = set()

        def on_result(request: tuple[str, int], result: GenerationResult) -> list[tuple[int, str]]:
            prompt_id, key = request
            if round_.on_response(prompt_id, key, len(result.token_ids)):
                results[prompt_id][key] = result
            to_abort = [pid for pid in round_.prompts_to_abort() if pid not in aborted]
            aborted.update(to_abort)
            return [prefixes[pid] for pid in to_abort]

        await fan_out(host, requests, on_result)
        outcome = planner.close_round(round_)
        host.sink.log(host.version, planner.metrics())  # one line per round: sched/round, aborted, queue
        samples: GroupSamples = []
        for prompt_id, keys in outcome.kept.items():
            kept = [results[prompt_id][key] for key in keys]
            host.router.observe(prompt_id, [len(r.token_ids) for r in kept])
            group_id = f"g{host.new_group_index():08d}"
            samples += await host.score_group(host.problems_by_id[prompt_id], self.epochs.pop(prompt_id, 0), group_id, kept)
        for prompt_id in outcome.deferred:
            host.router.observe(prompt_id, [])
        return samples

    def metrics(self) -> dict[str, float]:
        return {}  # logged once per round instead (`run_round`)


def make_plan(config: RunConfig, host: PlanHost, throttle: Throttle) -> SubmissionPlan:
    """Plain groups unless `accelerations.tail_batching` is on: then sync rounds or the async window."""
    if not config.accelerations.tail_batching.enabled:
        return PlainGroups(host)
    if config.mode == "sync":
        assert isinstance(throttle, SyncBatches)
        return TailRounds(host, make_tail_planner(config), throttle)
    return TailWindow(host, make_async_tail_tracker(config))
