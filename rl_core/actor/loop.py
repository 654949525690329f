"""The rollout actor: keeps prompt groups in flight, scores them, writes the stream.

`python -m rl_core actor ...` (started by `run`; the process entry is `actor/main.py`).

The loop (`Actor.run`) reads in the order it runs: refresh the trainer's progress, start the
evaluations that are due, let the submission plan launch what the throttle allows, collect the
groups that finished (each scored as it finishes), write what the throttle releases. What the
modes differ in lives in `actor/submission.py`:

Async mode (PipelineRL): up to `actor.groups_in_flight` groups (one request with
n=`actor.group_size` each) are generating at any time, routed to the least-loaded
server (or HistoPipe). Servers swap weights between decode steps, so a sequence may
span several policy versions. The `max_lag` bound is kept at submission
(`actor/lag_throttle.py`): each group gets a stream-slot deadline when it starts, and a
finished group is written only while every group still pending keeps its deadline, so a
slow (long) group is waited for rather than trained late or dropped as stale.

Sync mode (baseline): generate `sync_steps_per_batch * S` samples with frozen weights,
write them all at once, wait until the trainer consumed them (and broadcast the new
weights), repeat. Same loop, another throttle. With `accelerations.tail_batching` on, a
sync batch is one RollPacker round and the async window defers overtaken groups
(`submission.TailRounds`, `submission.TailWindow`).

Evaluation runs on the same servers without stopping training: `success/heldout`
(the task's held-out set) at step 0, every `eval.heldout_every_n_steps` and at the
end; the benchmarks of `eval.benchmarks` every `eval.every_n_steps` and at the end
(`submission.EvalSchedule`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Coroutine

from rl_core.envs.advantages import divides_by_group_std, group_advantages
from rl_core.config.run_config import RunConfig
from rl_core.common.contracts import (
    DISCARD_ABORTED, DISCARD_EMPTY, DISCARD_ZERO_ADVANTAGE, GenerationResult, RolloutSample, SamplingParams,
)
from rl_core.common import metric_names as mn
from rl_core.rundir.metrics import MetricsSink
from rl_core.rundir.layout import TrainerProgress, latest_checkpoint, read_progress
from rl_core.rundir.stream import StreamWriter
from rl_core.rundir.timeline import ActorTimeline, TimelineWriter
from rl_core.actor.discarded import DiscardedSamples
from rl_core.actor.submission import EvalKind, EvalSchedule, PromptSource, ZeroAdvantageGroups, make_plan, make_throttle
from rl_core.envs.problems import Problem, TaskData
from rl_core.envs.environments import Environment, load_environment
from rl_core.envs.trajectories import HFTokenCodec, ToolClock, ToolSpans, Trajectory, TrajectoryRunner

METRICS_EVERY_S = 2.0
CONNECTION_RETRIES = 2  # resends of a request whose HTTP connection dropped (see Actor.generate_on)
log = logging.getLogger(__name__)


def unusable_reason(token_ids: list[int], finish_reason: str) -> str | None:
    """Why a response cannot be trained (its discard reason), or None when it can."""
    if finish_reason == "abort":
        return DISCARD_ABORTED
    return None if token_ids else DISCARD_EMPTY


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
    # Groups whose advantages are all 0 (every answer equally right or wrong): nothing to learn
    # from them. Their share is the platform's `no_learning_signal` alert's early sign.
    zero_advantage_groups: int = 0
    # Multi-turn envs (`env.name` math_python_tool or a multi-turn custom one): per trajectory.
    trajectories: int = 0
    tool_calls: int = 0
    samples_with_tool: int = 0
    tool_errors: int = 0  # calls that ended "error" or "refused": the code failed or was not allowed
    tool_timeouts: int = 0
    tool_seconds: list[float] = field(default_factory=list)
    turns: int = 0
    success_with_tool: list[float] = field(default_factory=list)
    success_without_tool: list[float] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    def add_trajectory(self, trajectory: Trajectory, success: bool) -> None:
        self.trajectories += 1
        self.turns += len(trajectory.turns)
        self.tool_calls += trajectory.tool_calls
        self.samples_with_tool += trajectory.tool_calls > 0
        self.tool_errors += sum(status in ("error", "refused") for status in trajectory.tool_statuses)
        self.tool_timeouts += sum(status == "timeout" for status in trajectory.tool_statuses)
        self.tool_seconds += trajectory.tool_seconds
        (self.success_with_tool if trajectory.tool_calls else self.success_without_tool).append(float(success))

    def env_metrics(self, tools: ToolSpans, elapsed_s: float) -> dict[str, float]:
        """The `tool/*` and `env/*` figures of the window (only what it has samples for)."""
        metrics = {mn.TOOL_WAIT_SHARE: min(1.0, tools.waiting_s / elapsed_s), mn.TOOL_BUSY_SHARE: min(1.0, tools.busy_s / elapsed_s)}
        if self.trajectories:
            metrics.update({
                mn.TOOL_CALLS_PER_SAMPLE: self.tool_calls / self.trajectories,
                mn.TOOL_CALL_SHARE: self.samples_with_tool / self.trajectories,
                mn.ENV_TURNS_PER_SAMPLE: self.turns / self.trajectories,
            })
        if self.tool_calls:
            metrics.update({
                mn.TOOL_ERROR_SHARE: self.tool_errors / self.tool_calls,
                mn.TOOL_TIMEOUT_SHARE: self.tool_timeouts / self.tool_calls,
                mn.TOOL_SECONDS_MEAN: sum(self.tool_seconds) / len(self.tool_seconds),
            })
        if self.success_with_tool:
            metrics[mn.SUCCESS_WITH_TOOL] = sum(self.success_with_tool) / len(self.success_with_tool)
        if self.success_without_tool:
            metrics[mn.SUCCESS_WITHOUT_TOOL] = sum(self.success_without_tool) / len(self.success_without_tool)
        return metrics


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
        env: Environment | None = None,
    ) -> None:
        from rl_core.actor.scheduling import make_router

        if not clients:
            raise ValueError("the actor needs at least one inference server")
        self.config = config
        self.run_dir = Path(run_dir)
        self.clients = clients
        self.writer = writer
        self.sink = sink
        # The environment: what a sample is (one response, or a trajectory with tool calls) and its
        # reward. A multi-turn one needs the policy's tokenizer (tool output becomes tokens).
        codec = HFTokenCodec.from_pretrained(config.model.path) if config.env.name != "math" else None
        self.env = env or load_environment(config, chat_template=codec.chat_template if codec else None)
        self.task = task or self.env.task
        self.runner = TrajectoryRunner(self.env, codec) if self.env.multi_turn and codec is not None else None
        self.prefix_counter: float | None = None  # last reading of the servers' prompt_tokens_shared
        self.router = router or make_router(config)
        self.problems_by_id = {problem.id: problem for problem in self.task.train}
        self.group_size = config.actor.group_size
        self.samples_per_step = config.trainer.samples_per_step
        self.sampling = SamplingParams(
            temperature=config.sampling.temperature, top_p=config.sampling.top_p,
            max_new_tokens=config.sampling.max_new_tokens,
            stop=self.env.stop_texts(0) if self.runner is not None else [],  # a first turn stops where its call ends
        )
        self.server_loads = [0.0] * len(clients)  # sequences in flight per server (rollouts + evals)
        # Where the trainer and the stream are (the throttle's inputs).
        self.version = 0
        self.consumed = 0
        self.samples_total = 0
        # What runs: groups (or sync tail rounds) and evaluations.
        self.in_flight: set[asyncio.Task] = set()
        self.evals: set[asyncio.Task] = set()
        self.groups_started = 0
        self.group_index_of: dict[asyncio.Task, int] = {}  # groups in flight (a tail round has none)
        self.launching = 0  # groups reserved by the current launch pass, not yet started
        # The mode: which groups may start and be written (max_lag or sync batches), and how
        # prompts become groups (plain, async tail window, sync tail rounds).
        self.throttle = make_throttle(config)
        self.plan = make_plan(config, self, self.throttle)
        self.eval_schedule = EvalSchedule(config.eval)
        self.zero_advantage = ZeroAdvantageGroups.from_config(config)  # dropped, or drawn again (dapo)
        self.window = Window()
        self.spec_counters: dict[str, float] | None = None  # last reading of the servers' spec_* totals
        self.spec_poller: asyncio.Task | None = None
        # The run page's Timeline: every group from launch to finish, and why one wrote nothing.
        self.timeline = ActorTimeline(TimelineWriter(self.run_dir, "actor", "actor"),
                                      deferrable=config.accelerations.tail_batching.enabled and config.mode == "async")
        # The rollout viewer's discarded samples: what the actor scored but does not write to the stream.
        self.discarded = DiscardedSamples.from_config(config, self.run_dir)

    # --- generation through the servers -------------------------------------------

    async def generate_on(self, server: int, messages: list[dict[str, str]], sampling: SamplingParams, n: int,
                          prompt_id: str | None, request_id_prefix: str | None = None,
                          prompt_token_ids: list[int] | None = None) -> list[GenerationResult]:
        """One request to `server`. A request whose connection dropped is sent again (twice at most),
        under a new id that keeps `request_id_prefix` as its prefix, so aborts by prefix still reach it:
        a pooled keep-alive connection that the server closes just as a request goes out fails with
        httpx.ReadError (the server logs ClientDisconnect and never starts it). One request per
        response (tail batching) keeps many such connections idling, and runs died of it."""
        self.server_loads[server] += n
        clock = self.runner.clock if self.runner is not None else None  # a tool's wait is a call with none in flight
        if clock is not None:
            clock.generation_started()
        try:
            for attempt in range(CONNECTION_RETRIES + 1):
                prefix = request_id_prefix if attempt == 0 or request_id_prefix is None else f"{request_id_prefix}-retry{attempt}"
                # A token prompt (a trajectory's next turn) only where there is one: clients of older
                # shape (tests' stand-ins) take messages only.
                tokens = {} if prompt_token_ids is None else {"prompt_token_ids": prompt_token_ids}
                try:
                    return await self.clients[server].generate(messages, sampling, n=n, prompt_id=prompt_id,
                                                                request_id_prefix=prefix, **tokens)
                except Exception as exc:
                    if attempt == CONNECTION_RETRIES or not connection_dropped(exc):
                        raise
                    log.warning("request %s to server %d lost its connection (%r); sending it again",
                                prefix, server, exc.__cause__)
            raise AssertionError("unreachable")
        finally:
            self.server_loads[server] -= n
            if clock is not None:
                clock.generation_finished()

    def least_loaded(self) -> int:
        return min(range(len(self.clients)), key=lambda i: (self.server_loads[i], i))

    async def generate_least_loaded(self, messages: list[dict[str, str]], sampling: SamplingParams, n: int) -> list[GenerationResult]:
        """Evaluation traffic: least-loaded, and kept out of the HistoPipe/HistoSpec history."""
        return await self.generate_on(self.least_loaded(), messages, sampling, n, prompt_id=None)

    async def continue_turn(self, prompt_token_ids: list[int], sampling: SamplingParams) -> GenerationResult:
        """A trajectory's next model turn (a token prompt): least-loaded, out of the HistoSpec
        history (a continuation is not another attempt at the problem's prompt)."""
        (result,) = await self.generate_on(self.least_loaded(), [], sampling, 1, prompt_id=None,
                                           prompt_token_ids=prompt_token_ids)
        return result

    def messages(self, problem: Problem) -> list[dict[str, str]]:
        """A problem's first messages, as the environment words them."""
        return self.env.first_messages(problem)

    # --- scoring ------------------------------------------------------------------

    async def score_group(self, problem: Problem, epoch: int, group_id: str, results: list[GenerationResult]) -> list[RolloutSample]:
        """Score a group's responses; in a multi-turn env each first response is continued into its
        trajectory first (tool calls, further turns), all of the group's at once."""
        if self.runner is not None:
            trajectories = list(await asyncio.gather(
                *(self.runner.complete(r, self.continue_turn, self.sampling) for r in results)))
            return await self.score_trajectories(problem, epoch, group_id, trajectories)
        scores = await asyncio.to_thread(self.env.score, problem, [r.text for r in results])
        rewards = [score.reward for score in scores]
        advantages = group_advantages(
            rewards, normalize_std=divides_by_group_std(self.config.actor.advantage, self.config.trainer.loss))
        samples: list[RolloutSample] = []
        skipped: list[tuple[RolloutSample, str]] = []  # not trainable, with why
        for i, (result, score, advantage) in enumerate(zip(results, scores, advantages)):
            self.window.rewards.append(score.reward)
            self.window.successes.append(float(score.success))
            self.window.lengths.append(len(result.token_ids))
            self.window.versions_per_sequence.append(result.num_versions)
            self.window.tokens += len(result.token_ids)
            # Nothing to learn from an aborted or empty response: not trained, shown as discarded.
            unusable = unusable_reason(result.token_ids, result.finish_reason)
            sample = RolloutSample(
                sample_id=f"{group_id}-{i}", group_id=group_id, prompt_id=problem.id,
                prompt_token_ids=list(result.prompt_token_ids), completion_token_ids=list(result.token_ids),
                behaviour_logprobs=list(result.logprobs), token_versions=list(result.token_versions),
                reward=score.reward, success=score.success, advantage=advantage, finish_reason=result.finish_reason,
                metadata={"epoch": epoch, "extracted": score.extracted,
                          **({"env": self.env.name} if self.config.env.name != "math" else {})},
            )
            if unusable:
                skipped.append((sample, unusable))
            else:
                samples.append(sample)
        return self.close_group(problem, epoch, group_id, advantages, samples, skipped)

    async def score_trajectories(self, problem: Problem, epoch: int, group_id: str,
                                 trajectories: list[Trajectory]) -> list[RolloutSample]:
        """A multi-turn group: each trajectory one sample; tool tokens masked out (mask 0, logprob
        0.0, version -1), the reward from what the model wrote."""
        scores = await asyncio.to_thread(self.env.score, problem, [t.model_text for t in trajectories])
        advantages = group_advantages(
            [score.reward for score in scores],
            normalize_std=divides_by_group_std(self.config.actor.advantage, self.config.trainer.loss))
        samples: list[RolloutSample] = []
        skipped: list[tuple[RolloutSample, str]] = []  # not trainable, with why
        for i, (trajectory, score, advantage) in enumerate(zip(trajectories, scores, advantages)):
            w = self.window
            w.rewards.append(score.reward)
            w.successes.append(float(score.success))
            w.lengths.append(len(trajectory.token_ids))
            w.versions_per_sequence.append(trajectory.num_versions)
            w.tokens += sum(trajectory.mask)  # decoded tokens: a tool's output was not generated
            w.add_trajectory(trajectory, score.success)
            unusable = unusable_reason(trajectory.token_ids, trajectory.finish_reason)
            sample = RolloutSample(
                sample_id=f"{group_id}-{i}", group_id=group_id, prompt_id=problem.id,
                prompt_token_ids=list(trajectory.prompt_token_ids), completion_token_ids=list(trajectory.token_ids),
                behaviour_logprobs=list(trajectory.logprobs), token_versions=list(trajectory.token_versions),
                reward=score.reward, success=score.success, advantage=advantage, finish_reason=trajectory.finish_reason,
                metadata={"epoch": epoch, "extracted": score.extracted, **trajectory.metadata(self.env.name)},
                completion_mask=list(trajectory.mask),
            )
            if unusable:
                skipped.append((sample, unusable))
            else:
                samples.append(sample)
        return self.close_group(problem, epoch, group_id, advantages, samples, skipped)

    def close_group(self, problem: Problem, epoch: int, group_id: str, advantages: list[float],
                    samples: list[RolloutSample], skipped: list[tuple[RolloutSample, str]] | None = None) -> list[RolloutSample]:
        """Count a scored group; [] when it is dropped (all advantages equal, and the run drops those).
        What is not written (the dropped group, the `skipped` responses with their reason) is recorded
        as discarded for the rollout viewer."""
        skipped = list(skipped or [])
        self.window.groups += 1
        self.window.zero_advantage_groups += all(a == 0.0 for a in advantages)
        if self.zero_advantage.on_group(epoch, problem, informative=any(a != 0.0 for a in advantages)):
            self.window.dropped_groups += 1
            self.timeline.dropped_zero_advantage(group_id)
            self.discarded.record([(sample, DISCARD_ZERO_ADVANTAGE) for sample in samples] + skipped, self.samples_total)
            return []
        self.discarded.record(skipped, self.samples_total)
        return samples

    # --- submission bookkeeping (what the plans call) ------------------------------

    def may_submit(self) -> bool:
        """Room in the window of `actor.groups_in_flight`, and the throttle agrees."""
        if len(self.in_flight) + self.launching >= self.config.actor.groups_in_flight:
            return False
        return self.throttle.may_submit(self.samples_total, self.consumed)

    def new_group_index(self) -> int:
        """The next group's index (its id is g<index>; a restarted actor continues the count)."""
        index = self.groups_started
        self.groups_started += 1
        return index

    def reserve_group(self) -> int:
        """Count a group as launched (throttles) before its task exists; returns its index."""
        index = self.new_group_index()
        self.launching += 1
        self.throttle.on_submitted(index, self.consumed)
        self.timeline.launch(index)
        return index

    def start_group(self, index: int, coroutine: Coroutine[Any, Any, list[RolloutSample]]) -> None:
        task = asyncio.create_task(coroutine)
        self.launching -= 1
        self.in_flight.add(task)
        self.group_index_of[task] = index

    def start_round(self, coroutine: Coroutine[Any, Any, list[RolloutSample]]) -> None:
        """A sync tail round: one task for the whole batch (its groups get indices when kept)."""
        self.in_flight.add(asyncio.create_task(coroutine))

    def on_group_done(self, task: asyncio.Task, samples: list[RolloutSample]) -> None:
        self.in_flight.discard(task)
        index = self.group_index_of.pop(task, None)
        self.timeline.done(index, len(samples))
        for group in self.throttle.on_finished(index, samples, self.samples_total, idle=not self.in_flight):
            self.write(group)

    def write(self, samples: list[RolloutSample]) -> None:
        self.writer.append(samples)
        self.samples_total = self.writer.count()

    # --- evaluation -----------------------------------------------------------------

    async def heldout_eval(self, step: int) -> None:
        from rl_core.config.benchmarks import HELDOUT_BENCHMARK
        from rl_core.evaluation.evaluator import PromptTemplate, evaluate, write_report

        e = self.config.eval
        temperature = self.config.sampling.temperature if e.heldout_temperature is None else e.heldout_temperature
        report = await evaluate(
            HELDOUT_BENCHMARK, self.generate_least_loaded, k=e.heldout_k, problems=self.task.heldout,
            sampling=SamplingParams(temperature=temperature, top_p=self.config.sampling.top_p,
                                    max_new_tokens=self.config.sampling.max_new_tokens),
            template=PromptTemplate(system=self.config.task.system_prompt),
            # Every problem at once: the server decodes them with the rollouts in one batch,
            # which is cheaper per token than several smaller waves (bench/RESULTS.md).
            reward_timeout_s=self.config.task.reward_timeout_s, concurrency=len(self.task.heldout), seed=self.config.seed,
            runner=self.runner, continue_turn=self.continue_turn, env=self.env,
        )
        # The held-out set is an evaluation like a benchmark: its summary line in evals.jsonl and
        # its per-problem file, so the platform shows, exports and serves it as one. The curve keeps
        # its own metric keys (charts, the held-out-collapse alert), not the benchmarks' eval/* ones.
        write_report(self.run_dir, step, report)
        versions = report.policy_versions
        self.sink.log(step, {
            mn.HELDOUT_SUCCESS: report.mean_at_k, mn.HELDOUT_PASS_AT_K: report.pass_at_k,
            mn.HELDOUT_VERSION_MIN: float(min(versions)) if versions else float(step),
            mn.HELDOUT_VERSION_MAX: float(max(versions)) if versions else float(step),
        })

    async def benchmark_eval(self, step: int) -> None:
        from rl_core.evaluation.evaluator import run_benchmarks

        await run_benchmarks(
            self.config.eval, self.generate_least_loaded, step=step, run_dir=self.run_dir, sampling=self.sampling,
            seed=self.config.seed, reward_timeout_s=self.config.task.reward_timeout_s, metrics_sink=self.sink,
            runner=self.runner, continue_turn=self.continue_turn,
        )

    def eval_coroutine(self, kind: EvalKind, step: int) -> Coroutine[Any, Any, None]:
        return self.heldout_eval(step) if kind == "heldout" else self.benchmark_eval(step)

    def start_due_evals(self) -> None:
        for kind in self.eval_schedule.due(self.version):
            self.evals.add(asyncio.create_task(self.eval_coroutine(kind, self.version)))

    # --- metrics --------------------------------------------------------------------

    def log_window(self, force: bool = False) -> None:
        w = self.window
        now = time.monotonic()
        if not force and now - w.started < METRICS_EVERY_S:
            return
        elapsed = max(1e-9, now - w.started)
        metrics: dict[str, float] = {
            mn.ROLLOUT_TOKENS_PER_S: w.tokens / elapsed,
            "rollout/in_flight": float(len(self.in_flight)),
            "rollout/samples_written": float(self.samples_total),
            "rollout/unconsumed": float(self.samples_total - self.consumed),
        }
        if w.rewards:
            metrics.update({
                mn.ROLLOUT_REWARD_MEAN: sum(w.rewards) / len(w.rewards),
                mn.ROLLOUT_SUCCESS_MEAN: sum(w.successes) / len(w.successes),
                "rollout/response_len/mean": sum(w.lengths) / len(w.lengths),
                "rollout/versions_per_sequence/max": float(max(w.versions_per_sequence)),
                "rollout/versions_per_sequence/mean": sum(w.versions_per_sequence) / len(w.versions_per_sequence),
                "rollout/groups": float(w.groups),
            })
        if w.groups:
            metrics[mn.ZERO_ADVANTAGE_SHARE] = w.zero_advantage_groups / w.groups
        if w.dropped_groups:
            metrics["rollout/dropped_zero_advantage_groups"] = float(w.dropped_groups)
        resampled = self.zero_advantage.take_count()
        if resampled:
            metrics["rollout/resampled_zero_advantage_groups"] = float(resampled)
        if self.runner is not None:
            metrics.update(w.env_metrics(self.runner.clock.take(), elapsed))
        metrics.update(self.router.metrics())
        metrics.update(self.plan.metrics())
        self.sink.log(self.version, metrics)
        self.window = Window()

    async def log_spec_metrics(self) -> None:
        """HistoSpec runs inside the servers: sum their cumulative spec_* counters and log
        the deltas since the last reading as spec/* metrics. In a multi-turn env also
        `env/prefix_reuse_tokens`: prompt tokens whose K/V the engines copied instead of computing
        (`prompt_tokens_shared`; the reference engine shares a prompt prefix with sequences still
        cached at the current weights, and keeps a finished turn's K/V for its continuation, so a
        continuation prefills little more than the tool's output)."""
        from rl_core.inference.spec_metrics import spec_metrics_from_counters

        totals: dict[str, float] = {}
        for client in self.clients:
            for key, value in (await client.health()).get("counters", {}).items():
                totals[key] = totals.get(key, 0.0) + float(value)
        metrics = spec_metrics_from_counters(totals, self.spec_counters) if self.config.accelerations.histospec.enabled else {}
        self.spec_counters = totals
        if self.runner is not None and "prompt_tokens_shared" in totals:
            shared = totals["prompt_tokens_shared"]
            if self.prefix_counter is not None:
                metrics[mn.ENV_PREFIX_REUSE_TOKENS] = shared - self.prefix_counter
            self.prefix_counter = shared
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

    def prompts(self) -> PromptSource:
        """The training prompts from where this actor starts: a restarted actor continues the
        prompt order where the stream ends (and the group count with it)."""
        skip = self.samples_total // self.group_size
        prompts = PromptSource(self.task.train_stream())
        prompts.skip(skip)
        self.groups_started = skip
        return prompts

    async def run(self) -> None:
        await self.wait_for_trainer()
        self.samples_total = self.writer.count()
        prompts = self.prompts()
        if self.config.accelerations.histospec.enabled or self.runner is not None:
            self.spec_poller = asyncio.create_task(self.log_spec_metrics_forever())
            self.evals.add(self.spec_poller)  # a failing poll fails the actor like a failing eval
        while True:
            progress = self.refresh_progress()
            if progress and progress.done:
                break
            self.start_due_evals()
            self.zero_advantage.return_prompts(prompts)
            self.plan.launch(prompts)
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
        # The final version may already have had its periodic evaluation (EvalSchedule.final).
        await asyncio.gather(*(self.eval_coroutine(kind, self.version) for kind in self.eval_schedule.final(self.version)))
        self.discarded.close()
        await self.env.aclose()
