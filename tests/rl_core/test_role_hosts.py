"""A third place to run roles is one new class: a host that is neither LocalHost nor RayHost,
implementing only `role_hosts.RoleHost`, drives the whole launcher — getting ready, the stream,
where servers listen, system figures, lost nodes, where a role ran, cluster.json — through the
protocol's members alone (issue 32 §3). Its roles are tiny stand-in scripts, so a run takes seconds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping

import pytest

from rl_core.cluster.role_hosts import LocalHost, LostRoles, RoleHost
from rl_core.common.system_metrics import SystemSampler
from rl_core.config.run_config import RunConfig
from rl_core.launch.launcher import Launcher, place_run
from rl_core.rundir.layout import CLUSTER_FILE, METRICS_FILE, ClusterRecord, ClusterRole, ready_line
from tests.metrics_file import read_metrics

LAUNCHER = Path(__file__).resolve().parents[2] / "rl_core" / "launch" / "launcher.py"


class RecordingHost:
    """A made-up scheduler's host: every role a local stand-in process, every call recorded."""

    def __init__(self, actor_exit: int = 0, unresponsive: LostRoles | None = None) -> None:
        self.calls: list[tuple[str, object]] = []
        self.actor_exit = actor_exit
        self.unresponsive = unresponsive or {}
        self.commands: dict[str, list[str]] = {}

    def prepare(self, waiting: Callable[[str | None], None], reserved: Callable[[], None]) -> str:
        self.calls.append(("prepare", None))
        waiting("waiting for the fake scheduler")
        reserved()
        waiting(None)
        return "fake scheduler: every role on node fake-1"

    def stream_address(self) -> str | None:
        self.calls.append(("stream_address", None))
        return None

    def address(self, name: str) -> str:
        return "127.0.0.1"

    def listen_address(self, name: str) -> str | None:
        self.calls.append(("listen_address", name))
        return "127.0.0.1"

    def free_port(self, name: str) -> int:
        self.calls.append(("free_port", name))
        return 29511

    def role_nodes(self, names: list[str]) -> list[int] | None:
        self.calls.append(("role_nodes", tuple(names)))
        return [0 for _ in names]

    def start(self, name: str, command: list[str], env: dict[str, str], log_file: Path) -> subprocess.Popen[bytes]:
        self.calls.append(("start", name))
        self.commands[name] = command
        script = {
            "server0": f"import time; print({ready_line('http://127.0.0.1:9')!r}, flush=True); time.sleep(60)",
            "trainer": "import time; time.sleep(0.3 if %d == 0 else 60)" % self.actor_exit,
            "actor": f"import sys, time; time.sleep(1.0); sys.exit({self.actor_exit})",
        }[name]
        with open(log_file, "ab") as log:
            return subprocess.Popen([sys.executable, "-c", script], stdout=log, stderr=subprocess.STDOUT)

    def sample_system(self, sampler: SystemSampler, pids: Mapping[str, int]) -> dict[str, float]:
        self.calls.append(("sample_system", tuple(pids)))
        return {"system/fake_nodes": 1.0}

    def dead_nodes(self) -> LostRoles:
        self.calls.append(("dead_nodes", None))
        return {}

    def unresponsive_roles(self, timeout_s: float) -> LostRoles:
        self.calls.append(("unresponsive_roles", timeout_s))
        return self.unresponsive

    def forget(self, lost: LostRoles) -> None:
        self.calls.append(("forget", json.dumps(lost)))

    def where(self, name: str) -> str:
        return " on node fake-1"

    def lost_reason(self, name: str) -> str | None:
        return None

    def cluster_record(self, pids: Mapping[str, int]) -> ClusterRecord | None:
        self.calls.append(("cluster_record", tuple(pids)))
        return ClusterRecord(placement_wait_s=0.25, roles=[ClusterRole(role=name, node=0, address="fake-1", pid=pid) for name, pid in pids.items()])

    def close(self) -> None:
        self.calls.append(("close", None))


def _launcher(tmp_path: Path, host: RoleHost) -> Launcher:
    config = RunConfig.model_validate({"name": "third-host", "model": {"path": str(tmp_path / "model")},
                                       "trainer": {"max_steps": 2}, "monitoring": {"hang_limit_s": 600},
                                       # the run's own redis-server: started where the host says (here: this node)
                                       "stream": {"kind": "redis", "redis_embedded": True}})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return Launcher(config, run_dir, tmp_path / "model", resume=False, console=False,
                    placement=place_run(config, []), host=host)


def test_a_third_host_drives_the_launcher_through_the_protocol_alone(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    host = RecordingHost()
    launcher = _launcher(tmp_path, host)
    assert launcher.run() == 0
    names = [name for name, _ in host.calls]
    assert names[:2] == ["prepare", "stream_address"]  # the stream starts once the machines are the run's
    assert ("listen_address", "server0") in host.calls and ("role_nodes", ("trainer",)) in host.calls
    assert [arg for name, arg in host.calls if name == "start"] == ["server0", "trainer", "actor"]  # redis is the launcher's own
    assert "--host" in host.commands["server0"]  # told where to listen, as its host said
    assert ("cluster_record", ("redis", "server0", "trainer", "actor")) in host.calls
    assert {"sample_system", "dead_nodes"} <= set(names) and names[-1] == "close"
    assert "fake scheduler: every role on node fake-1" in capsys.readouterr().out
    record = json.loads((launcher.run_dir / CLUSTER_FILE).read_text())
    assert [role["role"] for role in record["roles"]] == ["redis", "server0", "trainer", "actor"]
    assert any("system/fake_nodes" in line for line in read_metrics(launcher.run_dir / METRICS_FILE))


def test_a_third_hosts_failed_role_is_named_where_it_ran(tmp_path: Path) -> None:
    host = RecordingHost(actor_exit=3)
    launcher = _launcher(tmp_path, host)
    assert launcher.run() == 1
    error = json.loads((launcher.run_dir / "status.json").read_text())["error"]
    assert re.match(r"actor \(pid \d+ on node fake-1\) exited with code 3", error), error
    assert not any(name == "forget" for name, _ in host.calls)


def test_a_third_hosts_lost_node_is_named_first_and_forgotten(tmp_path: Path) -> None:
    lost = {"10.0.0.2": ["server0"]}
    host = RecordingHost(actor_exit=3, unresponsive=lost)
    launcher = _launcher(tmp_path, host)
    assert launcher.run() == 1
    error = json.loads((launcher.run_dir / "status.json").read_text())["error"]
    assert error.startswith("node 10.0.0.2 lost (its roles stopped answering): role(s) server0 ran there"), error
    assert ("forget", json.dumps(lost)) in host.calls


def test_the_local_host_answers_every_member_for_one_node(tmp_path: Path) -> None:
    host = LocalHost()
    started: list[str] = []
    assert host.prepare(lambda detail: started.append(f"waiting {detail}"), lambda: started.append("reserved")) == ""
    assert started == ["reserved"]  # nothing to wait for on one node
    assert (host.stream_address(), host.listen_address("server0"), host.role_nodes(["trainer"])) == (None, None, None)
    assert (host.dead_nodes(), host.unresponsive_roles(1.0), host.where("actor"), host.lost_reason("actor")) == ({}, {}, "", None)
    assert host.cluster_record({"actor": 1}) is None


def test_the_launcher_never_reaches_past_the_host_protocol() -> None:
    """Alongside the behavioural tests above: no host member the protocol lacks, no probing of a
    process handle for one."""
    source = LAUNCHER.read_text()
    for forbidden in ("type: ignore", "hasattr(", "getattr(", "host.remote", "isinstance(self.host", "RayHost("):
        assert forbidden not in source.split("def main(")[0], forbidden
