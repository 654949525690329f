"""A run's CPU roles forked from a warm interpreter (rl_core/launch/role_forks.py) start as a fresh
`python -m` would: their own argv, environment, log and start method; Popen's exit codes; and
they die with a killed launcher. The stand-in role is tests/rl_core/forked_role_probe.py; the fork
server preloads nothing here, so each test takes about a second."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from rl_core.cluster.role_hosts import LocalHost
from rl_core.launch.role_forks import RoleForks, fork_roles_enabled, model_modules

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only")
PROBE = [sys.executable, "-m", "tests.rl_core.forked_role_probe"]


def probe_forks() -> RoleForks:
    forks = RoleForks(preload=[], modules=("tests",))
    forks.warm()
    return forks


def test_a_forked_role_gets_its_argv_environment_log_and_exit_code(tmp_path: Path) -> None:
    host = LocalHost(probe_forks())
    log = tmp_path / "probe.log"
    os.environ["LAUNCHER_ONLY"] = "set after the fork server started"
    try:
        role = host.start("actor", [*PROBE, "report", "3"], {"PROBE_ENV": "given"}, log)
    finally:
        del os.environ["LAUNCHER_ONLY"]
    assert type(role).__name__ == "ForkedRole"
    assert role.wait(60) == 3 and role.returncode == 3 and role.poll() == 3
    report, stderr = log.read_text().splitlines()
    seen = json.loads(report)
    assert seen["argv0"].endswith("forked_role_probe.py") and seen["argv"] == ["report", "3"] and seen["name"] == "__main__"
    # The environment is the launcher's at the start plus the role's own, as for a fresh child.
    assert seen["probe_env"] == "given" and seen["launcher_only"] == "set after the fork server started"
    # A fresh interpreter's multiprocessing default, not the fork server's: locks leave nothing behind.
    assert seen["start_method"] == "fork"
    assert seen["sigint_ignored"]  # Ctrl-C is the launcher's to handle
    assert stderr == "to stderr"
    # ps shows the role's command, not the fork server's.
    assert seen["cmdline"] == f"{sys.executable} -m tests.rl_core.forked_role_probe report 3"


def test_a_forked_roles_log_exists_when_start_returns_as_a_fresh_roles_does(tmp_path: Path) -> None:
    """The launcher reads a server's log for its ready line right after starting it; the fork opens
    its log only once it runs, which on a loaded machine came after that read."""
    forks = probe_forks()
    log = tmp_path / "server0.log"
    role = forks.start("server-0", [*PROBE, "report", "0"], dict(os.environ), log)
    assert log.exists()
    assert role.wait(60) == 0 and json.loads(log.read_text().splitlines()[0])["argv"] == ["report", "0"]  # appended to, not replaced


def test_a_forked_role_ends_as_popen_reports_it(tmp_path: Path) -> None:
    forks = probe_forks()
    role = forks.start("actor", [*PROBE, "sleep", "60"], dict(os.environ), tmp_path / "sleep.log")
    with pytest.raises(subprocess.TimeoutExpired):
        role.wait(0.2)
    assert role.poll() is None and role.returncode is None
    role.send_signal(signal.SIGTERM)
    assert role.wait(30) == -signal.SIGTERM
    role.kill()  # a finished role is never signalled again (its pid may be another process's now)
    lock_log = tmp_path / "lock.log"
    assert forks.start("actor", [*PROBE, "lock"], dict(os.environ), lock_log).wait(60) == 0
    assert lock_log.read_text().strip() == "None"


def test_closing_the_host_stops_and_reaps_its_fork_server(tmp_path: Path) -> None:
    host = LocalHost(probe_forks())
    assert host.start("actor", [*PROBE, "report", "0"], {}, tmp_path / "r.log").wait(60) == 0
    fork_servers = [p for p in psutil.Process().children() if "multiprocessing.forkserver" in " ".join(p.cmdline())]
    assert len(fork_servers) == 1
    host.close()
    assert not fork_servers[0].is_running()  # reaped here: its CPU and its roles' count to this process


def test_forked_roles_die_with_a_killed_launcher(tmp_path: Path) -> None:
    launcher_code = (
        "import os, sys, time; from pathlib import Path; from rl_core.launch.role_forks import RoleForks;"
        "forks = RoleForks(preload=[], modules=('tests',)); forks.warm();"
        f"role = forks.start('actor', {PROBE!r} + ['sleep', '120'], dict(os.environ), Path({str(tmp_path / 'role.log')!r}));"
        "print(role.pid, flush=True); time.sleep(120)"
    )
    launcher = subprocess.Popen([sys.executable, "-c", launcher_code], stdout=subprocess.PIPE, text=True,
                                cwd=Path(__file__).resolve().parents[2])
    assert launcher.stdout is not None
    role_pid = int(launcher.stdout.readline())
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{role_pid}/stat")
        if not stat.exists() or stat.read_text().split(")")[-1].split()[0] == "Z":
            return
        time.sleep(0.1)
    os.kill(role_pid, signal.SIGKILL)
    pytest.fail("a forked role outlived its killed launcher")


def test_only_this_interpreters_cpu_roles_are_forked() -> None:
    forks = RoleForks(preload=[])
    rl_core = [sys.executable, "-m", "rl_core"]
    assert forks.can_fork("server0", [*rl_core, "serve"], {"CUDA_VISIBLE_DEVICES": ""})
    assert forks.can_fork("trainer", [*rl_core, "trainer"], {"CUDA_VISIBLE_DEVICES": ""})
    assert forks.can_fork("actor", [*rl_core, "actor"], {"CUDA_VISIBLE_DEVICES": "0"})  # it never uses one
    assert not forks.can_fork("server0", [*rl_core, "serve"], {"CUDA_VISIBLE_DEVICES": "0"})  # CUDA after fork: no
    assert not forks.can_fork("trainer", [*rl_core, "trainer"], {})  # every GPU visible
    assert not forks.can_fork("server0", ["/opt/vllm-venv/bin/python", "-m", "rl_core", "serve"], {"CUDA_VISIBLE_DEVICES": ""})
    assert not forks.can_fork("actor", [sys.executable, "-m", "somethingelse"], {})
    assert fork_roles_enabled({}) and not fork_roles_enabled({"INFLIGHT_FORK_ROLES": "0"})


def test_the_fork_server_also_imports_the_models_classes(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    assert model_modules(tmp_path) == ["transformers.models.qwen2.modeling_qwen2"]
    assert model_modules(tmp_path / "missing") == []
    assert RoleForks(tmp_path).preload[-1] == "transformers.models.qwen2.modeling_qwen2"
