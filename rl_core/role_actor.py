"""The small Ray actor that runs one role's command on its node (`RoleProcess`), for
`ray_placement.RayHost`.

A module of its own, importing nothing but the standard library, Ray and `rl_core.processes`:
every role's actor imports it in a fresh Ray worker process while the run starts, so whatever
it imported (the run config's pydantic models, torch) would delay every role's start.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import ray

from rl_core.processes import die_with_parent


class RoleProcess:
    """Runs one role's command on its node; a threaded Ray actor (a blocking `wait` must not
    hold up `signal`). The child is started from a thread that lives exactly as long as the
    child: PR_SET_PDEATHSIG (`processes.die_with_parent`) fires when that *thread* ends, so the
    child gets SIGTERM if this actor's process dies (its node's raylet gone, the launcher gone),
    and only then."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.returncode: int | None = None
        self._started = threading.Event()
        self._done = threading.Event()
        self._error: str | None = None

    def node(self) -> dict[str, str]:
        return {"address": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(),
                "hostname": socket.gethostname()}

    def free_port(self, host: str) -> int:
        from rl_core.processes import free_port

        return free_port(host)

    def start(self, command: list[str], env: dict[str, str], log_file: str, cwd: str) -> int:
        # The Ray worker's own RAY_* variables (the token among them) stay out of the role's
        # environment; Ray chose this actor's GPUs (CUDA_VISIBLE_DEVICES), the rest is the launcher's.
        child_env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
        child_env.update(env)
        child_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in ray.get_gpu_ids())
        child_env["PYTHONUNBUFFERED"] = "1"
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        workdir = cwd if os.path.isdir(cwd) else str(Path(log_file).parent)

        def keeper() -> None:
            try:
                with open(log_file, "ab") as log:
                    # Its own session: a stop reaches the role's own children too (vLLM workers).
                    self.process = subprocess.Popen(die_with_parent(command, ignore_sigint=True), stdin=subprocess.DEVNULL,
                                                    stdout=log, stderr=subprocess.STDOUT, env=child_env, cwd=workdir,
                                                    start_new_session=True)
            except OSError as exc:
                self._error = f"cannot start {command[0]}: {exc}"
                self.returncode = 127
                self._started.set()
                self._done.set()
                return
            self._started.set()
            self.returncode = self.process.wait()
            self._done.set()

        threading.Thread(target=keeper, daemon=True).start()
        self._started.wait()
        if self._error:
            raise RuntimeError(self._error)
        assert self.process is not None
        return self.process.pid

    def wait(self) -> int:
        self._done.wait()
        assert self.returncode is not None
        return self.returncode

    def ping(self) -> bool:
        return True

    def system_sample(self) -> dict[str, float]:
        """This node's CPU, memory and GPU use (`system_metrics.SystemSampler`, kept between calls)."""
        from rl_core.system_metrics import SystemSampler

        if not hasattr(self, "_sampler"):
            self._sampler = SystemSampler()
        return self._sampler.sample()

    def signal(self, signum: int) -> None:
        if self.process is None or self.returncode is not None:
            return
        try:
            os.killpg(self.process.pid, signum)
        except ProcessLookupError:
            pass
