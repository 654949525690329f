"""Environments: what a sample is and how it is scored (`env.name` in the run config).

An `Environment` answers four questions, and nothing else:

- `problems(split)`: the problems of `"train"` or `"heldout"` (its `task` is the actor's `TaskData`);
- `first_messages(problem)`: the chat messages a trajectory starts from;
- `on_model_turn(text, tool_calls)`: a model turn's text is either a tool call (`ToolCall`: the code
  to run and where in the text the call ends, so what the model wrote after it is dropped) or
  final (None); `run_tool(call)` runs it and `tool_output_text(call, result)` is what the policy
  reads back as the tool turn; `stop_texts(tool_calls)` (optional) are the texts where a call may
  end, so a turn stops there instead of decoding past its call (one that ends no call goes on);
- `score(problem, texts)`: the rewards of finished trajectories, from the text the *model* wrote
  (tool output never counts: a printed `\\boxed{}` is not an answer).

`MathEnvironment` is today's single turn: `envs/problems.py` prompts, `envs/rewards.py` math-verify.
`MathPythonToolEnvironment` lets the policy run Python: a fenced ```python block (or
`<tool_call>` tags where the chat template uses them, as Qwen2.5's does) is run in the sandbox
(`envs/sandbox.py`, limits from `env.tool_*`) and its output appended as a tool turn, at most
`env.max_turns` times; the final `\\boxed{}` answer is verified as in `math`. The turn loop itself
(token budget, masks, versions) is `envs/trajectories.py`, shared by the actor and the evaluator.

A `custom` env (`env.class_path`, `package.module:Class`) is loaded only from a folder the operator
lists in `INFLIGHT_ENV_ROOTS` (os.pathsep-separated, like PATH): the class is code that runs in
the actor, so a submitter may only name what the operator placed there. `class_path_error` is the
check the launcher and the platform's submit both run; `load_environment` loads through it.
Torch-free: the platform imports this module to refuse a submit.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from rl_core.config.env import EnvConfig
    from rl_core.config.run_config import RunConfig
    from rl_core.envs.problems import Problem, TaskData
    from rl_core.envs.rewards import RewardResult
    from rl_core.envs.sandbox import Sandbox, SandboxLimits, ToolResult

ENV_ROOTS_VARIABLE = "INFLIGHT_ENV_ROOTS"
Split = Literal["train", "heldout"]
ToolFormat = Literal["fenced", "tool_call"]

# The policy's call and its answer, fenced (ToRA-style: the output block follows the code block in
# the same assistant turn) or in the tags of a chat template that declares tools (Qwen2.5's).
FENCED_CALL = re.compile(r"```python[ \t]*\n(.*?)```", re.DOTALL)
TAGGED_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """A tool call found in a model turn: the code, and the character offset in the turn's text
    where the call ends (the model's text after it is not kept: the tool's output goes there)."""

    code: str
    end: int


class Environment:
    """The interface every environment implements (module docstring). `multi_turn` says whether
    the actor runs trajectories (`envs/trajectories.py`) or today's one response per sample."""

    name: str = "environment"
    multi_turn: bool = False

    def __init__(self, config: RunConfig) -> None:
        from rl_core.envs.problems import load_task

        self.config = config
        # The prompt is `task.system_prompt` as the user set it: a policy is best told of the tool
        # there (examples/tiny-cpu-tools.yaml), but a warm start trained on another prompt is not
        # silently given a new one.
        self.task: TaskData = load_task(config.task)

    def problems(self, split: Split) -> list[Problem]:
        return self.task.train if split == "train" else self.task.heldout

    def first_messages(self, problem: Problem) -> list[dict[str, str]]:
        return self.task.messages(problem)

    def on_model_turn(self, text: str, tool_calls: int) -> ToolCall | None:
        """None: the turn is final. `tool_calls`: calls this trajectory has made so far."""
        return None

    def stop_texts(self, tool_calls: int) -> list[str]:
        """Texts at which a model turn is stopped (`SamplingParams.stop`) after `tool_calls` calls:
        where a call may end. The trajectory runner goes on with the turn where one ends no call
        (a fence that opens one). None (the default): every turn runs to its end."""
        return []

    async def run_tool(self, call: ToolCall) -> ToolResult:
        raise NotImplementedError(f"{self.name} has no tool")

    def tool_output_text(self, call: ToolCall, result: ToolResult) -> str:
        raise NotImplementedError(f"{self.name} has no tool")

    def score(self, problem: Problem, texts: list[str]) -> list[RewardResult]:
        """Rewards of finished trajectories of `problem`; `texts`: what the model wrote in each
        (its turns joined, tool output left out). Blocking: callers run it in a thread."""
        from rl_core.envs.rewards import score_many

        return score_many([(text, problem.answer) for text in texts], self.config.task.reward_timeout_s)

    async def aclose(self) -> None:
        """Release what the env holds (a sandbox's processes)."""


class MathEnvironment(Environment):
    """Today's single turn: one response, the last `\\boxed{}` verified by math-verify."""

    name = "math"


class MathPythonToolEnvironment(MathEnvironment):
    """Math with a Python tool (module docstring). `chat_template`: the tokenizer's; tags are used
    where it speaks of `<tool_call>`, fences otherwise."""

    name = "math_python_tool"
    multi_turn = True

    def __init__(self, config: RunConfig, chat_template: str | None = None, sandbox: Sandbox | None = None) -> None:
        super().__init__(config)
        self.env: EnvConfig = config.env
        self.format: ToolFormat = "tool_call" if chat_template and "<tool_call>" in chat_template else "fenced"
        self._sandbox = sandbox

    @property
    def sandbox(self) -> Sandbox:
        if self._sandbox is None:
            from rl_core.envs.sandbox import ProcessSandbox

            self._sandbox = ProcessSandbox()
        return self._sandbox

    def limits(self) -> SandboxLimits:
        from rl_core.envs.sandbox import SandboxLimits

        # CPU seconds follow the wall limit: a call can use no more CPU than it has time for.
        return SandboxLimits(wall_s=self.env.tool_wall_s, cpu_s=max(1, int(self.env.tool_wall_s + 0.999)),
                             memory_mb=self.env.tool_memory_mb, output_bytes=self.env.tool_output_bytes)

    def stop_texts(self, tool_calls: int) -> list[str]:
        if tool_calls >= self.env.max_turns:
            return []  # the answer turn: nothing to stop for
        # A fence both opens and closes a block: the runner goes on after the opening one.
        return ["```"] if self.format == "fenced" else ["</tool_call>"]

    def on_model_turn(self, text: str, tool_calls: int) -> ToolCall | None:
        if tool_calls >= self.env.max_turns:
            return None  # out of calls: this turn is the answer, whatever it contains
        if self.format == "fenced":
            match = FENCED_CALL.search(text)
            return None if match is None else ToolCall(code=match.group(1), end=match.end())
        match = TAGGED_CALL.search(text)
        if match is None:
            return None
        return ToolCall(code=tagged_code(match.group(1)), end=match.end())

    async def run_tool(self, call: ToolCall) -> ToolResult:
        return await self.sandbox.run(call.code, self.limits())

    def tool_output_text(self, call: ToolCall, result: ToolResult) -> str:
        body = tool_output_body(result)
        if self.format == "fenced":
            return f"\n```output\n{body}\n```\n"
        return f"\n<tool_response>\n{body}\n</tool_response>\n"

    async def aclose(self) -> None:
        close = getattr(self._sandbox, "aclose", None)
        if close is not None:
            await close()


def tagged_code(payload: str) -> str:
    """The code of a `<tool_call>` payload: Qwen's JSON (`{"name": ..., "arguments": {"code": ...}}`)
    or, failing that, the payload itself as code (a policy that skips the JSON still gets run)."""
    try:
        data = json.loads(payload)
    except ValueError:
        return payload.strip()
    if isinstance(data, dict):
        arguments = data.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return arguments
        if isinstance(arguments, dict) and isinstance(arguments.get("code"), str):
            return arguments["code"]
    return payload.strip()


def tool_output_body(result: ToolResult) -> str:
    """What the policy reads of a call: stdout, then stderr, then why it ended if not plainly."""
    parts = [result.stdout.rstrip("\n")] if result.stdout else []
    if result.stderr:
        parts.append(result.stderr.rstrip("\n"))
    if result.status == "timeout":
        parts.append("[timed out]")
    elif result.status == "output_limit":
        parts.append("[output truncated]")
    elif result.status == "refused":
        parts.append("[refused]")
    return "\n".join(parts)


# --- custom environments --------------------------------------------------------------


def env_roots() -> list[Path]:
    """The folders custom envs may be loaded from (`INFLIGHT_ENV_ROOTS`, os.pathsep-separated; none
    when unset), resolved: a root that is a link names the folder it points to."""
    value = os.environ.get(ENV_ROOTS_VARIABLE, "")
    return [Path(os.path.realpath(item)) for item in value.split(os.pathsep) if item.strip()]


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _module_file(module: str, root: Path) -> Path | None:
    """The file `module` would be imported from with `root` first on sys.path, if it lies under it."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            real = Path(os.path.realpath(candidate))
            return real if _under(real, root) else None
    return None


def _locate(class_path: str) -> tuple[Path, str, str] | str:
    """(root, module, class name) of `class_path`, or why it cannot be loaded."""
    module, _, name = class_path.partition(":")
    roots = env_roots()
    if not roots:
        return f"custom environments are not allowed here ({ENV_ROOTS_VARIABLE} is not set)"
    for root in roots:
        if _module_file(module, root) is not None:
            return root, module, name
    return f"module {module!r} is not in the allowed env folders ({os.pathsep.join(str(root) for root in roots)})"


def load_environment_class(class_path: str) -> type[Environment]:
    """The class `class_path` names, imported from its env root; ValueError saying why not. A module
    of that name already imported from elsewhere (an installed package) is refused, not reused."""
    located = _locate(class_path)
    if isinstance(located, str):
        raise ValueError(located)
    root, module, name = located
    top = module.split(".")[0]
    loaded = sys.modules.get(top)
    if loaded is not None and not _under(Path(os.path.realpath(getattr(loaded, "__file__", None) or "/")), root):
        raise ValueError(f"module {top!r} is already imported from outside the allowed env folders")
    sys.path.insert(0, str(root))
    try:
        imported = importlib.import_module(module)
    except Exception as exc:  # the user's module failed: say how, naming it
        raise ValueError(f"module {module!r} failed to import: {exc!r}") from exc
    finally:
        sys.path.remove(str(root))
    where = Path(os.path.realpath(getattr(imported, "__file__", None) or "/"))
    if not _under(where, root):
        raise ValueError(f"module {module!r} was imported from {where}, outside the allowed env folders")
    cls = getattr(imported, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise ValueError(f"{class_path!r} is not an Environment subclass (rl_core.envs.environments.Environment)")
    return cls


def class_path_error(config: RunConfig) -> str | None:
    """Why `env.class_path` cannot be used (None when it can, or the env is not custom): the
    launcher's and the platform submit's one check, so both refuse alike, naming the field."""
    if config.env.name != "custom" or config.env.class_path is None:
        return None
    try:
        load_environment_class(config.env.class_path)
    except ValueError as exc:
        return str(exc)
    return None


def load_environment(config: RunConfig, chat_template: str | None = None, sandbox: Sandbox | None = None) -> Environment:
    """The run's environment, from `env.name`. `chat_template`: the tokenizer's (the tool format)."""
    if config.env.name == "math":
        return MathEnvironment(config)
    if config.env.name == "math_python_tool":
        return MathPythonToolEnvironment(config, chat_template=chat_template, sandbox=sandbox)
    assert config.env.class_path is not None  # EnvConfig refuses a custom env without one
    return load_environment_class(config.env.class_path)(config)
