"""Roles forked from one warm interpreter: a run's CPU roles start without importing torch again.

A role is `python -m rl_core <role> ...`; started fresh, the server and the trainer each spend
~7 CPU-s importing torch, transformers and the model's classes before their first useful line
(~12 of a smoke demo run's ~23 CPU-s, bench/RESULTS.md). With `RoleForks` those modules are
imported once, by the Python standard library's fork server (`multiprocessing` "forkserver"
context, `set_forkserver_preload`), started early by the launcher while it validates the run;
each role is then a fork of it that runs its `python -m rl_core ...` as a fresh interpreter
would (runpy), with the role's environment, its log as stdout and stderr, and SIGTERM when
the fork server (which exits with the launcher) dies. The launcher's handle is `ForkedRole`, the
part of `subprocess.Popen` it reads (role_hosts.RoleProcess).

Only roles that can see no GPU are forked (their environment says `CUDA_VISIBLE_DEVICES=""`, or
the role is the actor, which never uses one): CUDA cannot be used in a child forked from a
process that initialised it, and the fork server hides every GPU from itself so that nothing in it
can. Commands that are not this interpreter's `-m rl_core` (vLLM's server in its own virtualenv)
start fresh as before. `INFLIGHT_FORK_ROLES=0` starts every role fresh (a switch of operations,
not of the experiment: a role behaves the same either way, so the run config does not carry it).
"""

from __future__ import annotations

import atexit
import json
import multiprocessing
import os
import random
import runpy
import signal
import subprocess
import sys
from multiprocessing import forkserver
from pathlib import Path

import setproctitle

from rl_core.common.processes import output_to_log, set_parent_death_signal

FORK_ROLES_ENV = "INFLIGHT_FORK_ROLES"
# What every forked role would import itself: torch, transformers' model and tokenizer loading,
# and each role's entry module (which import the rest of rl_core they run).
WARM_MODULES = (
    "rl_core.launch.warm_roles",  # first: hides the GPUs from the fork server before torch loads
    "torch",
    "transformers",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "rl_core.inference.server",
    "rl_core.trainer.loop",
    "rl_core.actor.main",
    "rl_core.launch.role_forks",  # run_role, what each fork runs first
)
NO_GPU_ROLES = frozenset({"actor"})  # roles that never touch a GPU whatever the placement


def fork_roles_enabled(environ: dict[str, str] | None = None) -> bool:
    return (environ if environ is not None else os.environ).get(FORK_ROLES_ENV, "1") != "0"


def model_modules(model_path: str | Path) -> list[str]:
    """The transformers module defining the model's classes (from its config.json's
    `model_type`), so that the fork server imports it too; [] when it cannot be read."""
    try:
        model_type = json.loads((Path(model_path) / "config.json").read_text())["model_type"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    name = str(model_type).replace("-", "_")
    return [f"transformers.models.{name}.modeling_{name}"] if name.isidentifier() else []


class ForkedRole:
    """A role forked by the fork server: what the launcher reads of `subprocess.Popen`."""

    def __init__(self, name: str, process: multiprocessing.process.BaseProcess) -> None:
        self.name = name
        self._process = process

    @property
    def pid(self) -> int:
        assert self._process.pid is not None  # started in RoleForks.start
        return self._process.pid

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode  # negative: the signal that ended it, as Popen says it

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(self.name, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self._process.exitcode is None:  # never signal a pid that may have been reused
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class RoleForks:
    """The run's fork server: `warm()` starts it importing WARM_MODULES (returns at once); a role
    that `can_fork` is started by `start`. One per launcher process (the standard library keeps
    one fork server per process, with the preload it was first started with)."""

    def __init__(self, model_path: str | Path | None = None, python: str = sys.executable,
                 preload: list[str] | None = None, modules: tuple[str, ...] = ("rl_core",)) -> None:
        self.python = python
        self.preload = [*(WARM_MODULES if preload is None else preload),
                        *(model_modules(model_path) if model_path is not None else [])]
        self.modules = modules  # the packages whose `python -m` commands are forked
        self.context = multiprocessing.get_context("forkserver")

    def warm(self) -> None:
        self.context.set_forkserver_preload(self.preload)
        forkserver.ensure_running()

    def close(self) -> None:
        """Stop the fork server and wait for it (once the roles have ended): its CPU and its roles'
        are then counted to the launcher, as a fresh role's are (getrusage's children)."""
        forkserver._forkserver._stop()  # type: ignore[attr-defined]  # the standard library's own stop (its tests use it)

    def can_fork(self, name: str, command: list[str], env: dict[str, str]) -> bool:
        """`command` is this interpreter's `-m` of one of `modules`, and the role can see no GPU."""
        if command[:2] != [self.python, "-m"] or len(command) < 3 or command[2].split(".")[0] not in self.modules:
            return False
        return name in NO_GPU_ROLES or env.get("CUDA_VISIBLE_DEVICES") == ""

    def start(self, name: str, command: list[str], env: dict[str, str], log_file: Path) -> ForkedRole:
        """Role `name` (`command`: `python -m MODULE ARGS`) forked with `env` as its whole
        environment, stdout and stderr appended to `log_file`. Raises RoleForkError when the
        fork server cannot start it (the caller starts the role fresh instead)."""
        # The log exists once this returns, as a fresh role's does (the launcher opens that one before
        # Popen): the launcher reads it at once for the server's ready line, and the fork opens it
        # only when it runs — on a loaded machine after that first read ("launcher error:
        # FileNotFoundError", three times in full test runs, 2026-11-29).
        Path(log_file).touch()
        process = self.context.Process(target=run_role, args=(command[2], command[3:], env, str(log_file)), name=name)
        try:
            process.start()
        except (OSError, EOFError) as exc:  # the fork server died, or never came up
            raise RoleForkError(f"the fork server could not start {name}: {exc!r}") from exc
        return ForkedRole(name, process)


class RoleForkError(OSError):
    pass


def run_role(module: str, argv: list[str], env: dict[str, str], log_file: str) -> None:
    """In the forked child: become `python -m MODULE ARGV` as a fresh interpreter would be."""
    # The standard library hands every fork the write end of the pipe whose EOF tells the fork
    # server that the launcher is gone (so that forks could use the server themselves). A role
    # holding it would keep the fork server, and with it the role, alive after a killed launcher.
    alive_fd = forkserver._forkserver._forkserver_alive_fd  # type: ignore[attr-defined]
    if alive_fd is not None:
        os.close(alive_fd)
        forkserver._forkserver._forkserver_alive_fd = None  # type: ignore[attr-defined]
    set_parent_death_signal(os.getppid())  # the fork server, which exits with the launcher
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the group; the launcher decides
    output_to_log(log_file)  # unbuffered, as the launcher gives a fresh role PYTHONUNBUFFERED=1
    # Before the environment is replaced: setproctitle finds the room it may write in from it.
    # `ps` and /proc/PID/cmdline show the role's own command, as for a fresh one, not the fork server's.
    setproctitle.setproctitle(" ".join([sys.executable, "-m", module, *argv]))
    setproctitle.setthreadtitle(Path(sys.executable).name[:15])  # its name (comm) stays "python"
    os.environ.clear()
    os.environ.update(env)
    random.seed()  # the fork server's state is every fork's: reseed as a fresh interpreter is seeded
    # multiprocessing set this process's start method to "forkserver"; a fresh interpreter has the
    # platform's default (its locks, e.g. tqdm's, are then unnamed and leave nothing behind).
    multiprocessing.set_start_method(None, force=True)
    sys.argv = [module, *argv]  # runpy puts the module's file first, as `python -m` does
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    finally:
        atexit._run_exitfuncs()  # multiprocessing ends a child with os._exit: run what Python's exit would
