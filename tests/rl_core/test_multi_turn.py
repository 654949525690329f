"""Multi-turn, tool-integrated rollouts (issue 34): the env section, the tool env's parsing, the
trajectory runner's tokens / mask / versions / budget, the actor's stream lines and metrics, the
evaluator's `used_tool`, and custom envs loaded only from INFLIGHT_ENV_ROOTS.

The untrained tiny model never writes a code block, so the rollout loop is driven here by a
scripted stand-in of the inference server (`ScriptedClient`) that answers the first turn with a
```python block and the next with a boxed answer; the Python really runs in the sandbox."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rl_core.common.contracts import TOOL_TOKEN_VERSION, GenerationResult, SamplingParams
from rl_core.config.files import field_errors
from rl_core.config.run_config import RunConfig
from rl_core.envs.environments import (
    ENV_ROOTS_VARIABLE, MathEnvironment, MathPythonToolEnvironment, ToolCall, class_path_error, load_environment,
    tool_output_body,
)
from rl_core.envs.problems import Problem, TaskData
from rl_core.envs.sandbox import ToolResult
from rl_core.envs.trajectories import HFTokenCodec, ToolClock, ToolSpans, TrajectoryRunner, tokens_through

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE_ROOT = REPO_ROOT / "examples" / "custom_env"


def tool_config(model: Path | str = "var/models/tiny", **env: Any) -> RunConfig:
    return RunConfig.model_validate({
        "model": {"path": str(model)}, "task": {"heldout_size": 4}, "sampling": {"max_new_tokens": 64},
        "actor": {"group_size": 2, "groups_in_flight": 1, "max_lag": 2}, "trainer": {"samples_per_step": 2},
        "eval": {"heldout_every_n_steps": 0, "heldout_k": 1}, "env": {"name": "math_python_tool", **env},
    })


# --- the config section ----------------------------------------------------------------------


def test_env_section_defaults_to_todays_single_turn_and_names_its_fields() -> None:
    config = RunConfig()
    assert config.env.name == "math" and config.env.max_turns == 4 and config.env.class_path is None
    cases = [
        ({"name": "custom"}, "env.class_path"),
        ({"name": "math", "class_path": "pkg.mod:Env"}, "env.class_path"),
        ({"name": "custom", "class_path": "not a path"}, "env.class_path"),
        ({"max_turns": -1}, "env.max_turns"),
        ({"tool_wall_s": 0}, "env.tool_wall_s"),
        ({"name": "bash"}, "env.name"),
    ]
    for env, field in cases:
        with pytest.raises(ValidationError) as caught:
            RunConfig.model_validate({"env": env})
        assert field in field_errors(caught.value), (env, field_errors(caught.value))


# --- the tool env ----------------------------------------------------------------------------


def test_tool_env_finds_fenced_and_tagged_calls_and_stops_at_max_turns(tiny_model: Path) -> None:
    env = MathPythonToolEnvironment(tool_config(tiny_model, max_turns=2))
    assert env.format == "fenced"
    text = "Let me compute.\n```python\nprint(6 * 7)\n```\nThe output is 41"
    call = env.on_model_turn(text, tool_calls=0)
    assert call is not None and call.code == "print(6 * 7)\n" and text[:call.end].endswith("```")
    assert env.on_model_turn(text, tool_calls=2) is None  # out of calls: this turn is the answer
    assert env.on_model_turn("so \\boxed{42}", tool_calls=0) is None
    tagged = MathPythonToolEnvironment(tool_config(tiny_model), chat_template="{{ '<tool_call>' }}")
    assert tagged.format == "tool_call"
    call = tagged.on_model_turn('x <tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call> y', 0)
    assert call is not None and call.code == "print(1)"
    assert tagged.on_model_turn("<tool_call>print(2)</tool_call>", 0).code == "print(2)"  # type: ignore[union-attr]
    result = ToolResult(status="timeout", stdout="partial\n", stderr="sandbox: wall-time limit\n", seconds=5.0, exit_code=None)
    assert tool_output_body(result) == "partial\nsandbox: wall-time limit\n[timed out]"
    assert env.tool_output_text(call, result).startswith("\n```output\npartial")
    assert tagged.tool_output_text(call, result).startswith("\n<tool_response>\npartial")


def test_math_env_is_todays_single_turn(tiny_model: Path) -> None:
    config = RunConfig.model_validate({"model": {"path": str(tiny_model)}, "task": {"heldout_size": 4}})
    env = load_environment(config)
    assert isinstance(env, MathEnvironment) and not env.multi_turn
    problem = Problem(id="p", problem="Compute 6 * 7.", answer="42")
    assert env.first_messages(problem) == env.task.messages(problem)
    assert [r.success for r in env.score(problem, ["\\boxed{42}", "\\boxed{41}"])] == [True, False]


# --- the trajectory runner -------------------------------------------------------------------


class FakeSandbox:
    """Answers every call with `stdout`, after `delay_s`; records the code it was given."""

    def __init__(self, stdout: str = "42\n", delay_s: float = 0.0) -> None:
        self.stdout = stdout
        self.delay_s = delay_s
        self.codes: list[str] = []

    async def run(self, code: str, limits: Any) -> ToolResult:
        self.codes.append(code)
        await asyncio.sleep(self.delay_s)
        return ToolResult(status="ok", stdout=self.stdout, stderr="", seconds=self.delay_s, exit_code=0)


def result_of(codec: HFTokenCodec, prompt: list[int], text: str, version: int, finish: str = "stop",
              stop_reason: str | None = None) -> GenerationResult:
    ids = codec.encode(text)
    return GenerationResult(request_id="r", prompt_token_ids=prompt, token_ids=ids, logprobs=[-0.5] * len(ids),
                            token_versions=[version] * len(ids), finish_reason=finish, text=text, stop_reason=stop_reason)


async def test_a_turn_stops_where_its_call_ends_and_goes_on_past_the_fence_that_opens_it(tiny_model: Path) -> None:
    """Requests carry the env's stop texts while calls are left: a turn stopped at the fence that
    opens a block (no call yet) is continued as the same model turn (prompt + the turn so far);
    stopped at the fence that closes it, the call runs; the answer turn has no stop texts."""
    codec = HFTokenCodec.from_pretrained(str(tiny_model))
    sandbox = FakeSandbox()
    env = MathPythonToolEnvironment(tool_config(tiny_model, max_turns=1), sandbox=sandbox)
    assert env.stop_texts(0) == ["```"] and env.stop_texts(1) == []
    runner = TrajectoryRunner(env, codec, ToolClock())
    prompt = codec.encode("<|im_start|>user\nCompute 6 * 7.<|im_end|>\n<|im_start|>assistant\n")
    opening = result_of(codec, prompt, "Let me run ```", version=0, stop_reason="```")
    requests: list[tuple[list[int], SamplingParams]] = []

    async def generate(prompt_ids: list[int], sampling: SamplingParams) -> GenerationResult:
        requests.append((prompt_ids, sampling))
        if len(requests) == 1:
            return result_of(codec, prompt_ids, "python\nprint(6 * 7)\n```", version=1, stop_reason="```")
        return result_of(codec, prompt_ids, "\\boxed{42}", version=1)

    trajectory = await runner.complete(opening, generate, SamplingParams(max_new_tokens=64, stop=env.stop_texts(0)))
    turn_ids = opening.token_ids + codec.encode("python\nprint(6 * 7)\n```")
    assert requests[0][0] == prompt + opening.token_ids and requests[0][1].stop == ["```"]
    assert requests[0][1].max_new_tokens == 64 - len(opening.token_ids)
    assert sandbox.codes == ["print(6 * 7)\n"]
    assert [turn["kind"] for turn in trajectory.turns] == ["model", "tool", "model"]
    assert trajectory.token_ids[: len(turn_ids)] == turn_ids and trajectory.model_texts[0] == "Let me run ```python\nprint(6 * 7)\n```"
    assert trajectory.token_versions[: len(turn_ids)] == [0] * len(opening.token_ids) + [1] * (len(turn_ids) - len(opening.token_ids))
    assert requests[1][0] == prompt + trajectory.token_ids[: trajectory.turns[2]["start"]] and requests[1][1].stop == []


async def test_trajectory_tokens_mask_versions_and_budget(tiny_model: Path) -> None:
    codec = HFTokenCodec.from_pretrained(str(tiny_model))
    sandbox = FakeSandbox()
    env = MathPythonToolEnvironment(tool_config(tiny_model, max_turns=1), sandbox=sandbox)
    runner = TrajectoryRunner(env, codec, ToolClock())
    prompt = codec.encode("<|im_start|>user\nCompute 6 * 7.<|im_end|>\n<|im_start|>assistant\n")
    call_text = "```python\nprint(6 * 7)\n```"
    first = result_of(codec, prompt, call_text + "\nimagined output", version=3)
    requests: list[tuple[list[int], SamplingParams]] = []

    async def generate(prompt_ids: list[int], sampling: SamplingParams) -> GenerationResult:
        requests.append((prompt_ids, sampling))
        result = result_of(codec, prompt_ids, "so \\boxed{42}", version=4)  # the weights changed between turns
        if len(result.token_ids) > sampling.max_new_tokens:  # as the engine does
            keep = sampling.max_new_tokens
            result = GenerationResult(result.request_id, prompt_ids, result.token_ids[:keep], result.logprobs[:keep],
                                      result.token_versions[:keep], "length")
        return result

    sampling = SamplingParams(max_new_tokens=80)
    trajectory = await runner.complete(first, generate, sampling)
    model_1 = codec.encode(call_text)
    tool = codec.encode(env.tool_output_text(ToolCall("", 0), await FakeSandbox().run("", None)))
    model_2 = codec.encode("so \\boxed{42}")
    assert sandbox.codes == ["print(6 * 7)\n"]
    # The model's turn is cut where its call ends; the tool's output follows, then the answer.
    assert trajectory.token_ids == model_1 + tool + model_2
    assert trajectory.mask == [1] * len(model_1) + [0] * len(tool) + [1] * len(model_2)
    assert trajectory.logprobs == [-0.5] * len(model_1) + [0.0] * len(tool) + [-0.5] * len(model_2)
    assert trajectory.token_versions == [3] * len(model_1) + [TOOL_TOKEN_VERSION] * len(tool) + [4] * len(model_2)
    assert trajectory.num_versions == 2
    a, b = len(model_1), len(model_1) + len(tool)
    assert trajectory.turns == [
        {"kind": "model", "start": 0, "end": a},
        {"kind": "tool", "start": a, "end": b, "status": "ok", "seconds": 0.0},
        {"kind": "model", "start": b, "end": b + len(model_2)},
    ]
    assert trajectory.model_text == call_text + "so \\boxed{42}"  # tool output is not the model's answer
    # The next turn's prompt is the previous prompt + the model's tokens + the tool's, with what is left of the budget.
    ((continued, asked),) = requests
    assert continued == prompt + model_1 + tool and asked.max_new_tokens == 80 - b
    assert trajectory.metadata("math_python_tool") == {"turns": trajectory.turns, "tool_calls": 1, "env": "math_python_tool"}

    # Out of budget: the tool output is cut to leave the model one token, no more.
    short = await runner.complete(first, generate, SamplingParams(max_new_tokens=len(model_1) + 3))
    assert short.mask[len(model_1):] == [0, 0, 1] and len(short.token_ids) == len(model_1) + 3
    assert requests[-1][1].max_new_tokens == 1 and short.finish_reason == "length"


def test_tokens_through_finds_the_first_token_reaching_an_offset() -> None:
    def decode(ids: list[int]) -> str:
        return "".join("ab"[i] * 2 for i in ids)  # every token is two characters

    assert tokens_through([0, 1, 0, 1], 3, decode) == 2 and tokens_through([0, 1, 0, 1], 4, decode) == 2
    assert tokens_through([0, 1, 0, 1], 5, decode) == 3


async def test_tool_calls_of_one_trajectory_do_not_block_the_others(tiny_model: Path) -> None:
    """Two trajectories whose tools take 0.5 s each finish in about 0.5 s, not 1: the sandbox is
    awaited, so the loop runs other samples meanwhile; the clock counts the overlap once."""
    codec = HFTokenCodec.from_pretrained(str(tiny_model))
    env = MathPythonToolEnvironment(tool_config(tiny_model), sandbox=FakeSandbox(delay_s=0.5))
    clock = ToolClock()
    runner = TrajectoryRunner(env, codec, clock)
    first = result_of(codec, [1, 2], "```python\nprint(1)\n```", version=0)

    async def generate(prompt_ids: list[int], sampling: SamplingParams) -> GenerationResult:
        return result_of(codec, prompt_ids, "\\boxed{1}", version=0)

    loop = asyncio.get_running_loop()
    started = loop.time()
    both = await asyncio.gather(*(runner.complete(first, generate, SamplingParams(max_new_tokens=64)) for _ in range(2)))
    elapsed = loop.time() - started
    assert all(t.tool_calls == 1 for t in both)
    assert elapsed < 0.9, elapsed
    spans = clock.take()
    assert 0.45 <= spans.busy_s < 0.9
    assert spans.waiting_s == spans.busy_s  # no generation request went through the clock: all of it was waiting


def test_a_tool_call_beside_a_generation_in_flight_is_busy_but_not_waiting() -> None:
    """`tool/wait_share` counts only what the actor waits on: a call running while none of its
    generation requests is in flight. `tool/busy_share` counts every second with a call running."""
    now = [100.0]
    clock = ToolClock(now=lambda: now[0])
    clock.generation_started()
    now[0] += 1.0  # a request in flight, no call: neither
    clock.start()
    now[0] += 0.3  # the call runs beside the request: the server decodes other samples
    clock.generation_finished()
    now[0] += 0.2  # nothing in flight: the rollout waits on the call
    clock.stop()
    now[0] += 0.1  # no call: neither
    assert clock.take() == ToolSpans(busy_s=pytest.approx(0.5), waiting_s=pytest.approx(0.2))
    clock.start()
    now[0] += 0.4  # a call still running when the window closes counts up to then
    assert clock.take() == ToolSpans(busy_s=pytest.approx(0.4), waiting_s=pytest.approx(0.4))


# --- the actor: stream lines and metrics -----------------------------------------------------


class ScriptedClient:
    """An inference server stand-in: a request with messages (a group's first turn) answers with a
    code block; a token prompt (a continuation) with the boxed answer. `version` is what the
    server's weights are: the test moves it between turns, as an in-flight update would."""

    def __init__(self, codec: HFTokenCodec, answer: str) -> None:
        self.codec = codec
        self.answer = answer
        self.version = 0
        self.continuations: list[list[int]] = []

    async def generate(self, messages, sampling, n=1, prompt_id=None, request_id_prefix=None, prompt_token_ids=None):
        if prompt_token_ids is None:
            prompt = self.codec.encode("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")
            texts = ["```python\nprint(6 * 7)\n```\n" if i == 0 else f"\\boxed{{{self.answer}}}" for i in range(n)]
        else:
            self.continuations.append(list(prompt_token_ids))
            prompt, texts = list(prompt_token_ids), [f"so \\boxed{{{self.answer}}}"]
        return [result_of(self.codec, prompt, text, self.version) for text in texts]

    async def health(self) -> dict[str, Any]:
        return {"counters": {"prompt_tokens_shared": 10.0 * len(self.continuations)}}


async def test_actor_writes_trajectories_with_masks_turns_and_tool_metrics(tiny_model: Path, tmp_path: Path) -> None:
    from rl_core.actor.loop import Actor
    from rl_core.common import metric_names as mn
    from rl_core.rundir.metrics import JsonlSink
    from rl_core.rundir.stream import FileStreamReader, FileStreamWriter

    config = tool_config(tiny_model)
    codec = HFTokenCodec.from_pretrained(str(tiny_model))
    client = ScriptedClient(codec, "42")
    problem = Problem(id="p42", problem="Compute 6 * 7.", answer="42")
    task = TaskData(train=[problem], heldout=[problem])
    actor = Actor(config, tmp_path, [client], FileStreamWriter(tmp_path), JsonlSink(tmp_path / "m.jsonl"), task=task)
    assert actor.runner is not None and actor.env.name == "math_python_tool"
    (first, second) = await actor.generate_on(0, actor.messages(problem), actor.sampling, 2, problem.id)
    client.version = 1  # an update lands while the first sample's tool runs
    await actor.log_spec_metrics()  # the first reading of prompt_tokens_shared
    samples = await actor.score_group(problem, 0, "g00000000", [first, second])
    actor.write(samples)
    await actor.log_spec_metrics()
    actor.log_window(force=True)

    written = FileStreamReader(tmp_path).read(10, 0.1)
    assert [s.sample_id for s in written] == ["g00000000-0", "g00000000-1"]
    with_tool, without = written
    assert with_tool.success and without.success and with_tool.advantage == without.advantage == 0.0
    turns = with_tool.metadata["turns"]
    assert [t["kind"] for t in turns] == ["model", "tool", "model"]
    assert turns[1]["status"] == "ok" and turns[1]["seconds"] > 0
    assert with_tool.metadata["tool_calls"] == 1 and with_tool.metadata["env"] == "math_python_tool"
    tool_span = range(turns[1]["start"], turns[1]["end"])
    assert codec.decode([with_tool.completion_token_ids[i] for i in tool_span]).strip() == "```output\n42\n```"
    assert with_tool.completion_mask == [0 if i in tool_span else 1 for i in range(len(with_tool.completion_token_ids))]
    # Per-token versions exact across the update: version 0 before the tool, 1 after it, -1 on the tool.
    assert with_tool.token_versions == ([0] * turns[0]["end"] + [TOOL_TOKEN_VERSION] * len(tool_span)
                                        + [1] * (turns[2]["end"] - turns[2]["start"]))
    assert with_tool.policy_versions() == [v for v in with_tool.token_versions if v >= 0]
    assert client.continuations == [with_tool.prompt_token_ids + with_tool.completion_token_ids[:turns[2]["start"]]]
    assert without.metadata["tool_calls"] == 0 and without.completion_mask == [1] * len(without.completion_token_ids)

    lines = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
    metrics = {k: v for line in lines for k, v in line.items()}
    assert metrics[mn.TOOL_CALLS_PER_SAMPLE] == 0.5 and metrics[mn.TOOL_CALL_SHARE] == 0.5
    assert metrics[mn.TOOL_ERROR_SHARE] == 0.0 and metrics[mn.TOOL_TIMEOUT_SHARE] == 0.0
    assert metrics[mn.TOOL_SECONDS_MEAN] > 0 and 0 < metrics[mn.TOOL_WAIT_SHARE] <= 1
    assert metrics[mn.ENV_TURNS_PER_SAMPLE] == 2.0  # three turns and one
    assert metrics[mn.SUCCESS_WITH_TOOL] == 1.0 and metrics[mn.SUCCESS_WITHOUT_TOOL] == 1.0
    assert metrics[mn.ENV_PREFIX_REUSE_TOKENS] == 10.0
    await actor.env.aclose()


async def test_evaluation_with_the_tool_env_records_used_tool(tiny_model: Path) -> None:
    from rl_core.evaluation.evaluator import evaluate

    config = tool_config(tiny_model)
    codec = HFTokenCodec.from_pretrained(str(tiny_model))
    client = ScriptedClient(codec, "42")
    env = MathPythonToolEnvironment(config, sandbox=FakeSandbox())
    runner = TrajectoryRunner(env, codec)

    async def continue_turn(prompt: list[int], sampling: SamplingParams) -> GenerationResult:
        return (await client.generate([], sampling, 1, prompt_token_ids=prompt))[0]

    problem = Problem(id="p42", problem="Compute 6 * 7.", answer="42")
    report = await evaluate("heldout", client.generate, k=2, problems=[problem], sampling=SamplingParams(max_new_tokens=64),
                            runner=runner, continue_turn=continue_turn, env=env)
    (result,) = report.results
    assert result.samples_used_tool == [True, False] and result.verdicts == [True, True]
    line = result.to_json()
    assert line["used_tool"] is True and "```output\n42\n```" in line["samples"][0]
    plain = await evaluate("heldout", client.generate, k=2, problems=[problem], sampling=SamplingParams(max_new_tokens=64))
    assert "used_tool" not in plain.results[0].to_json()  # a single-turn evaluation does not record it


# --- custom envs -----------------------------------------------------------------------------


def custom_config(class_path: str) -> RunConfig:
    return RunConfig.model_validate({"task": {"heldout_size": 4}, "env": {"name": "custom", "class_path": class_path}})


def test_example_custom_env_loads_from_an_allowed_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_ROOTS_VARIABLE, os.pathsep.join(["/nonexistent-root", str(EXAMPLE_ROOT)]))
    config = custom_config("integer_answer_env:IntegerAnswerEnvironment")
    assert class_path_error(config) is None
    env = load_environment(config)
    assert type(env).__name__ == "IntegerAnswerEnvironment" and env.task.train
    problem = Problem(id="p", problem="Compute 6 * 7.", answer="42")
    assert [r.reward for r in env.score(problem, ["\\boxed{42}", "\\boxed{42.0}", "\\boxed{41}"])] == [1.0, 0.0, 0.0]


def test_custom_env_outside_the_allowed_roots_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from rl_core.launch.launcher import LaunchError, validate_inputs

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "sneaky_env.py").write_text("from rl_core.envs.environments import MathEnvironment\n"
                                           "class Sneaky(MathEnvironment):\n    pass\n")
    config = custom_config("sneaky_env:Sneaky")
    monkeypatch.delenv(ENV_ROOTS_VARIABLE, raising=False)
    assert "INFLIGHT_ENV_ROOTS is not set" in (class_path_error(config) or "")
    monkeypatch.setenv(ENV_ROOTS_VARIABLE, str(EXAMPLE_ROOT))
    assert "not in the allowed env folders" in (class_path_error(config) or "")
    # A module that exists (rl_core's own) but not under a root is refused too, as is a non-Environment.
    assert "not in the allowed env folders" in (class_path_error(custom_config("rl_core.envs.environments:MathEnvironment")) or "")
    assert "not an Environment subclass" in (class_path_error(custom_config("integer_answer_env:__name__")) or "")
    with pytest.raises(LaunchError, match="env.class_path"):
        validate_inputs(config)
    # A link inside a root that points outside it is not a way in.
    root = tmp_path / "root"
    root.mkdir()
    (root / "linked_env.py").symlink_to(outside / "sneaky_env.py")
    monkeypatch.setenv(ENV_ROOTS_VARIABLE, str(root))
    assert "not in the allowed env folders" in (class_path_error(custom_config("linked_env:Sneaky")) or "")


# --- the server's token prompts (a trajectory's next turn) -----------------------------------


def test_server_takes_a_token_prompt_and_continues_exactly(tiny_model: Path) -> None:
    """A greedy response cut after k tokens and sent back as a token prompt continues with the
    same tokens (no template, no re-tokenisation); a body with both or neither prompt is refused."""
    from engine_kinds import start_server  # tests/rl_core is on sys.path (rootdir-relative test modules)
    from rl_core.inference.client import InferenceClient, ServerError

    server = start_server("reference", tiny_model, max_batch_size=4)
    try:
        async def exchange() -> None:
            async with InferenceClient(server.url) as client:
                greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
                (whole,) = await client.generate([{"role": "user", "content": "Compute 6 + 7."}], greedy)
                cut = len(whole.token_ids) // 2
                prompt = whole.prompt_token_ids + whole.token_ids[:cut]
                (rest,) = await client.generate([], SamplingParams(temperature=0.0, max_new_tokens=16 - cut),
                                                prompt_token_ids=prompt)
                assert rest.prompt_token_ids == prompt and rest.token_ids == whole.token_ids[cut:]
                with pytest.raises(ServerError, match="messages: give either messages or prompt_token_ids"):
                    await client.generate([{"role": "user", "content": "x"}], greedy, prompt_token_ids=[1, 2])
                with pytest.raises(ServerError, match="messages: give either"):
                    await client.generate([], greedy)
                with pytest.raises(ServerError, match="outside the vocabulary"):
                    await client.generate([], greedy, prompt_token_ids=[10**7])
                assert "prompt_tokens_shared" in (await client.health())["counters"]

        asyncio.run(asyncio.wait_for(exchange(), 120))
    finally:
        server.stop()


async def test_benchmarks_of_a_tool_run_let_the_policy_use_its_tool(tiny_model: Path, tmp_path: Path) -> None:
    from rl_core.config.run_config import EvalConfig
    from rl_core.evaluation.evaluator import run_benchmarks

    codec = HFTokenCodec.from_pretrained(str(tiny_model))
    client = ScriptedClient(codec, "42")
    runner = TrajectoryRunner(MathPythonToolEnvironment(tool_config(tiny_model), sandbox=FakeSandbox()), codec)

    async def continue_turn(prompt: list[int], sampling: SamplingParams) -> GenerationResult:
        return (await client.generate([], sampling, 1, prompt_token_ids=prompt))[0]

    await run_benchmarks(EvalConfig(benchmarks=["synthetic"], k={"synthetic": 2}, max_problems=2), client.generate, step=3,
                         run_dir=tmp_path, sampling=SamplingParams(max_new_tokens=64), runner=runner, continue_turn=continue_turn)
    rows = [json.loads(line) for line in (tmp_path / "eval" / "step_000003_synthetic.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(row["samples_used_tool"] == [True, False] for row in rows)
    assert len(client.continuations) == 2  # each problem's first sample called the tool and went on
