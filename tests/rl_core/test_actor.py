"""The actor against a real inference server (the tiny model, `python -m rl_core serve`)
and a real file stream. The trainer is played by the test: it writes the progress
file the real trainer publishes, so the max_lag throttle can be checked step by step."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from rl_core.actor.loop import Actor
from rl_core.config.run_config import RunConfig
from rl_core.rundir.metrics import JsonlSink
from tests.metrics_file import read_metrics
from rl_core.rundir.stream import FileStreamReader, FileStreamWriter
from rl_core.actor.submission import PromptSource, TailRounds, TailWindow
from rl_core.rundir.layout import TrainerProgress, parse_ready_line, write_progress


def actor_config(model: Path, **overrides: object) -> RunConfig:
    data = {
        "model": {"path": str(model)},
        "task": {"heldout_size": 4},
        "sampling": {"max_new_tokens": 24},
        "actor": {"group_size": 2, "groups_in_flight": 2, "max_lag": 1},
        "trainer": {"samples_per_step": 2},
        "eval": {"heldout_every_n_steps": 0, "heldout_k": 1},
    }
    data.update(overrides)
    return RunConfig.model_validate(data)


def publish(run_dir: Path, version: int, consumed: int, done: bool = False) -> None:
    write_progress(run_dir, TrainerProgress(version=version, consumed=consumed, done=done))


@pytest.fixture(scope="module")
def server_url(tiny_model: Path) -> Iterator[str]:
    process = subprocess.Popen(
        [sys.executable, "-m", "rl_core", "serve", "--model", str(tiny_model), "--port", "0", "--threads", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        for line in process.stdout:  # type: ignore[union-attr]
            url = parse_ready_line(line)
            if url is not None:
                yield url
                break
        else:
            raise RuntimeError(f"server exited with {process.wait()} before it was ready")
    finally:
        process.terminate()
        process.wait(20)


class NoClient:
    """The throttle tests never generate; they only need a server slot."""


def test_max_lag_budget_and_sync_batches(tiny_model: Path, tmp_path: Path) -> None:
    config = actor_config(tiny_model, actor={"group_size": 2, "groups_in_flight": 8, "max_lag": 1},
                          trainer={"samples_per_step": 4})
    actor = Actor(config, tmp_path, [NoClient()], FileStreamWriter(tmp_path), JsonlSink(tmp_path / "m.jsonl"))
    # budget (max_lag + 1) * S = 8 samples unconsumed + in flight
    actor.samples_total, actor.consumed = 6, 0
    assert actor.may_submit()  # 6 + 0 + 2 <= 8
    actor.samples_total = 7
    assert not actor.may_submit()  # 7 + 2 > 8
    actor.consumed = 4  # the trainer took a step's worth
    assert actor.may_submit()

    sync = actor_config(tiny_model, mode="sync", sync_steps_per_batch=2,
                        actor={"group_size": 2, "groups_in_flight": 8}, trainer={"samples_per_step": 4})
    actor = Actor(sync, tmp_path, [NoClient()], FileStreamWriter(tmp_path / "s"), JsonlSink(tmp_path / "m2.jsonl"))
    actor.samples_total = actor.consumed = 0
    assert actor.may_submit()
    actor.throttle.launched = 8  # the whole batch (2 steps x 4) is launched
    assert not actor.may_submit()
    actor.throttle.launched = 0
    actor.samples_total = 8  # written, not yet trained: no new batch with stale weights
    assert not actor.may_submit()
    actor.consumed = 4
    assert not actor.may_submit()
    actor.consumed = 8
    assert actor.may_submit()

    # A dropped zero-advantage group does not count toward the batch: a replacement is
    # launched before the batch is written, so every sample of it has the same version.
    actor.throttle.launched = 8
    actor.in_flight = {"last group"}  # type: ignore[assignment]  # stands in for the task
    actor.on_group_done("last group", [])  # type: ignore[arg-type]
    assert actor.throttle.launched == 6 and actor.may_submit()
    actor.in_flight = set()


async def wait_until(predicate, timeout_s: float = 120.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


@pytest.mark.timeout(300)
async def test_actor_generates_throttles_and_finishes_with_eval(tiny_model: Path, server_url: str, tmp_path: Path) -> None:
    from rl_core.inference.client import InferenceClient

    config = actor_config(tiny_model)
    writer = FileStreamWriter(tmp_path)
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    client = InferenceClient(server_url)
    # A resumed run: the actor must not generate before the trainer pushed the checkpoint's version.
    (tmp_path / "checkpoints" / "step_000000").mkdir(parents=True)
    (tmp_path / "checkpoints" / "latest").symlink_to("step_000000")
    actor = Actor(config, tmp_path, [client], writer, sink)
    runner = asyncio.create_task(actor.run())
    await asyncio.sleep(0.5)
    assert writer.count() == 0  # no trainer yet: nothing generated
    publish(tmp_path, version=0, consumed=0)

    # Budget (max_lag + 1) * S = 4: the actor stalls at 4 samples until the trainer consumes.
    await wait_until(lambda: writer.count() == 4 and not actor.in_flight)
    await asyncio.sleep(0.5)
    assert writer.count() == 4 and not actor.may_submit()
    publish(tmp_path, version=1, consumed=2)
    await wait_until(lambda: writer.count() == 6 and not actor.in_flight)

    publish(tmp_path, version=1, consumed=6, done=True)
    await asyncio.wait_for(runner, 120)
    await client.aclose()
    sink.close()

    samples = FileStreamReader(tmp_path).read(100, 0.1)
    assert len(samples) == 6
    for group_start in range(0, 6, 2):
        group = samples[group_start:group_start + 2]
        assert group[0].group_id == group[1].group_id
        mean = sum(s.reward for s in group) / 2
        assert [s.advantage for s in group] == pytest.approx([s.reward - mean for s in group])
    for sample in samples:
        assert len(sample.completion_token_ids) == len(sample.behaviour_logprobs) == len(sample.token_versions) > 0
        assert set(sample.token_versions) == {0}  # nobody updated the server's weights
        assert all(logprob <= 0 for logprob in sample.behaviour_logprobs)
    records = read_metrics(tmp_path / "metrics.jsonl")
    keys = set().union(*records)
    for key in ("reward/mean", "success/mean", "rollout/tokens_per_s", "rollout/in_flight",
                "rollout/versions_per_sequence/max", "success/heldout"):
        assert key in keys, key
    heldout = [r for r in records if "success/heldout" in r]
    assert [r["step"] for r in heldout] == [0, 1]  # at the start and at the final version


@pytest.mark.timeout(300)
async def test_tail_batching_keeps_first_group_size_responses(tiny_model: Path, server_url: str, tmp_path: Path) -> None:
    """RollPacker in the async actor: short groups ask for 1.5 x G responses (one request
    each) and keep the first G; the surplus is aborted on the server."""
    from rl_core.inference.client import InferenceClient

    config = actor_config(
        tiny_model, actor={"group_size": 2, "groups_in_flight": 3, "max_lag": 3},
        accelerations={"tail_batching": {"enabled": True, "prompt_overprovision": 1.34, "response_overprovision": 1.5}},
    )
    writer = FileStreamWriter(tmp_path)
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    client = InferenceClient(server_url)
    actor = Actor(config, tmp_path, [client], writer, sink)
    assert isinstance(actor.plan, TailWindow) and actor.plan.tracker.responses_for("short") == 3
    publish(tmp_path, version=0, consumed=0)
    runner = asyncio.create_task(actor.run())
    await wait_until(lambda: writer.count() >= 6)
    publish(tmp_path, version=0, consumed=writer.count(), done=True)
    await asyncio.wait_for(runner, 120)
    await client.aclose()
    sink.close()
    samples = FileStreamReader(tmp_path).read(100, 0.1)
    groups: dict[str, list] = {}
    for sample in samples:
        groups.setdefault(sample.group_id, []).append(sample)
    assert groups and all(len(members) == 2 for members in groups.values())
    assert "sched/round" in set().union(*read_metrics(tmp_path / "metrics.jsonl"))


@pytest.mark.timeout(300)
async def test_final_benchmark_eval_writes_evals(tiny_model: Path, server_url: str, shared_data_dir: Path, tmp_path: Path) -> None:
    """The trainer is already done: the actor goes straight to the final evaluations,
    the held-out curve point and the benchmark files of docs/ARCHITECTURE.md."""
    from rl_core.inference.client import InferenceClient

    config = actor_config(tiny_model, eval={
        "heldout_every_n_steps": 0, "heldout_k": 1, "benchmarks": ["math500"], "k": {"math500": 1},
        "max_problems": 2, "max_new_tokens": 8, "data_dir": str(shared_data_dir),
    })
    publish(tmp_path, version=7, consumed=0, done=True)
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    client = InferenceClient(server_url)
    await asyncio.wait_for(Actor(config, tmp_path, [client], FileStreamWriter(tmp_path), sink).run(), 240)
    await client.aclose()
    sink.close()
    lines = {line["benchmark"]: line for line in map(json.loads, (tmp_path / "evals.jsonl").read_text().splitlines())}
    assert set(lines) == {"math500", "heldout"}
    line = lines["math500"]
    assert line["step"] == 7 and line["benchmark"] == "math500" and line["num_problems"] == 2
    assert (tmp_path / line["results_file"]).is_file()
    assert line["results_file"] == "eval/step_000007_math500.jsonl"
    heldout_points = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "success/heldout" in r and r["step"] == 7]
    assert heldout_points
    # The held-out set is reported as an evaluation too (issue 26): its line and per-problem
    # file, with the same score as the metric the charts and alerts read.
    heldout = lines["heldout"]
    assert heldout["step"] == 7 and heldout["k"] == 1 and heldout["num_problems"] == config.task.heldout_size
    assert heldout["mean_at_k"] == pytest.approx(heldout_points[-1]["success/heldout"])
    problems = [json.loads(text) for text in (tmp_path / heldout["results_file"]).read_text().splitlines()]
    assert heldout["results_file"] == "eval/step_000007_heldout.jsonl" and len(problems) == heldout["num_problems"]
    assert all(len(p["samples"]) == 1 and p["answer"] for p in problems)


@pytest.mark.timeout(300)
async def test_sync_tail_rounds_train_every_prompt_once(tiny_model: Path, server_url: str, tmp_path: Path) -> None:
    """RollPacker in sync mode: each batch is a round. Short rounds draw 1.5 x B prompts with
    1.5 x G responses each and keep the first B prompts to complete; the others are aborted and
    queued; once the queue holds B prompts a long round trains exactly those. No drawn prompt
    is lost or trained twice: trained + queued is exactly the prefix of the prompt stream."""
    from rl_core.inference.client import InferenceClient

    config = actor_config(
        tiny_model, mode="sync", actor={"group_size": 2, "groups_in_flight": 4, "max_lag": 1},
        trainer={"samples_per_step": 4},
        accelerations={"tail_batching": {"enabled": True, "prompt_overprovision": 1.5, "response_overprovision": 1.5}},
    )
    writer = FileStreamWriter(tmp_path)
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    client = InferenceClient(server_url)
    actor = Actor(config, tmp_path, [client], writer, sink)
    assert isinstance(actor.plan, TailRounds) and actor.plan.planner.batch_prompts == 2
    publish(tmp_path, version=0, consumed=0)
    runner = asyncio.create_task(actor.run())
    kinds: list[str] = []
    for batch in range(3):  # short, short (2 prompts deferred by now), long
        await wait_until(lambda: writer.count() >= 4 * (batch + 1) and not actor.in_flight)
        assert writer.count() == 4 * (batch + 1)  # one whole sync batch at a time
        kinds.append("long" if actor.plan.planner.metrics()["sched/round"] == 1.0 else "short")
        publish(tmp_path, version=batch + 1, consumed=writer.count(), done=batch == 2)
    await asyncio.wait_for(runner, 120)
    await client.aclose()
    sink.close()

    assert kinds == ["short", "short", "long"]
    samples = FileStreamReader(tmp_path).read(100, 0.1)
    groups: dict[str, list] = {}
    for sample in samples:
        groups.setdefault(sample.group_id, []).append(sample)
    assert all(len(members) == 2 and len({s.prompt_id for s in members}) == 1 for members in groups.values())
    trained = [members[0].prompt_id for members in groups.values()]
    assert len(trained) == len(set(trained)) == 6
    queued = actor.plan.planner.pending()
    drawn = 2 * 3  # two short rounds of ceil(1.5 x 2) prompts; the long round draws none
    stream = [problem.id for _, problem in itertools.islice(actor.task.train_stream(), drawn)]
    assert sorted(trained + queued) == sorted(stream)
    assert set(actor.plan.epochs) == set(queued)  # the queued prompts keep their epoch until trained
    records = read_metrics(tmp_path / "metrics.jsonl")
    rounds = [r for r in records if "sched/round" in r]
    assert [r["sched/round"] for r in rounds] == [0.0, 0.0, 1.0]
    assert [r["sched/long_tail_queue"] for r in rounds] == [1.0, 2.0, 0.0]
    # A short round launches 3 x 3 requests and 2 x 2 are kept: at least the third prompt's
    # unfinished requests are aborted. The long round launches exactly 2 x 2.
    assert all(r["sched/aborted"] > 0 for r in rounds[:2]) and rounds[2]["sched/aborted"] == 0


class DroppingClient:
    """Fakes what cannot be provoked on demand: a pooled keep-alive connection the server closes
    just as a request goes out (httpx.ReadError). The first `drops` calls fail that way."""

    def __init__(self, drops: int) -> None:
        self.drops = drops
        self.prefixes: list[str | None] = []

    async def generate(self, messages, sampling, n=1, prompt_id=None, request_id_prefix=None):
        import httpx

        from rl_core.inference.client import ServerError
        from rl_core.common.contracts import GenerationResult

        self.prefixes.append(request_id_prefix)
        if len(self.prefixes) <= self.drops:
            raise ServerError("http://fake", "POST /v1/chat/completions failed") from httpx.ReadError("")
        return [GenerationResult(request_id=f"{request_id_prefix}-0", prompt_token_ids=[1], token_ids=[2],
                                 logprobs=[-0.1], token_versions=[0], finish_reason="stop")]


async def test_a_request_whose_connection_dropped_is_sent_again_under_its_prefix(tiny_model: Path, tmp_path: Path) -> None:
    from rl_core.inference.client import ServerError

    config = actor_config(tiny_model)
    client = DroppingClient(drops=2)
    actor = Actor(config, tmp_path, [client], FileStreamWriter(tmp_path), JsonlSink(tmp_path / "m.jsonl"))
    (result,) = await actor.generate_on(0, [], actor.sampling, 1, "p", "g00000001-r2")
    assert result.token_ids == [2] and actor.server_loads == [0.0]
    # Resent ids keep the group's prefix, so an abort of "g00000001" still reaches them.
    assert client.prefixes == ["g00000001-r2", "g00000001-r2-retry1", "g00000001-r2-retry2"]
    actor.clients = [DroppingClient(drops=3)]
    with pytest.raises(ServerError):  # three drops in a row: the error reaches the caller
        await actor.generate_on(0, [], actor.sampling, 1, "p", "g2")
    assert actor.server_loads == [0.0]


class SlowGroupClient:
    """An inference server stand-in whose `slow_calls`-th training requests take 10x longer.
    Half of each group answers correctly (so no group has zero advantage); every token is
    tagged with the weights version current when the request started (the oldest it can carry)."""

    def __init__(self, answers: dict[str, str], slow_calls: set[int], base_delay_s: float) -> None:
        self.answers = answers
        self.slow_calls = slow_calls
        self.base_delay_s = base_delay_s
        self.version = 0
        self.calls = 0
        self.slow_prompt_ids: list[str] = []

    async def generate(self, messages, sampling, n: int = 1, prompt_id=None, request_id_prefix=None):
        from rl_core.common.contracts import GenerationResult

        version = self.version
        delay = self.base_delay_s
        if prompt_id is not None:
            self.calls += 1
            if self.calls in self.slow_calls:
                delay *= 10
                self.slow_prompt_ids.append(prompt_id)
        await asyncio.sleep(delay)
        answer = self.answers.get(prompt_id or "", "0")
        results = []
        for i in range(n):
            text = f"so the answer is \\boxed{{{answer if i % 2 == 0 else '-12345'}}}"
            results.append(GenerationResult(
                request_id=f"{request_id_prefix}-{i}", prompt_token_ids=[1, 2, 3], token_ids=[5, 6, 7, 8],
                logprobs=[-1.0] * 4, token_versions=[version] * 4, finish_reason="stop", text=text,
            ))
        return results


@pytest.mark.timeout(300)
async def test_a_slow_group_is_waited_for_not_trained_late_or_dropped(tiny_model: Path, tmp_path: Path) -> None:
    """The demo's async settings (groups of 8, 8 in flight, 64 per step, max_lag 2) with one
    group 10x slower than the rest. Before the lag bound was kept at submission, the groups
    finishing after it were written first and the slow group reached the trainer ~8 versions
    late, to be dropped as stale."""
    from rl_core.envs.problems import load_task

    config = actor_config(
        tiny_model, actor={"group_size": 8, "groups_in_flight": 8, "max_lag": 2, "drop_zero_advantage_groups": True},
        trainer={"samples_per_step": 64},
    )
    task = load_task(config.task)
    client = SlowGroupClient({p.id: p.answer for p in task.train}, slow_calls={5}, base_delay_s=0.05)
    writer = FileStreamWriter(tmp_path)
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    actor = Actor(config, tmp_path, [client], writer, sink, task=task)
    runner = asyncio.create_task(actor.run())

    # The trainer, played here: takes 64 samples per step in stream order, records each
    # token's lag at the version it is trained with, steps, updates the server, publishes.
    reader = FileStreamReader(tmp_path)
    version, consumed, lags, trained_prompts = 0, 0, [], set()
    # A fresh run: the actor starts before the trainer has published anything.
    await wait_until(lambda: writer.count() >= 8, timeout_s=30)
    publish(tmp_path, version, consumed)
    steps = 10
    while version < steps:
        batch = []
        while len(batch) < 64:
            batch += reader.read(64 - len(batch), 0.0)
            await asyncio.sleep(0.01)
        lags += [version - v for sample in batch for v in sample.token_versions]
        trained_prompts |= {sample.prompt_id for sample in batch}
        consumed += len(batch)
        version += 1
        client.version = version
        publish(tmp_path, version, consumed)
    publish(tmp_path, version, consumed, done=True)
    await asyncio.wait_for(runner, 120)
    sink.close()

    assert max(lags) <= 2, f"trained at lag {max(lags)} > max_lag 2"
    assert client.slow_prompt_ids and client.slow_prompt_ids[0] in trained_prompts  # waited for, not lost


async def test_a_launch_pass_runs_in_histopipe_order_on_the_least_predicted_load(tiny_model: Path, tmp_path: Path) -> None:
    """The actor's own launch path orders a sync batch longest-predicted-first and places each
    group on the server with the least predicted work (HistoPipe), as bench/histopipe.py measures."""
    config = actor_config(
        tiny_model, mode="sync", sync_steps_per_batch=1, actor={"group_size": 2, "groups_in_flight": 4},
        trainer={"samples_per_step": 8}, accelerations={"histopipe": {"enabled": True}},
    )
    actor = Actor(config, tmp_path, [NoClient(), NoClient()], FileStreamWriter(tmp_path), JsonlSink(tmp_path / "m.jsonl"))
    problems = [problem for problem in actor.task.train[:4]]
    for problem, length in zip(problems, [10, 40, 20, 30]):  # last epoch's response lengths
        actor.router.observe(problem.id, [length, length])
    launched: list[tuple[str, int | None]] = []

    async def record(problem, epoch, index, kind="plain", server=None):
        return []

    def run_group(problem, epoch, index, kind="plain", server=None):
        launched.append((problem.id, server))
        return record(problem, epoch, index, kind, server)

    actor.plan.run_group = run_group  # type: ignore[attr-defined]
    actor.plan.launch(PromptSource(iter([(0, problem) for problem in problems])))
    ids = [problem.id for problem in problems]
    assert [prompt_id for prompt_id, _ in launched] == [ids[1], ids[3], ids[2], ids[0]]  # 40, 30, 20, 10
    assert [server for _, server in launched] == [0, 1, 1, 0]  # 40 | 30 -> 30+20 | 40+10: 50 each
    assert len(actor.in_flight) == 4 and actor.throttle.launched == 8
    await asyncio.gather(*actor.in_flight)


@pytest.mark.timeout(120)
async def test_the_final_version_is_evaluated_once_when_a_periodic_eval_already_ran(tiny_model: Path, tmp_path: Path) -> None:
    """max_steps a multiple of eval.heldout_every_n_steps: the periodic held-out eval at the last
    version is the final one (before, a second identical evaluation logged a duplicate line)."""
    from rl_core.envs.problems import load_task

    config = actor_config(tiny_model, eval={"heldout_every_n_steps": 2, "heldout_k": 1})
    task = load_task(config.task)
    client = SlowGroupClient({p.id: p.answer for p in task.train}, slow_calls=set(), base_delay_s=0.01)
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    actor = Actor(config, tmp_path, [client], FileStreamWriter(tmp_path), sink, task=task)
    runner = asyncio.create_task(actor.run())
    publish(tmp_path, version=2, consumed=0)

    def heldout_steps() -> list[int]:
        return [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl") if "success/heldout" in r]

    await wait_until(lambda: 2 in heldout_steps(), timeout_s=60)
    publish(tmp_path, version=2, consumed=0, done=True)
    await asyncio.wait_for(runner, 60)
    sink.close()
    assert heldout_steps() == [2]


def test_the_actor_imports_neither_torch_nor_the_engine_or_trainer_modules() -> None:
    code = ("import sys, rl_core.actor.loop; print(sorted(m for m in ('torch', 'rl_core.trainer.loop', 'rl_core.trainer.loss', "
            "'rl_core.inference.engine', 'rl_core.inference.speculation', 'rl_core.inference.server') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


async def test_discarded_samples_are_written_with_their_reason_for_the_viewer(tiny_model: Path, tmp_path: Path) -> None:
    """What the actor scores but never writes to the stream goes to stream/discarded.jsonl with
    why: a dropped zero-advantage group (every sample), an aborted or empty response of a kept
    group. The stream itself gets the trainable samples only, and only steps the viewer keeps
    (monitoring.rollouts.keep_every_n_steps) are recorded."""
    from rl_core.common.contracts import GenerationResult, RolloutSample
    from rl_core.envs.problems import load_task
    from rl_core.rundir.layout import DISCARDED_ROLLOUTS_FILE

    config = actor_config(tiny_model, actor={"group_size": 3, "groups_in_flight": 1, "max_lag": 1,
                                             "drop_zero_advantage_groups": True},
                          monitoring={"rollouts": {"keep_every_n_steps": 1}})
    task = load_task(config.task)
    writer = FileStreamWriter(tmp_path)
    actor = Actor(config, tmp_path, [NoClient()], writer, JsonlSink(tmp_path / "m.jsonl"), task=task)
    problem = task.train[0]

    def result(index: int, answer: str, finish: str = "stop", tokens: tuple[int, ...] = (5, 6)) -> GenerationResult:
        return GenerationResult(request_id=f"r{index}", prompt_token_ids=[1, 2], token_ids=list(tokens),
                                logprobs=[-0.5] * len(tokens), token_versions=[0] * len(tokens),
                                finish_reason=finish, text=f"the answer is \\boxed{{{answer}}}")

    # Every answer right: advantage 0 everywhere, the group is dropped.
    same = await actor.score_group(problem, 0, "g00000000", [result(i, problem.answer) for i in range(3)])
    assert same == []
    # One right, one wrong (kept), one aborted mid-answer and one empty (not trainable).
    mixed = await actor.score_group(problem, 0, "g00000001", [
        result(0, problem.answer), result(1, "-12345"), result(2, problem.answer, finish="abort"),
        result(3, "-12345", tokens=()),
    ])
    actor.write(mixed)
    actor.discarded.close()
    assert [s.sample_id for s in mixed] == ["g00000001-0", "g00000001-1"] and all(s.discarded is None for s in mixed)
    stream_lines = (tmp_path / "stream" / "rollouts.jsonl").read_text().splitlines()
    assert len(stream_lines) == 2 and all("discarded" not in json.loads(line) for line in stream_lines)

    lines = [json.loads(line) for line in (tmp_path / DISCARDED_ROLLOUTS_FILE).read_text().splitlines()]
    assert [(line["sample_id"], line["discarded"]) for line in lines] == [
        ("g00000000-0", "zero_advantage"), ("g00000000-1", "zero_advantage"), ("g00000000-2", "zero_advantage"),
        ("g00000001-2", "aborted"), ("g00000001-3", "empty"),
    ]
    # Each line is a RolloutSample (one format, one reader) placed where it would have been written.
    samples = [RolloutSample.from_json(line) for line in lines]
    assert all(s.metadata["stream_line"] == 0 for s in samples) and samples[0].reward == 1.0

    # A step the viewer does not keep records nothing (keep every 2nd step, 3 samples per step).
    sparse = Actor(actor_config(tiny_model, actor={"group_size": 3, "groups_in_flight": 1, "max_lag": 1,
                                                   "drop_zero_advantage_groups": True},
                                trainer={"samples_per_step": 3}, monitoring={"rollouts": {"keep_every_n_steps": 2}}),
                   tmp_path / "sparse", [NoClient()], FileStreamWriter(tmp_path / "sparse"),
                   JsonlSink(tmp_path / "sparse.jsonl"), task=task)
    await sparse.score_group(problem, 0, "g00000000", [result(i, problem.answer) for i in range(3)])  # step 1
    assert not (tmp_path / "sparse" / DISCARDED_ROLLOUTS_FILE).exists()
    sparse.samples_total = 3  # the stream's next line trains at step 2
    await sparse.score_group(problem, 0, "g00000001", [result(i, problem.answer) for i in range(3)])
    assert sparse.discarded.written == 3
