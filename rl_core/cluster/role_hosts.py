"""Where the launcher's children run: the one interface behind which a run is placed.

`LocalHost` starts them as child processes of the launcher on this node (today's single-node
run); `ray_placement.RayHost` starts the same commands on the nodes of a Ray cluster. The
launcher (`launch/launcher.py`) builds the commands and supervises the processes the same way for
every host, through `RoleHost` alone: it never asks which host it has. Everything a host may do
differently is a member here — getting the machines ready before any role starts, where a role
listens, the run's system figures, lost nodes, where a role ran — and `LocalHost` answers each
with what one node means (nothing to reserve, nothing ever lost). A third host (Slurm,
Kubernetes) is one new class with these members. A host hands back a `RoleProcess`: the part of
`subprocess.Popen` the launcher uses (poll, wait, send_signal, kill, pid, returncode).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Mapping, Protocol

from rl_core.common.processes import die_with_parent, free_port
from rl_core.rundir.layout import ClusterRecord

if TYPE_CHECKING:
    from rl_core.common.system_metrics import SystemSampler

LOCALHOST = "127.0.0.1"

# Node address -> the roles that ran there, for the nodes a host lost.
LostRoles = dict[str, list[str]]


class RoleProcess(Protocol):
    """The launcher's handle on a started role: what it reads of `subprocess.Popen`."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def send_signal(self, sig: int) -> None: ...

    def kill(self) -> None: ...


class RoleHost(Protocol):
    def prepare(self, waiting: Callable[[str | None], None], reserved: Callable[[], None]) -> str:
        """Get the run's machines ready before any role starts. `waiting(detail)` tells the run's
        status what it waits for (`waiting(None)`: nothing any more); `reserved()` is called once
        every machine is the run's, before its roles' hosts answer (the launcher starts the run's
        stream there, meanwhile). Returns what the run log says about where the roles run ("":
        nothing to say)."""
        ...

    def stream_address(self) -> str | None:
        """The address the run's own redis-server listens on for the roles (behind a password);
        None: every role is on this node, and the stream's unix socket is enough."""
        ...

    def address(self, name: str) -> str:
        """The address role `name` listens on and the other roles reach it at."""
        ...

    def listen_address(self, name: str) -> str | None:
        """The address role `name` must be told to listen on (None: its default, localhost)."""
        ...

    def free_port(self, name: str) -> int:
        """A TCP port free now on the node of role `name`."""
        ...

    def role_nodes(self, names: list[str]) -> list[int] | None:
        """The node index of each role in `names` (roles sharing a node count their local ranks
        among themselves); None: all on this node, where the placement counts them."""
        ...

    def start(self, name: str, command: list[str], env: dict[str, str], log_file: Path) -> RoleProcess:
        """Start role `name`; its stdout and stderr are appended to `log_file`."""
        ...

    def sample_system(self, sampler: SystemSampler, pids: Mapping[str, int]) -> dict[str, float]:
        """The run's system figures now (`pids`: each started role's pid on its own node)."""
        ...

    def dead_nodes(self) -> LostRoles:
        """Nodes declared dead by whoever runs them, with the roles that ran there."""
        ...

    def unresponsive_roles(self, timeout_s: float) -> LostRoles:
        """Nodes that did not answer within `timeout_s`, with their roles (asked once a role died:
        a lost node is the cause to name, not the roles that failed after it)."""
        ...

    def forget(self, lost: LostRoles) -> None:
        """Roles on lost nodes are gone with them: stopping them must not wait on a dead machine."""
        ...

    def where(self, name: str) -> str:
        """" on node <address>" for a role on another machine, "" for one on this node."""
        ...

    def lost_reason(self, name: str) -> str | None:
        """Why role `name`'s exit code is unknown (its node was lost); None: it is its own."""
        ...

    def cluster_record(self, pids: Mapping[str, int]) -> ClusterRecord | None:
        """`cluster.json`'s record of each role's node, address and pid (None: one node, none)."""
        ...

    def close(self) -> None: ...


class RoleForker(Protocol):
    """Starts some roles without a fresh interpreter (launch/role_forks.RoleForks: forked from
    one that imported torch once); `LocalHost` asks it first."""

    def can_fork(self, name: str, command: list[str], env: dict[str, str]) -> bool: ...

    def start(self, name: str, command: list[str], env: dict[str, str], log_file: Path) -> RoleProcess:
        """Raises OSError when it cannot (the role is then started fresh)."""
        ...

    def close(self) -> None:
        """Once every role it started has ended."""
        ...


class LocalHost:
    """Every role a child process of the launcher, on this node: nothing to reserve, nothing to
    lose, and the roles' own figures sampled here. With `forks`, the roles it can fork are forked
    from a warm interpreter (launch/role_forks.py); the rest start fresh."""

    def __init__(self, forks: RoleForker | None = None) -> None:
        self.forks = forks

    def prepare(self, waiting: Callable[[str | None], None], reserved: Callable[[], None]) -> str:
        reserved()  # this node is the run's already
        return ""

    def stream_address(self) -> str | None:
        return None

    def address(self, name: str) -> str:
        return LOCALHOST

    def listen_address(self, name: str) -> str | None:
        return None

    def free_port(self, name: str) -> int:
        return free_port(LOCALHOST)

    def role_nodes(self, names: list[str]) -> list[int] | None:
        return None

    def start(self, name: str, command: list[str], env: dict[str, str], log_file: Path) -> RoleProcess:
        full_env = dict(os.environ, PYTHONUNBUFFERED="1", **env)
        if self.forks is not None and self.forks.can_fork(name, command, full_env):
            try:
                return self.forks.start(name, command, full_env, log_file)
            except OSError as exc:  # no fork server: every role from now on starts fresh, as it did before
                print(f"{exc}; starting the run's roles as fresh processes", flush=True)
                self.forks = None
        log: IO[bytes] = open(log_file, "ab")
        # Ctrl-C reaches the whole foreground group; the launcher alone decides how to stop.
        command = die_with_parent(command, ignore_sigint=True)
        try:
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=full_env)
        finally:
            log.close()

    def sample_system(self, sampler: SystemSampler, pids: Mapping[str, int]) -> dict[str, float]:
        return sampler.sample(roles=dict(pids))

    def dead_nodes(self) -> LostRoles:
        return {}

    def unresponsive_roles(self, timeout_s: float) -> LostRoles:
        return {}

    def forget(self, lost: LostRoles) -> None:
        pass  # no node of a local run is ever lost: it is the launcher's own

    def where(self, name: str) -> str:
        return ""

    def lost_reason(self, name: str) -> str | None:
        return None

    def cluster_record(self, pids: Mapping[str, int]) -> ClusterRecord | None:
        return None

    def close(self) -> None:
        if self.forks is not None:
            self.forks.close()
