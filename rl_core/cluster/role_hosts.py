"""Where the launcher's children run: the one interface behind which a run is placed.

`LocalHost` starts them as child processes of the launcher on this node (today's single-node
run); `ray_placement.RayHost` starts the same commands on the nodes of a Ray cluster. The
launcher (`launch/launcher.py`) builds the commands and supervises the processes the same way for
both: a host hands back something shaped like `subprocess.Popen` (poll, wait, send_signal,
kill, pid, returncode).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import IO, Any, Protocol

from rl_core.common.processes import die_with_parent, free_port

LOCALHOST = "127.0.0.1"


class RoleHost(Protocol):
    remote: bool  # roles on other machines: the launcher then advertises addresses and guards against lost nodes

    def summary(self) -> str:
        """Which role runs where, for the run log ("" for one node)."""
        ...

    def address(self, name: str) -> str:
        """The address role `name` listens on and the other roles reach it at."""
        ...

    def free_port(self, name: str) -> int:
        """A TCP port free now on the node of role `name`."""
        ...

    def start(self, name: str, command: list[str], env: dict[str, str], log_file: Path) -> Any:
        """Start role `name`; its stdout and stderr are appended to `log_file`."""
        ...

    def close(self) -> None: ...


class LocalHost:
    """Every role a child process of the launcher, on this node."""

    remote = False

    def summary(self) -> str:
        return ""

    def address(self, name: str) -> str:
        return LOCALHOST

    def free_port(self, name: str) -> int:
        return free_port(LOCALHOST)

    def start(self, name: str, command: list[str], env: dict[str, str], log_file: Path) -> subprocess.Popen:
        log: IO[bytes] = open(log_file, "ab")
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", **env)
        # Ctrl-C reaches the whole foreground group; the launcher alone decides how to stop.
        command = die_with_parent(command, ignore_sigint=True)
        try:
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=full_env)
        finally:
            log.close()

    def close(self) -> None:
        pass
