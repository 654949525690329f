"""The small Ray actor that runs the commands of one node's roles (`NodeRoles`), for
`ray_placement.RayHost`: one per node of a run, not one per role, because each is a Ray worker
process of its own that starts (Python, Ray) while the run waits.

A module of its own, importing nothing but the standard library, Ray and `rl_core.common.processes`:
every node's actor imports it in a fresh Ray worker process while the run starts, so whatever
it imported (the run config's pydantic models, torch) would delay every role's start.
"""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from pathlib import Path

import ray

from rl_core.common.processes import die_with_parent, free_port


class _Role:
    """One role's process on this node and what the actor knows of it."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.returncode: int | None = None
        self.started = threading.Event()
        self.done = threading.Event()
        self.error: str | None = None


class NodeRoles:
    """Runs the roles of one node; a threaded Ray actor (a role's blocking `wait` must not hold up
    the others' or a `signal`: `ray_placement` gives it a thread per role and a few more). Each
    child is started from a thread that lives exactly as long as the child: PR_SET_PDEATHSIG
    (`processes.die_with_parent`) fires when that *thread* ends, so the child gets SIGTERM if
    this actor's process dies (its node's raylet gone, the launcher gone), and only then."""

    def __init__(self) -> None:
        self.roles: dict[str, _Role] = {}

    def node(self) -> dict[str, str]:
        return {"address": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(),
                "hostname": socket.gethostname()}

    def free_port(self, host: str) -> int:
        return free_port(host)

    def start(self, name: str, command: list[str], env: dict[str, str], log_file: str, cwd: str,
              gpus: tuple[int, int] = (0, 0)) -> int:
        """Start role `name`; it gets `gpus` = (first, count) of the GPUs Ray gave this actor."""
        # The Ray worker's own RAY_* variables (the token among them) stay out of the role's
        # environment; Ray chose this actor's GPUs (the role gets its share as
        # CUDA_VISIBLE_DEVICES), the rest is the launcher's.
        child_env = {key: value for key, value in os.environ.items() if not key.startswith("RAY_")}
        child_env.update(env)
        first, count = gpus
        child_env["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in ray.get_gpu_ids()[first:first + count])
        child_env["PYTHONUNBUFFERED"] = "1"
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        workdir = cwd if os.path.isdir(cwd) else str(Path(log_file).parent)
        role = self.roles[name] = _Role()

        def keeper() -> None:
            try:
                with open(log_file, "ab") as log:
                    # Its own session: a stop reaches the role's own children too (vLLM workers).
                    role.process = subprocess.Popen(die_with_parent(command, ignore_sigint=True), stdin=subprocess.DEVNULL,
                                                    stdout=log, stderr=subprocess.STDOUT, env=child_env, cwd=workdir,
                                                    start_new_session=True)
            except OSError as exc:
                role.error = f"cannot start {command[0]}: {exc}"
                role.returncode = 127
                role.started.set()
                role.done.set()
                return
            role.started.set()
            role.returncode = role.process.wait()
            role.done.set()

        threading.Thread(target=keeper, daemon=True).start()
        role.started.wait()
        if role.error:
            raise RuntimeError(role.error)
        assert role.process is not None
        return role.process.pid

    def wait(self, name: str) -> int:
        role = self.roles[name]
        role.done.wait()
        assert role.returncode is not None
        return role.returncode

    def ping(self) -> bool:
        return True

    def system_sample(self) -> dict[str, float]:
        """This node's CPU, memory and GPU use (`system_metrics.SystemSampler`, kept between calls)."""
        from rl_core.common.system_metrics import SystemSampler

        if not hasattr(self, "_sampler"):
            self._sampler = SystemSampler()
        return self._sampler.sample()

    def signal(self, name: str, signum: int) -> None:
        role = self.roles.get(name)
        if role is None or role.process is None or role.returncode is not None:
            return
        try:
            os.killpg(role.process.pid, signum)
        except ProcessLookupError:
            pass
