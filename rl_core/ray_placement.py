"""The Ray side of a cluster run (`cluster.enabled`): reserve every node at once, start the
roles' usual commands on them, notice a lost node.

Imported only by a cluster run (`launcher.py`), so a single-node run never pays Ray's import.

- `RayHost.reserve()` joins the cluster (`cluster.ray_address`, token from RAY_AUTH_TOKEN) and
  asks for one placement group, one bundle per node (`cluster_layout.node_bundles`,
  STRICT_SPREAD). It is ready with every bundle or not at all; after
  `cluster.placement_timeout_s` the group is removed and a `ClusterError` says what the run
  asked for and what the cluster's alive nodes hold.
- Each role then gets a small Ray actor (`RoleProcess`) in its node's bundle that runs the
  same `python -m rl_core ...` command a single-node run starts, with its log written to the run
  directory (a path every node sees: README "Several machines"). `RemoteProcess` is the
  launcher's handle on it, shaped like `subprocess.Popen` (poll / wait / send_signal / kill), so
  supervision and stopping are the launcher's own code for both placements.
- A role's process gets its node's address (`INFLIGHT_ADVERTISED_ADDRESS`: where its server
  listens, where the weight group's store listens), the interface of the collectives
  (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME), and none of the RAY_* variables of the Ray worker
  that started it: run code never holds the cluster's token.
- A lost node: the launcher asks `unresponsive_roles()` which roles' actors no longer answer,
  and names their node in the run's error.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rl_core.cluster_layout import ClusterError, RoleSlot, layout_summary, node_bundles
from rl_core.config import RunConfig
from rl_core.processes import die_with_parent
from rl_core.weight_sync import ADVERTISED_ADDRESS_ENV

ROLE_CALL_TIMEOUT_S = 30.0  # one call to a role's actor (start) on a live node
SIGNAL_TIMEOUT_S = 5.0  # a signal to a role; longer means its node is gone (the stop goes on without it)


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


class RemoteProcess:
    """The launcher's handle on a role started by a `RoleProcess`, shaped like subprocess.Popen."""

    def __init__(self, name: str, actor: Any, pid: int, node_address: str) -> None:
        self.name = name
        self.actor = actor
        self.pid = pid
        self.node_address = node_address
        self.returncode: int | None = None
        self.lost: str | None = None  # why the exit code is unknown (its node died)
        self._exit = actor.wait.remote()

    def poll(self) -> int | None:
        if self.returncode is None:
            ready, _ = ray.wait([self._exit], timeout=0)
            if ready:
                try:
                    self.returncode = int(ray.get(self._exit))
                except RayError as exc:
                    self.mark_lost(f"its node {self.node_address} was lost ({type(exc).__name__})")
        return self.returncode

    def mark_lost(self, why: str) -> None:
        if self.returncode is None:
            self.lost = why
            self.returncode = -int(signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        ready, _ = ray.wait([self._exit], timeout=timeout)
        if not ready:
            raise subprocess.TimeoutExpired(self.name, timeout or 0.0)
        code = self.poll()
        assert code is not None
        return code

    def send_signal(self, signum: int) -> None:
        if self.poll() is not None:
            return
        try:
            ray.get(self.actor.signal.remote(int(signum)), timeout=SIGNAL_TIMEOUT_S)
        except (RayError, GetTimeoutError):
            pass  # its node is gone: nothing left there to stop

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
        if self.returncode is None:
            # The actor stops with the launcher's driver anyway; its child follows (PDEATHSIG).
            self.mark_lost(f"killed on node {self.node_address}")


def route_address(target: str) -> str:
    """The local address this machine uses to reach `target` ("host:port"): what the other
    nodes reach this one at, without trusting the hostname."""
    host, _, port = target.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, int(port or 1)))  # UDP: no packet is sent
        return str(probe.getsockname()[0])


class RayHost:
    """Every role of one run on its node of a Ray cluster."""

    remote = True

    def __init__(self, config: RunConfig, slots: list[RoleSlot], run_dir: Path) -> None:
        self.config = config
        self.slots = {slot.name: slot for slot in slots}
        self.run_dir = run_dir
        self.group: Any = None
        self.actors: dict[str, Any] = {}
        self.nodes: dict[str, dict[str, str]] = {}  # role -> {address, node_id, hostname}
        self.placement_wait_s = 0.0
        self._role_cls: Any = None

    # --- reservation ---------------------------------------------------------------
    def reserve(self) -> None:
        cluster = self.config.cluster
        address = cluster.ray_address
        try:
            # "auto" joins the cluster this machine belongs to and never starts a new one.
            ray.init(address=address, logging_level="ERROR", log_to_driver=False,
                     namespace=f"inflight-{os.getpid()}", configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ClusterError(f"cluster.ray_address: cannot join the Ray cluster at {address!r}: {exc}") from exc
        bundles = node_bundles(self.config, list(self.slots.values()))
        if cluster.node0_is_launcher_node:
            # Ray gives every node a resource `node:<its address>`: a sliver of it pins bundle 0 here.
            bundles[0][f"node:{self.advertised_address()}"] = 0.001
        strategy = "STRICT_SPREAD" if len(bundles) > 1 else "PACK"
        started = time.monotonic()
        self.group = placement_group(bundles, strategy=strategy, name=f"inflight-{self.run_dir.name}")
        ready, _ = ray.wait([self.group.ready()], timeout=cluster.placement_timeout_s)
        self.placement_wait_s = time.monotonic() - started
        if not ready:
            shortfall = self.describe_shortfall(bundles)
            remove_placement_group(self.group)
            self.group = None
            raise ClusterError(f"cluster: the placement group was not ready within cluster.placement_timeout_s="
                               f"{cluster.placement_timeout_s:g} s: {shortfall}")
        # Every actor takes its process's CPUs (and GPUs) from its node's bundle.
        self._role_cls = ray.remote(max_concurrency=4)(RoleProcess)
        for name, slot in self.slots.items():
            strategy_ = PlacementGroupSchedulingStrategy(placement_group=self.group, placement_group_bundle_index=slot.node)
            self.actors[name] = self._role_cls.options(num_cpus=cluster.cpus_per_process, num_gpus=slot.gpus,
                                                       scheduling_strategy=strategy_, max_restarts=0).remote()
        infos = ray.get([actor.node.remote() for actor in self.actors.values()], timeout=120)
        self.nodes = dict(zip(self.actors, infos))

    def describe_shortfall(self, bundles: list[dict[str, float]]) -> str:
        alive = [node for node in ray.nodes() if node.get("Alive")]
        held = "; ".join(
            f"{node['NodeManagerAddress']}: {node['Resources'].get('CPU', 0):g} CPU, {node['Resources'].get('GPU', 0):g} GPU"
            for node in alive) or "none"
        asks = ", ".join(f"node {index}: {bundle.get('CPU', 0):g} CPU, {bundle.get('GPU', 0):g} GPU"
                         + "".join(f", on {key[5:]}" for key in bundle if key.startswith("node:"))
                         for index, bundle in enumerate(bundles))
        lacking = ""
        if len(bundles) > len(alive):
            lacking = f"cluster.nodes={len(bundles)} but the cluster has {len(alive)} alive node(s); "
        return f"{lacking}the run asks for one bundle per node ({asks}), the alive nodes hold: {held}"

    def summary(self) -> str:
        addresses = {slot.node: self.nodes[name]["address"] for name, slot in self.slots.items() if name in self.nodes}
        return layout_summary(list(self.slots.values()), addresses)

    # --- what the launcher needs ---------------------------------------------------
    def address(self, name: str) -> str:
        return self.nodes[name]["address"]

    def free_port(self, name: str) -> int:
        return int(ray.get(self.actors[name].free_port.remote(self.address(name)), timeout=ROLE_CALL_TIMEOUT_S))

    def advertised_address(self) -> str:
        configured = self.config.cluster.advertised_address
        if configured:
            return configured
        return route_address(ray.get_runtime_context().gcs_address)

    def role_env(self, name: str) -> dict[str, str]:
        """What a role needs on a cluster besides what a local child gets."""
        env = {ADVERTISED_ADDRESS_ENV: self.address(name)}
        interface = self.config.cluster.network_interface
        if interface:
            env.update(GLOO_SOCKET_IFNAME=interface, NCCL_SOCKET_IFNAME=interface)
        # The launcher's INFLIGHT_* settings (data dirs, the vLLM interpreter) hold on every node.
        env.update({key: value for key, value in os.environ.items() if key.startswith("INFLIGHT_")})
        return env

    def start(self, name: str, command: list[str], env: dict[str, str], log_file: Path) -> RemoteProcess:
        actor = self.actors[name]
        full_env = {**self.role_env(name), **env}
        try:
            pid = ray.get(actor.start.remote(command, full_env, str(log_file), os.getcwd()), timeout=ROLE_CALL_TIMEOUT_S)
        except (RayError, GetTimeoutError) as exc:
            raise ClusterError(f"{name}: cannot start on node {self.address(name)}: {exc}") from exc
        return RemoteProcess(name, actor, int(pid), self.address(name))

    def unresponsive_roles(self, timeout_s: float) -> dict[str, list[str]]:
        """Node address -> roles whose actor did not answer within `timeout_s` (its node is gone
        or cut off). Ray's own verdict on a dead node comes from the GCS health checks, later."""
        pings = {name: actor.ping.remote() for name, actor in self.actors.items()}
        ready, _ = ray.wait(list(pings.values()), num_returns=len(pings), timeout=timeout_s)
        answered = set()
        for name, ref in pings.items():
            if ref in ready:
                try:
                    ray.get(ref, timeout=0)
                    answered.add(name)
                except RayError:
                    pass
        lost: dict[str, list[str]] = {}
        for name in self.actors:
            if name not in answered:
                lost.setdefault(self.address(name), []).append(name)
        return lost

    def node_metrics(self, timeout_s: float = 2.0) -> dict[str, float]:
        """`system/node<k>/<metric>` for every node of the run (what `system/<metric>` is for the
        launcher's machine), sampled by one role's actor per node; a node that does not answer in
        `timeout_s` is left out of this sample."""
        first_on_node: dict[int, str] = {}
        for name, slot in self.slots.items():
            if name in self.actors:
                first_on_node.setdefault(slot.node, name)
        refs = {node: self.actors[name].system_sample.remote() for node, name in first_on_node.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
        metrics: dict[str, float] = {}
        for node, ref in refs.items():
            if ref not in ready:
                continue
            try:
                sample = ray.get(ref, timeout=0)
            except RayError:
                continue
            for key, value in sample.items():
                metrics[f"system/node{node}/{key.removeprefix('system/')}"] = value
        return metrics

    def dead_nodes(self) -> dict[str, list[str]]:
        """Node address -> roles on nodes the GCS has declared dead."""
        dead_ids = {node["NodeID"] for node in ray.nodes() if not node.get("Alive")}
        lost: dict[str, list[str]] = {}
        for name, info in self.nodes.items():
            if info["node_id"] in dead_ids:
                lost.setdefault(info["address"], []).append(name)
        return lost

    def close(self) -> None:
        for actor in self.actors.values():
            try:
                ray.kill(actor)
            except RayError:
                pass
        if self.group is not None:
            try:
                remove_placement_group(self.group)
            except RayError:
                pass
        if ray.is_initialized():
            ray.shutdown()


def python_for_roles() -> str:
    """The interpreter of the roles' commands: this one, at the same path on every node (Ray
    itself needs the same environment on every node)."""
    return sys.executable
