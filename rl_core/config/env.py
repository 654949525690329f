"""The run config's `env` section: what a sample is (one scored response, or a multi-turn
trajectory with a Python tool, or an operator-allowed class). Its own module, as the `cluster`
section is: `rl_core/envs/environments.py` builds the environment from it."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from rl_core.config.section import ConfigSection as _Section

class EnvConfig(_Section):
    """What a sample is: one response scored by math-verify (`math`), a multi-turn trajectory in which
    the policy may run Python (`math_python_tool`), or an operator-allowed class (`custom`).
    `rl_core/envs/environments.py` builds the environment from this section."""

    name: Literal["math", "math_python_tool", "custom"] = Field(
        "math",
        description="`math`: one prompt, one response, the last \\boxed{} verified (the default). `math_python_tool`: "
        "the policy may write a ```python block (or <tool_call> tags where the chat template uses them); it is run "
        "in a sandbox and its output appended as a tool turn (context only, not trained), up to `env.max_turns` "
        "calls, then the final \\boxed{} answer is verified. `custom`: the class named by `env.class_path`.",
    )
    max_turns: int = Field(
        4, ge=0, le=64,
        description="Tool calls one trajectory may make; the model turn after the last allowed call is its final answer.",
    )
    tool_wall_s: float = Field(5.0, gt=0, le=300, description="Wall-clock limit of one tool call, seconds (the sandbox's wall_s).")
    tool_memory_mb: int = Field(512, ge=16, le=65536, description="Address-space limit of one tool call's process, MiB.")
    tool_output_bytes: int = Field(
        16384, ge=64, le=1048576,
        description="Most bytes of stdout/stderr one tool call may print; beyond it the call ends as `output_limit`.",
    )
    class_path: str | None = Field(
        None, validate_default=True,
        description="For `custom`: `package.module:Class`, an Environment subclass loaded only from a folder the "
        "operator lists in INFLIGHT_ENV_ROOTS (os.pathsep-separated); refused at submit when it cannot be "
        "imported or lies outside those folders.",
    )

    @field_validator("class_path")
    @classmethod
    def _class_path_shape(cls, value: str | None, info: ValidationInfo) -> str | None:
        # Only the shape here (RunConfig stays import-free); where it lives and whether it imports
        # is checked by the launcher and the platform (`environments.class_path_error`).
        # validate_default: a `custom` env without a class is refused under this field's name.
        name = info.data.get("name")
        if value is None:
            if name == "custom":
                raise ValueError("required when env.name is 'custom' (package.module:Class)")
            return value
        if name != "custom":
            raise ValueError(f"only read when env.name is 'custom' (it is {name!r})")
        if not _CLASS_PATH.fullmatch(value):
            raise ValueError(f"{value!r} is not of the form package.module:Class")
        return value


_CLASS_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
