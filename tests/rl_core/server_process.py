"""An inference server started by hand, for tests and benches (a run's servers are the launcher's).

`start_server_process(command)` starts a server command (reference or vLLM) in its own process
group with its output in a log file, and waits for its ready line through the launcher's
`wait_for_server` — the one reader of that line (`run_dir.parse_ready_line`). `ServerProcess.stop`
ends the whole group with `processes.stop_process_groups` (a vLLM server's engine-core and worker
children too). `start_vllm_server` does the same for a command run in vLLM's own virtualenv.

Imported as `server_process` by the tests in tests/rl_core (their folder is on sys.path) and as
`tests.rl_core.server_process` by the benches (benchlib puts the checkout on sys.path).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rl_core.launch.launcher import Child, LaunchError, log_tail, wait_for_server
from rl_core.common.processes import stop_process_groups

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ServerProcess:
    """A server started by `start_server_process`: its URL once ready and its log."""

    url: str
    process: subprocess.Popen
    log_path: Path

    @property
    def output(self) -> list[str]:
        """Every line the server printed so far (stdout and stderr)."""
        try:
            return self.log_path.read_text(errors="replace").splitlines(keepends=True)
        except OSError:
            return []

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM, then SIGKILL the process group; what the server left behind is killed too."""
        stop_process_groups([self.process], timeout_s, kill_orphans=True)


def start_server_process(command: list[str], timeout_s: float = 600.0, env: dict[str, str] | None = None,
                         what: str = "server") -> ServerProcess:
    """Start a server command in its own process group and wait for its ready line. Raises
    RuntimeError with the end of its log if it exits or times out first."""
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("OMP_NUM_THREADS", "1")
    full_env["PYTHONUNBUFFERED"] = "1"
    log_path = Path(tempfile.mkstemp(prefix=f"inflight-{what.replace(' ', '-')}-", suffix=".log")[1])
    with open(log_path, "ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
    handle = ServerProcess(url="", process=process, log_path=log_path)
    try:
        handle.url = wait_for_server(Child(what, process, log_path), timeout_s, should_stop=lambda: False)
    except LaunchError as exc:
        handle.stop()
        raise RuntimeError(f"{what} did not start (rc={process.poll()}): {exc}\n{log_tail(log_path, 60)}") from exc
    return handle


def start_vllm_server(command: list[str], timeout_s: float = 600.0, env: dict[str, str] | None = None) -> ServerProcess:
    """A vLLM server command (`vllm_engine.server_command` or by hand), as `start_server_process`."""
    full_env = {**os.environ, **(env or {})}
    # The vLLM venv finds rl_core from the checkout even without an editable install.
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), full_env.get("PYTHONPATH")]))
    return start_server_process(command, timeout_s, full_env, what="vLLM server")
