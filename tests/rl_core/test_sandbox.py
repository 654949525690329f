"""The Python tool's sandbox (rl_core/envs/sandbox.py): ordinary math runs; every escape the
issue lists is contained, scored as a tool error, and the caller goes on; calls run concurrently
without blocking the event loop.

Most escapes are checked twice: with the default sandbox (where the audit hook refuses them)
and with the hook off, to show the OS layer under it holds alone — those run under an
interpreter the sandbox user can read (/usr/bin/python3) and skip where the machine does not
give that layer (not root, no namespaces). Every test runs twice more: with warm launchers (the
default: each call forked from a started, confined launcher) and with a launcher per call."""

from __future__ import annotations

import asyncio
import os
import pwd
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from rl_core.envs.sandbox import (CommandSandbox, Isolation, ProcessSandbox, SandboxLimits, ToolResult,
                                  probe_isolation, run_python)

SYSTEM_PYTHON = "/usr/bin/python3"
FAST = SandboxLimits(wall_s=10.0)  # a shared 2-core machine: room for a slow interpreter start


WARM = True  # set per test by `launchers`


@pytest.fixture(autouse=True, params=["warm", "cold"])
def launchers(request: pytest.FixtureRequest) -> str:
    global WARM
    WARM = request.param == "warm"
    return request.param


def sandbox_of(**options: object) -> ProcessSandbox:
    """A ProcessSandbox of this test's launcher mode."""
    return ProcessSandbox(warm=WARM, **options)  # type: ignore[arg-type]


def run(code: str, limits: SandboxLimits = FAST, sandbox: ProcessSandbox | None = None) -> ToolResult:
    return asyncio.run((sandbox or sandbox_of()).run(code, limits))


def assert_goes_on(sandbox: ProcessSandbox | None = None) -> None:
    """After a contained escape the sandbox still runs ordinary code."""
    result = run("print(6*7)", sandbox=sandbox)
    assert (result.status, result.stdout) == ("ok", "42\n")


def os_layer(need: str) -> ProcessSandbox:
    """A sandbox without the audit hook, on an interpreter `nobody` can read; skips without `need`."""
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip(f"no {SYSTEM_PYTHON} to run as the sandbox user")
    isolation = probe_isolation(SYSTEM_PYTHON)
    if not getattr(isolation, need):
        pytest.skip(f"this machine does not give the sandbox {need}: {isolation}")
    return sandbox_of(python=SYSTEM_PYTHON, audit_hook=False)


def test_ordinary_math_is_ok() -> None:
    result = run("print(37*48)")
    assert result == ToolResult(status="ok", stdout="1776\n", stderr="", seconds=result.seconds, exit_code=0)


def test_sympy_is_ok() -> None:
    pytest.importorskip("sympy")
    # On this interpreter (the default may be the system's, without sympy: see default_python).
    result = run("import sympy\nx = sympy.symbols('x')\nprint(sympy.solve(x**2 - 5*x + 6, x))",
                 SandboxLimits(wall_s=60.0, cpu_s=30), sandbox=sandbox_of(python=sys.executable))
    assert (result.status, result.stdout, result.stderr) == ("ok", "[2, 3]\n", "")


def test_an_exception_is_an_error_with_its_traceback() -> None:
    result = run("1/0")
    assert result.status == "error" and result.exit_code == 1
    assert "ZeroDivisionError" in result.stderr and 'main.py", line 1' in result.stderr


def test_fork_bomb_is_refused() -> None:
    result = run("import os\nwhile True:\n    os.fork()")
    assert result.status == "refused" and "os.fork refused" in result.stderr
    assert_goes_on()


def test_fork_bomb_without_the_hook_hits_the_process_limit() -> None:
    sandbox = os_layer("dropped_privileges")
    result = run("import os\nwhile True:\n    os.fork()", SandboxLimits(wall_s=10.0, processes=8), sandbox)
    assert result.status != "ok" and result.seconds < 10.0
    assert "BlockingIOError" in result.stderr  # RLIMIT_NPROC refused a fork
    assert_goes_on(sandbox)


def test_infinite_loop_is_killed_at_the_wall_time() -> None:
    result = run("while True:\n    pass", SandboxLimits(wall_s=1.0))
    assert result.status == "timeout" and result.exit_code is None and 1.0 <= result.seconds < 5.0
    assert "wall-time limit" in result.stderr
    assert_goes_on()


def test_infinite_loop_is_killed_at_the_cpu_limit() -> None:
    result = run("while True:\n    pass", SandboxLimits(wall_s=30.0, cpu_s=1))
    assert result.status == "timeout" and "CPU time limit" in result.stderr and result.seconds < 30.0


def test_a_child_left_behind_is_killed() -> None:
    # The code exits at once, leaving a child that left its process group; without the group
    # kill and the PID namespace it would sleep on. Hook off so that it may fork.
    code = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(60)\nprint('parent done')"
    sandbox = sandbox_of(audit_hook=False)
    result = run(code, sandbox=sandbox)
    assert (result.status, result.stdout) == ("ok", "parent done\n")
    launcher = 2 if sandbox.warm else 0  # a warm launcher and its namespace's init stay for the next call
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(_sandbox_processes()) != launcher:
        time.sleep(0.1)
    assert len(_sandbox_processes()) == launcher
    asyncio.run(sandbox.aclose())
    assert not _sandbox_processes()


def _sandbox_processes() -> list[int]:
    """Live launcher processes (and their forks) started by this test process."""
    ours = b"--parent\x00" + str(os.getpid()).encode() + b"\x00"
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and b"sandbox_exec.py" in (cmdline := (entry / "cmdline").read_bytes()) and ours in cmdline:
                if (entry / "stat").read_text().split(") ")[1][0] != "Z":  # a zombie is dead, awaiting its reaper
                    found.append(int(entry.name))
        except OSError:  # exited while we looked
            continue
    return found


def test_ten_gigabytes_of_output_are_cut() -> None:
    code = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(10 * 1024):\n    sys.stdout.write(chunk)"
    limits = SandboxLimits(wall_s=30.0, output_bytes=16_384)
    result = run(code, limits)
    assert result.status == "output_limit" and result.exit_code is None
    assert len(result.stdout) + len(result.stderr) <= limits.output_bytes
    assert result.seconds < 15.0  # killed at the limit, not after writing 10 GB
    assert_goes_on()


def test_reading_etc_passwd_is_refused() -> None:
    result = run("print(open('/etc/passwd').read())")
    assert result.status == "refused" and "root:" not in result.stdout
    result = run("import pwd\nprint(pwd.getpwall())")  # C reads it below the hook: no import
    assert result.status != "ok" and "root" not in result.stdout


@pytest.fixture
def secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run directory with a secret only the worker's user can read, and one in its environment."""
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    secret = run_dir / "token.txt"
    secret.write_text("s3cret-run-token")
    secret.chmod(0o600)
    monkeypatch.setenv("DATABASE_URL", "postgres://inflight:s3cret-db@db/inflight")
    return secret


def test_the_run_directory_is_refused(secrets: Path) -> None:
    result = run(f"print(open({str(secrets)!r}).read())")
    assert result.status == "refused" and "s3cret" not in result.stdout + result.stderr
    result = run(f"import os\nprint(os.listdir({str(secrets.parent)!r}))")
    assert result.status == "refused" and "token" not in result.stdout


def test_the_run_directory_without_the_hook_is_denied_by_the_os(secrets: Path) -> None:
    sandbox = os_layer("dropped_privileges")
    result = run(f"print(open({str(secrets)!r}).read())", sandbox=sandbox)
    assert result.status == "error" and "PermissionError" in result.stderr and "s3cret" not in result.stdout


def test_the_workers_environment_is_not_passed(secrets: Path) -> None:
    result = run("import os\nprint(os.environ['DATABASE_URL'])")
    assert result.status == "error" and "KeyError" in result.stderr and "s3cret" not in result.stdout
    result = run("import os\nprint(sorted(os.environ))")
    assert result.status == "ok" and "DATABASE_URL" not in result.stdout
    result = run(f"print(open('/proc/{os.getpid()}/environ').read())")  # the worker's, through /proc
    assert result.status == "refused" and "s3cret" not in result.stdout


@pytest.fixture
def listener() -> socket.socket:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.setblocking(False)
    yield server
    server.close()


def _connect_code(server: socket.socket) -> str:
    port = server.getsockname()[1]
    return f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'leak')\nprint('sent')"


def _accepted(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
    except BlockingIOError:
        return False
    return True


def test_opening_a_socket_is_refused(listener: socket.socket) -> None:
    result = run(_connect_code(listener))
    assert result.status == "refused" and "socket" in result.stderr and not _accepted(listener)
    assert_goes_on()


def test_a_socket_without_the_hook_finds_no_network(listener: socket.socket) -> None:
    if not probe_isolation().network:
        pytest.skip("no network namespace on this machine")
    result = run(_connect_code(listener), sandbox=sandbox_of(audit_hook=False))
    assert result.status == "error" and "sent" not in result.stdout and not _accepted(listener)


def test_writing_outside_its_directory_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    result = run(f"open({str(target)!r}, 'w').write('x')")
    assert result.status == "refused" and not target.exists()
    result = run("open('/tmp/inflight-sandbox-escape.txt', 'w').write('x')")
    assert result.status == "refused" and not Path("/tmp/inflight-sandbox-escape.txt").exists()


def test_writing_outside_without_the_hook_is_denied_by_the_os(tmp_path: Path) -> None:
    sandbox = os_layer("dropped_privileges")
    target = tmp_path / "escaped.txt"
    result = run(f"open({str(target)!r}, 'w').write('x')", sandbox=sandbox)
    assert result.status == "error" and "PermissionError" in result.stderr and not target.exists()


def test_its_directory_is_writable_and_removed_afterwards() -> None:
    result = run("import os\nopen('notes.txt', 'w').write('12')\nprint(os.getcwd())\nprint(open('notes.txt').read())")
    assert result.status == "ok"
    workdir, content = result.stdout.split()
    assert content == "12" and workdir.startswith("/") and not Path(workdir).exists()


async def test_calls_run_concurrently_without_blocking_the_loop() -> None:
    sandbox = sandbox_of(max_concurrent=8)
    sleep = SandboxLimits(wall_s=30.0)
    started = time.monotonic()
    assert (await sandbox.run("import time\ntime.sleep(1)", sleep)).status == "ok"
    one = time.monotonic() - started

    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1

    ticker = asyncio.ensure_future(tick())
    started = time.monotonic()
    results = await asyncio.gather(*(sandbox.run("import time\ntime.sleep(1)", sleep) for _ in range(8)))
    eight = time.monotonic() - started
    ticker.cancel()
    assert [r.status for r in results] == ["ok"] * 8
    assert eight < 4 * one, (eight, one)
    assert ticks >= eight / 0.05 / 4  # the loop kept turning while the tools slept


async def test_the_semaphore_caps_concurrency() -> None:
    sandbox = sandbox_of(max_concurrent=1)
    started = time.monotonic()
    results = await asyncio.gather(*(sandbox.run("import time\ntime.sleep(1)", FAST) for _ in range(3)))
    assert all(r.status == "ok" for r in results)
    assert time.monotonic() - started >= 3.0  # one at a time; together they would take about 1 s


def test_command_sandbox_runs_under_a_prefix() -> None:
    sandbox = CommandSandbox(["env", "SANDBOX_PREFIX_SEEN={workdir}"])
    result = run("import os\nprint(37*48)\nprint(os.environ['SANDBOX_PREFIX_SEEN'] == os.getcwd())", sandbox=sandbox)
    assert (result.status, result.stdout) == ("ok", "1776\nTrue\n")
    assert "--parent 0" in " ".join(sandbox.command("/w", SandboxLimits()))


def test_a_root_worker_runs_tool_code_as_nobody_even_from_a_private_interpreter() -> None:
    # The CI machine's Python lives under /root (0700): the code would stay root on it, held by
    # the audit hook alone; the default interpreter is then one the sandbox user can run.
    if os.geteuid() != 0:
        pytest.skip("only a root worker drops privileges")
    if not os.path.exists(SYSTEM_PYTHON):
        pytest.skip(f"no {SYSTEM_PYTHON}")
    assert run("import os\nprint(os.getuid())").stdout == f"{pwd.getpwnam('nobody').pw_uid}\n"
    assert probe_isolation().uid != 0


def test_probe_tells_the_uid_the_code_runs_as() -> None:
    isolation = probe_isolation()
    assert isinstance(isolation, Isolation)
    assert run("import os\nprint(os.getuid())").stdout == f"{isolation.uid}\n"


async def test_run_python_works_inside_a_running_loop() -> None:
    assert run_python("print(1)").stdout == "1\n"


async def test_a_killed_call_whose_output_was_left_unread_is_reaped() -> None:
    # Past the output limit the sandbox stops reading; the paused pipe's end is then never seen and
    # Python 3.11's Process.wait() waited forever (the 10 GB test hung a loaded suite for 10 minutes).
    from rl_core.envs import sandbox

    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True)
    await process.stdout.read(1000)
    await asyncio.sleep(0.5)  # the unread output fills the reader's buffer: reading pauses
    os.killpg(process.pid, signal.SIGKILL)
    await asyncio.wait_for(sandbox._reap(process), timeout=15)
    assert process.returncode == -signal.SIGKILL


# --- Warm launchers: what forking every call from one started launcher must not change ----------

warm_only = pytest.mark.parametrize("launchers", ["warm"], indirect=True)


def _launcher_pids(sandbox: ProcessSandbox) -> list[int]:
    return [launcher.process.pid for launcher in sandbox._idle]


@warm_only
def test_a_call_starts_from_the_clean_launcher_not_from_the_call_before() -> None:
    sandbox = sandbox_of(max_concurrent=1)
    first = run("import json, os\njson.left_behind = 1\nos.environ['LEFT'] = '1'\nprint(os.getpid())", sandbox=sandbox)
    second = run("import json, os\nprint(hasattr(json, 'left_behind'), 'LEFT' in os.environ, os.getpid())",
                 sandbox=sandbox)
    assert first.status == second.status == "ok"
    assert second.stdout.split()[:2] == ["False", "False"]
    assert len(_launcher_pids(sandbox)) == 1  # both calls went through the one launcher


@warm_only
def test_a_call_cannot_stop_its_launcher() -> None:
    # Hook off: only the OS holds. The launcher is its PID namespace's init (pid 1) and root; the
    # code is `nobody`, so signalling or tracing it is denied.
    sandbox = os_layer("dropped_privileges")
    assert_goes_on(sandbox)
    launcher = _launcher_pids(sandbox)
    result = run("import os, signal\nos.kill(1, signal.SIGKILL)", sandbox=sandbox)
    assert result.status == "error" and "PermissionError" in result.stderr
    run("import os, signal\nos.kill(-1, signal.SIGKILL)", sandbox=sandbox)  # every process it may signal
    assert_goes_on(sandbox)
    assert _launcher_pids(sandbox) == launcher


@warm_only
def test_a_root_sandbox_user_gets_a_launcher_per_call() -> None:
    # A warm launcher serves only code that runs as another user than itself; staying root
    # (user=None) falls back to one launcher per call, still confined.
    if os.geteuid() != 0:
        pytest.skip("without root the code never runs as another user: warm launchers never serve")
    sandbox = sandbox_of(user=None)
    assert run("import os\nprint(os.getuid())", sandbox=sandbox).stdout == "0\n"
    assert sandbox.warm is False and not _launcher_pids(sandbox)


@warm_only
def test_a_launcher_lost_mid_call_is_a_tool_error_and_the_next_call_gets_a_new_one() -> None:
    sandbox = sandbox_of(max_concurrent=1)
    assert_goes_on(sandbox)
    [lost] = _launcher_pids(sandbox)

    async def call_and_kill() -> ToolResult:
        call = asyncio.ensure_future(sandbox.run("import time\ntime.sleep(20)", SandboxLimits(wall_s=30.0)))
        await asyncio.sleep(1.0)
        os.killpg(lost, signal.SIGKILL)
        return await call

    started = time.monotonic()
    result = asyncio.run(call_and_kill())
    assert result.status == "error" and "lost" in result.stderr and time.monotonic() - started < 15
    assert_goes_on(sandbox)
    assert _launcher_pids(sandbox) not in ([], [lost])


@warm_only
async def test_a_cancelled_call_closes_its_launcher() -> None:
    sandbox = sandbox_of(max_concurrent=1)
    assert (await sandbox.run("print(1)", FAST)).status == "ok"
    call = asyncio.ensure_future(sandbox.run("import time\ntime.sleep(20)", SandboxLimits(wall_s=30.0)))
    await asyncio.sleep(1.0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert not _launcher_pids(sandbox)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _sandbox_processes():
        await asyncio.sleep(0.1)
    assert not _sandbox_processes()  # the sleeping call went with its launcher


@warm_only
def test_a_launcher_that_died_with_the_thread_that_started_it_is_replaced() -> None:
    # PR_SET_PDEATHSIG follows the thread that started the launcher, not the worker process.
    sandbox = sandbox_of(max_concurrent=1)
    results: list[ToolResult] = []
    thread = threading.Thread(target=lambda: results.append(run("print(1)", sandbox=sandbox)))
    thread.start()
    thread.join()
    assert results[0].stdout == "1\n"
    [gone] = _launcher_pids(sandbox)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and sandbox._idle[0].process.poll() is None:
        time.sleep(0.05)
    assert sandbox._idle[0].process.poll() is not None  # killed with its thread
    assert_goes_on(sandbox)
    assert _launcher_pids(sandbox) not in ([], [gone])
