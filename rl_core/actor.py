"""The rollout actor: keeps prompt groups in flight, scores them, writes the stream.

`python -m rl_core actor ...` (started by `run`; the process entry is `actor_main.py`).

Async mode (PipelineRL): up to `actor.groups_in_flight` groups (one request with
n=`actor.group_size` each) are generating at any time, routed to the least-loaded
server (or HistoPipe). Servers swap weights between decode steps, so a sequence may
span several policy versions. The `max_lag` bound is kept at submission
(`lag_throttle.py`): each group gets a stream-slot deadline when it starts, and a
finished group is written only while every group still pending keeps its deadline, so a
slow (long) group is waited for rather than trained late or dropped as stale.

Sync mode (baseline): generate `sync_steps_per_batch * S` samples with frozen weights,
write them all at once, wait until the trainer consumed them (and broadcast the new
weights), repeat. Same code path, one switch. With `accelerations.tail_batching` on, a
sync batch is one RollPacker round (`TailBatchPlanner`): a short round launches 1.25x
the prompts with 1.25x responses each, keeps the first prompts to complete and aborts
the rest, whose prompts wait in the long-tail queue until a full long round of them runs.

Evaluation runs on the same servers without stopping training: `success/heldout`
(the task's held-out set) at step 0, every `eval.heldout_every_n_steps` and at the
end; the benchmarks of `eval.benchmarks` every `eval.every_n_steps` and at the end.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from rl_core.advantages import group_advantages
from rl_core.config import RunConfig
from rl_core.contracts import GenerationResult, RolloutSample, SamplingParams
from rl_core.lag_throttle import LagThrottle
from rl_core.metrics import MetricsSink
from rl_core.run_dir import TrainerProgress, latest_checkpoint, read_progress
from rl_core.scheduling import assign_batch
from rl_core.stream import StreamWriter
from rl_core.tasks import Problem, TaskData, load_task

METRICS_EVERY_S = 2.0
CONNECTION_RETRIES = 2  # resends of a request whose HTTP connection dropped (see Actor.generate_on)
log = logging.getLogger(__name__)


def connection_dropped(exc: BaseException) -> bool:
    """True for a client error caused by the connection going away (not a refusal by the server)."""
    import httpx

    cause = exc.__cause__
    return isinstance(cause, (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.ConnectError))


@dataclass
class Window:
    """Rollout figures accumulated between two metric lines."""

    rewards: list[float] = field(default_factory=list)
    successes: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    versions_per_sequence: list[int] = field(default_factory=list)
    tokens: int = 0
    groups: int = 0
    dropped_groups: int = 0
    started: float = field(default_factory=time.monotonic)


class Actor:
    def __init__(
        self,
        config: RunConfig,
        run_dir: str | Path,
        clients: list[Any],
        writer: StreamWriter,
        sink: MetricsSink,
        task: TaskData | None = None,
        router: Any = None,
    ) -> None:
        from rl_core.scheduling import make_router

        if not clients:
            raise ValueError("the actor needs at least one inference server")
        self.config = config
        self.run_dir = Path(run_dir)
        self.clients = clients
        self.writer = writer
        self.sink = sink
        self.task = task or load_task(config.task)
        self.router = router or make_router(config)
        # RollPacker tail batching: the async window's tracker, or the sync rounds' planner;
        # both None = plain groups, one request with n each.
        self.tail = None
        self.tail_planner = None
        if config.accelerations.tail_batching.enabled:
            from rl_core.tail_batching import make_async_tail_tracker, make_tail_planner

            if config.mode == "sync":
                self.tail_planner = make_tail_planner(config)
            else:
                self.tail = make_async_tail_tracker(config)
        self.group_servers: dict[str, int] = {}
        self.problems_by_id = {problem.id: problem for problem in self.task.train}
        self.server_loads = [0.0] * len(clients)  # sequences in flight per server (rollouts + evals)
        self.in_flight: set[asyncio.Task] = set()
        self.evals: set[asyncio.Task] = set()
        self.window = Window()
        self.version = 0
        self.consumed = 0
        self.groups_started = 0
        self.samples_total = 0
        # Async mode: which groups may start and which finished ones may be written (max_lag).
        self.lag_throttle: LagThrottle[int, RolloutSample] = LagThrottle(
            config.actor.max_lag, config.trainer.samples_per_step, config.actor.group_size
        )
        self.group_index_of: dict[asyncio.Task, int] = {}  # plain and async-tail groups in flight
        self.launching = 0  # groups reserved by the current launch pass, not yet started
        self.sync_buffer: list[RolloutSample] = []
        self.sync_launched = 0  # samples launched in the current sync batch
        self.next_heldout = 0
        self.evaluated_steps: dict[str, set[int]] = {"heldout": set(), "benchmarks": set()}  # versions evaluated
        self.next_benchmark = config.eval.every_n_steps if config.eval.every_n_steps else None
        self.group_size = config.actor.group_size
        self.samples_per_step = config.trainer.samples_per_step
        self.sampling = SamplingParams(
            temperature=config.sampling.temperature, top_p=config.sampling.top_p,
            max_new_tokens=config.sampling.max_new_tokens,
        )
        self.rng = random.Random(config.seed)
        self.tail_epochs: dict[str, int] = {}  # epoch of each prompt drawn into a sync tail round, until trained
        self.spec_counters: dict[str, float] | None = None  # last reading of the servers' spec_* totals
        self.spec_poller: asyncio.Task | None = None

    # --- generation through the servers -------------------------------------------

    async def generate_on(self, server: int, messages: list[dict[str, str]], sampling: SamplingParams, n: int,
                          prompt_id: str | None, request_id_prefix: str | None = None) -> list[GenerationResult]:
        """One request to `server`. A request whose connection dropped is sent again (twice at most),
        under a new id that keeps `request_id_prefix` as its prefix, so aborts by prefix still reach it:
        a pooled keep-alive connection that the server closes just as a request goes out fails with
        httpx.ReadError (the server logs ClientDisconnect and never starts it). One request per
        response (tail batching) keeps many such connections idling, and runs died of it."""
        self.server_loads[server] += n
        try:
            for attempt in range(CONNECTION_RETRIES + 1):
                prefix = request_id_prefix if attempt == 0 or request_id_prefix is None else f"{request_id_prefix}-retry{attempt}"
                try:
                    return await self.clients[server].generate(messages, sampling, n=n, prompt_id=prompt_id,
                                                                request_id_prefix=prefix)
                except Exception as exc:
                    if attempt == CONNECTION_RETRIES or not connection_dropped(exc):
                        raise
                    log.warning("request %s to server %d lost its connection (%r); sending it again",
                                prefix, server, exc.__cause__)
            raise AssertionError("unreachable")
        finally:
            self.server_loads[server] -= n

    async def generate_least_loaded(self, messages: list[dict[str, str]], sampling: SamplingParams, n: int) -> list[GenerationResult]:
        """Evaluation traffic: least-loaded, and kept out of the HistoPipe/HistoSpec history."""
        server = min(range(len(self.clients)), key=lambda i: (self.server_loads[i], i))
        return await self.generate_on(server, messages, sampling, n, prompt_id=None)

    # --- one group ------------------------------------------------------------------

    async def run_group(
        self, problem: Problem, epoch: int, group_index: int, kind: str = "plain", server: int | None = None
    ) -> list[RolloutSample]:
        """One group; `server` is where `launch_groups` placed it (a tail-batching group picks its own)."""
        group_id = f"g{group_index:08d}"
        if self.tail is not None:
            results = await self.generate_tail_group(problem, group_id, kind)
            if results is None:
                return []  # deferred to the long-tail queue: it comes back as a long group
        else:
            assert server is not None
            try:
                results = await self.generate_on(server, self.task.messages(problem), self.sampling, self.group_size, problem.id)
            except BaseException:
                self.router.observe(problem.id, [])
                raise
            self.router.observe(problem.id, [len(r.token_ids) for r in results])
        return await self.score_group(problem, epoch, group_id, results)

    async def generate_tail_group(self, problem: Problem, group_id: str, kind: str) -> list[GenerationResult] | None:
        """RollPacker tail batching: one request per response; a short group asks for
        `response_overprovision` x G and keeps the first G to finish; a group overtaken by
        too many later ones is aborted and deferred (None) to run later among long ones."""
        assert self.tail is not None
        count = self.tail.launch(group_id, problem.id, kind)
        server = self.router.pick(problem.id, count, self.server_loads)
        self.group_servers[group_id] = server
        messages = self.task.messages(problem)
        pending = {
            asyncio.create_task(self.generate_on(server, messages, self.sampling, 1, problem.id, f"{group_id}-r{i}"))
            for i in range(count)
        }
        kept: list[GenerationResult] = []
        try:
            while pending and self.tail.is_open(group_id):
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    result = task.result()[0]
                    if result.finish_reason == "abort" or not self.tail.is_open(group_id):
                        continue
                    keep, to_abort = self.tail.on_response(group_id)
                    if keep:
                        kept.append(result)
                    # Servers looked up before the first await: a deferred group may leave meanwhile.
                    targets = [(self.group_servers[other], other) for other in to_abort]
                    for server_index, other in targets:
                        await self.clients[server_index].abort([other])
        except BaseException:
            for task in pending:
                task.cancel()
            raise
        finally:
            self.group_servers.pop(group_id, None)
        # The group is closed, so its unfinished requests were aborted on the server (by this
        # group when complete, by the overtaking group when deferred): they end with partial
        # results within a step. Awaited rather than cancelled: cancelling a request mid-flight
        # tears down its HTTP connection, and runs with it on died of httpx.ReadError.
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if len(kept) < self.group_size:
            self.router.observe(problem.id, [])
            return None
        self.router.observe(problem.id, [len(r.token_ids) for r in kept])
        return kept

    async def run_tail_round(self, draw_fresh: Any, epochs: dict[str, int]) -> list[RolloutSample]:
        """One sync batch as a RollPacker round: every response is its own request (so they
        finish one by one); a prompt's surplus requests are aborted once it has its group, and
        every request still running when the round is done; the kept groups are scored."""
        from rl_core.tail_batching import TailRound

        assert self.tail_planner is not None
        round_: TailRound = self.tail_planner.plan_round(draw_fresh)
        tag = f"round{round_.index:06d}"
        results: dict[str, dict[int, GenerationResult]] = {pid: {} for pid in round_.prompt_ids}
        prefixes: dict[str, tuple[int, str]] = {}  # prompt id -> (server, request id prefix)
        tasks: dict[asyncio.Task, tuple[str, int]] = {}
        for index, prompt_id in enumerate(round_.prompt_ids):
            problem = self.problems_by_id[prompt_id]
            server = self.router.pick(prompt_id, round_.responses_per_prompt, self.server_loads)
            prefixes[prompt_id] = (server, f"{tag}-p{index}")
            for key in range(round_.responses_per_prompt):
                task = asyncio.create_task(self.generate_on(
                    server, self.task.messages(problem), self.sampling, 1, prompt_id, f"{tag}-p{index}-r{key}"))
                tasks[task] = (prompt_id, key)
        aborted: set[str] = set()
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                prompt_id, key = tasks[task]
                result = task.result()[0]
                if result.finish_reason == "abort":
                    continue  # aborted below: it never counts as finished
                if round_.on_response(prompt_id, key, len(result.token_ids)):
                    results[prompt_id][key] = result
            # Aborted on the server rather than cancelled here: the request then ends with
            # its partial result, and no connection is torn down mid-response.
            to_abort = [pid for pid in round_.prompts_to_abort() if pid not in aborted]
            for prompt_id in to_abort:
                aborted.add(prompt_id)
                server, prefix = prefixes[prompt_id]
                await self.clients[server].abort([prefix])
        outcome = self.tail_planner.close_round(round_)
        self.sink.log(self.version, self.tail_planner.metrics())  # one line per round: sched/round, aborted, queue
        samples: list[RolloutSample] = []
        for prompt_id, keys in outcome.kept.items():
            kept = [results[prompt_id][key] for key in keys]
            self.router.observe(prompt_id, [len(r.token_ids) for r in kept])
            group_id = f"g{self.groups_started:08d}"
            self.groups_started += 1
            samples += await self.score_group(self.problems_by_id[prompt_id], epochs.pop(prompt_id, 0), group_id, kept)
        for prompt_id in outcome.deferred:
            self.router.observe(prompt_id, [])
        return samples

    async def score_group(self, problem: Problem, epoch: int, group_id: str, results: list[GenerationResult]) -> list[RolloutSample]:
        from rl_core.rewards import score_many

        scores = await asyncio.to_thread(
            score_many, [(r.text, problem.answer) for r in results], self.config.task.reward_timeout_s
        )
        rewards = [score.reward for score in scores]
        advantages = group_advantages(rewards, normalize_std=self.config.actor.advantage == "group_mean_std")
        samples = []
        for i, (result, score, advantage) in enumerate(zip(results, scores, advantages)):
            self.window.rewards.append(score.reward)
            self.window.successes.append(float(score.success))
            self.window.lengths.append(len(result.token_ids))
            self.window.versions_per_sequence.append(result.num_versions)
            self.window.tokens += len(result.token_ids)
            if not result.token_ids or result.finish_reason == "abort":
                continue  # nothing to learn from (an aborted or empty response)
            samples.append(RolloutSample(
                sample_id=f"{group_id}-{i}", group_id=group_id, prompt_id=problem.id,
                prompt_token_ids=list(result.prompt_token_ids), completion_token_ids=list(result.token_ids),
                behaviour_logprobs=list(result.logprobs), token_versions=list(result.token_versions),
                reward=score.reward, success=score.success, advantage=advantage, finish_reason=result.finish_reason,
                metadata={"epoch": epoch, "extracted": score.extracted},
            ))
        self.window.groups += 1
        if self.config.actor.drop_zero_advantage_groups and all(a == 0.0 for a in advantages):
            self.window.dropped_groups += 1
            return []
        return samples

    # --- the max_lag / sync throttle ------------------------------------------------

    def may_submit(self) -> bool:
        if len(self.in_flight) + self.launching >= self.config.actor.groups_in_flight:
            return False
        if self.config.mode == "sync":
            batch = self.config.sync_steps_per_batch * self.samples_per_step
            if self.sync_launched == 0:
                # A new batch starts only once the trainer has taken every full step of the
                # last one (it publishes after broadcasting, so the weights are updated).
                if self.samples_total - self.consumed >= self.samples_per_step or self.sync_buffer:
                    return False
            return self.sync_launched < batch
        return self.lag_throttle.may_submit(self.samples_total, self.consumed)

    def reserve_group(self) -> int:
        """Count a group as launched (throttles) before its task exists; returns its index."""
        index = self.groups_started
        self.groups_started += 1
        self.launching += 1
        if self.config.mode == "sync":
            self.sync_launched += self.group_size
        else:
            self.lag_throttle.on_submitted(index, self.consumed)
        return index

    def start_group(self, index: int, coroutine: Any) -> None:
        task = asyncio.create_task(coroutine)
        self.launching -= 1
        self.in_flight.add(task)
        self.group_index_of[task] = index

    def on_group_done(self, task: asyncio.Task, samples: list[RolloutSample]) -> None:
        self.in_flight.discard(task)
        index = self.group_index_of.pop(task, None)
        if self.config.mode == "sync":
            if not samples and self.tail_planner is None:
                # A dropped (zero-advantage) group does not fill the batch: another one is
                # launched with the same frozen weights. Otherwise the batch comes up short, its
                # remainder is trained with the next batch, after an update (lag 1 in sync mode).
                self.sync_launched -= self.group_size
            self.sync_buffer.extend(samples)
            batch = self.config.sync_steps_per_batch * self.samples_per_step
            if self.sync_launched >= batch and not self.in_flight:
                self.write(self.sync_buffer)
                self.sync_buffer = []
                self.sync_launched = 0
            return
        self.lag_throttle.on_finished(index, samples)
        for group in self.lag_throttle.take_writable(self.samples_total):
            self.write(group)

    def write(self, samples: list[RolloutSample]) -> None:
        self.writer.append(samples)
        self.samples_total = self.writer.count()

    # --- evaluation -----------------------------------------------------------------

    async def heldout_eval(self, step: int) -> None:
        from rl_core.evaluation import PromptTemplate, evaluate

        e = self.config.eval
        temperature = self.config.sampling.temperature if e.heldout_temperature is None else e.heldout_temperature
        report = await evaluate(
            "heldout", self.generate_least_loaded, k=e.heldout_k, problems=self.task.heldout,
            sampling=SamplingParams(temperature=temperature, top_p=self.config.sampling.top_p,
                                    max_new_tokens=self.config.sampling.max_new_tokens),
            template=PromptTemplate(system=self.config.task.system_prompt),
            # Every problem at once: the server decodes them with the rollouts in one batch,
            # which is cheaper per token than several smaller waves (bench/RESULTS.md).
            reward_timeout_s=self.config.task.reward_timeout_s, concurrency=len(self.task.heldout), seed=self.config.seed,
        )
        versions = report.policy_versions
        self.sink.log(step, {
            "success/heldout": report.mean_at_k, "success/heldout_pass_at_k": report.pass_at_k,
            "success/heldout_version_min": float(min(versions)) if versions else float(step),
            "success/heldout_version_max": float(max(versions)) if versions else float(step),
        })

    async def benchmark_eval(self, step: int) -> None:
        from rl_core.evaluation import run_benchmarks

        await run_benchmarks(
            self.config.eval, self.generate_least_loaded, step=step, run_dir=self.run_dir, sampling=self.sampling,
            seed=self.config.seed, reward_timeout_s=self.config.task.reward_timeout_s, metrics_sink=self.sink,
        )

    def start_periodic_evals(self) -> None:
        e = self.config.eval
        if self.version >= self.next_heldout:
            self.evals.add(asyncio.create_task(self.heldout_eval(self.version)))
            self.evaluated_steps["heldout"].add(self.version)
            self.next_heldout = self.version + e.heldout_every_n_steps if e.heldout_every_n_steps else 10**12
        if e.benchmarks and self.next_benchmark is not None and self.version >= self.next_benchmark:
            self.evals.add(asyncio.create_task(self.benchmark_eval(self.version)))
            self.evaluated_steps["benchmarks"].add(self.version)
            self.next_benchmark = self.version + e.every_n_steps

    # --- metrics --------------------------------------------------------------------

    def log_window(self, force: bool = False) -> None:
        w = self.window
        now = time.monotonic()
        if not force and now - w.started < METRICS_EVERY_S:
            return
        elapsed = max(1e-9, now - w.started)
        metrics: dict[str, float] = {
            "rollout/tokens_per_s": w.tokens / elapsed,
            "rollout/in_flight": float(len(self.in_flight)),
            "rollout/samples_written": float(self.samples_total),
            "rollout/unconsumed": float(self.samples_total - self.consumed),
        }
        if w.rewards:
            metrics.update({
                "reward/mean": sum(w.rewards) / len(w.rewards),
                "success/mean": sum(w.successes) / len(w.successes),
                "rollout/response_len/mean": sum(w.lengths) / len(w.lengths),
                "rollout/versions_per_sequence/max": float(max(w.versions_per_sequence)),
                "rollout/versions_per_sequence/mean": sum(w.versions_per_sequence) / len(w.versions_per_sequence),
                "rollout/groups": float(w.groups),
            })
        if w.dropped_groups:
            metrics["rollout/dropped_zero_advantage_groups"] = float(w.dropped_groups)
        metrics.update(self.router.metrics())
        if self.tail is not None:
            metrics.update(self.tail.metrics())
        self.sink.log(self.version, metrics)
        self.window = Window()

    async def log_spec_metrics(self) -> None:
        """HistoSpec runs inside the servers: sum their cumulative spec_* counters and log
        the deltas since the last reading as spec/* metrics."""
        from rl_core.spec_metrics import spec_metrics_from_counters

        totals: dict[str, float] = {}
        for client in self.clients:
            for key, value in (await client.health()).get("counters", {}).items():
                totals[key] = totals.get(key, 0.0) + float(value)
        metrics = spec_metrics_from_counters(totals, self.spec_counters)
        self.spec_counters = totals
        if metrics:
            self.sink.log(self.version, metrics)

    async def log_spec_metrics_forever(self) -> None:
        while True:
            await asyncio.sleep(METRICS_EVERY_S)
            await self.log_spec_metrics()

    # --- the loop -------------------------------------------------------------------

    def refresh_progress(self) -> TrainerProgress | None:
        progress = read_progress(self.run_dir)
        if progress is not None:
            self.version = progress.version
            self.consumed = progress.consumed
        return progress

    async def wait_for_trainer(self, poll_s: float = 0.1) -> None:
        """A resumed run generates nothing before the trainer has pushed its checkpoint's
        version to the servers (it publishes progress after that). A fresh run starts at
        once: the servers already hold version 0, and the trainer's start-up (seconds of
        imports and model loading) overlaps the first rollouts and the step-0 evaluation."""
        if latest_checkpoint(self.run_dir) is None:
            self.refresh_progress()
            return
        while self.refresh_progress() is None:
            await asyncio.sleep(poll_s)

    async def run(self) -> None:
        await self.wait_for_trainer()
        self.samples_total = self.writer.count()
        # A restarted actor continues the prompt order where the stream ends.
        skip = self.samples_total // self.group_size
        problems = self.task.train_stream()
        for _ in range(skip):
            next(problems)
        self.groups_started = skip
        if self.config.accelerations.histospec.enabled:
            self.spec_poller = asyncio.create_task(self.log_spec_metrics_forever())
            self.evals.add(self.spec_poller)  # a failing poll fails the actor like a failing eval
        done = False
        while not done:
            progress = self.refresh_progress()
            done = bool(progress and progress.done)
            if done:
                break
            self.start_periodic_evals()
            if self.tail_planner is not None and self.may_submit():
                problems = self.launch_tail_round(problems)
            if self.tail is not None:
                problems = self.launch_tail_groups(problems)
            elif self.tail_planner is None:
                self.launch_groups(problems)
            waiting = self.in_flight | self.evals
            if waiting:
                finished, _ = await asyncio.wait(waiting, timeout=0.1, return_when=asyncio.FIRST_COMPLETED)
            else:
                finished = set()
                await asyncio.sleep(0.05)
            for task in finished:
                if task in self.evals:
                    self.evals.discard(task)
                    task.result()  # an eval error fails the actor with its message
                    continue
                self.on_group_done(task, task.result())
            self.log_window()
        await self.finish()

    def launch_groups(self, problems: Iterator[tuple[int, Problem]]) -> None:
        """Start every plain group the throttle allows now, in the router's launch order
        (HistoPipe: longest predicted first, each to the least predicted load); a sync batch
        launches whole, an async window refills the groups that finished."""
        drawn: dict[str, list[tuple[int, int, Problem]]] = {}  # prompt id -> (index, epoch, problem), in draw order
        prompt_ids: list[str] = []
        while self.may_submit():
            epoch, problem = next(problems)
            drawn.setdefault(problem.id, []).append((self.reserve_group(), epoch, problem))
            prompt_ids.append(problem.id)
        for prompt_id, server in assign_batch(self.router, prompt_ids, self.group_size, self.server_loads):
            index, epoch, problem = drawn[prompt_id].pop(0)
            self.start_group(index, self.run_group(problem, epoch, index, server=server))

    def launch_tail_groups(self, problems: Iterator[tuple[int, Problem]]) -> Iterator[tuple[int, Problem]]:
        """Async tail batching: one group at a time, a long-tail prompt first when the tracker
        says so (its server is picked per response request). Returns the prompt stream."""
        assert self.tail is not None
        while self.may_submit():
            epoch, problem = next(problems)
            fresh = [problem]
            chosen = self.tail.next_prompt(lambda k: [p.id for p in fresh[:k]])
            assert chosen is not None  # the training stream is endless
            kind = chosen[1]
            if chosen[0] != problem.id:  # a long-tail prompt goes first; keep the fresh one
                problems = itertools.chain([(epoch, problem)], problems)
                problem = self.problems_by_id[chosen[0]]
            index = self.reserve_group()
            self.start_group(index, self.run_group(problem, epoch, index, kind))
        return problems

    def launch_tail_round(self, problems: Iterator[tuple[int, Problem]]) -> Iterator[tuple[int, Problem]]:
        """Start the next sync batch as one tail-batching round (`run_tail_round`); it counts as
        the whole batch launched, so the sync throttle waits for it. Returns the prompt stream."""
        epochs = self.tail_epochs

        def draw_fresh(count: int) -> list[str]:
            drawn = []
            while len(drawn) < count:
                epoch, problem = next(problems)
                if problem.id in epochs:  # already queued as long-tail from an earlier epoch
                    continue
                epochs[problem.id] = epoch
                drawn.append(problem.id)
            return drawn

        task = asyncio.create_task(self.run_tail_round(draw_fresh, epochs))
        self.sync_launched = self.config.sync_steps_per_batch * self.samples_per_step
        self.in_flight.add(task)
        return problems

    async def finish(self) -> None:
        """Training is over: drop the rollouts still in flight, then the final evaluations."""
        if self.spec_poller is not None:
            self.spec_poller.cancel()
            await asyncio.gather(self.spec_poller, return_exceptions=True)
            self.evals.discard(self.spec_poller)
            await self.log_spec_metrics()
        for task in self.in_flight:
            task.cancel()
        await asyncio.gather(*self.in_flight, return_exceptions=True)
        self.in_flight.clear()
        self.log_window(force=True)
        if self.evals:
            await asyncio.gather(*self.evals)
        # The final version may already have had its periodic evaluation (max_steps a multiple of
        # the interval): evaluating the same weights twice would only log a duplicate line.
        final = []
        if self.version not in self.evaluated_steps["heldout"]:
            final.append(self.heldout_eval(self.version))
        if self.config.eval.benchmarks and self.version not in self.evaluated_steps["benchmarks"]:
            final.append(self.benchmark_eval(self.version))
        await asyncio.gather(*final)
