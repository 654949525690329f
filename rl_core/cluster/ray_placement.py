"""The Ray side of a cluster run (`cluster.enabled`): reserve every node at once, start the
roles' usual commands on them, notice a lost node.

Imported only by a cluster run (`launch/launcher.py`), so a single-node run never pays Ray's import.

- `RayHost.reserve()` joins the cluster (`cluster.ray_address`, token from RAY_AUTH_TOKEN) and
  asks for one placement group, one bundle per node (`cluster_layout.node_bundles`,
  STRICT_SPREAD). It is ready with every bundle or not at all; after
  `cluster.placement_timeout_s` the group is removed and a `ClusterError` says what the run
  asked for and what the cluster's alive nodes hold.
- Each node gets a small Ray actor (`role_actor.NodeRoles`) in its bundle that runs its roles'
  `python -m rl_core ...` commands, the same a single-node run starts, with their logs written
  to the run directory (a path every node sees: README "Several machines"). One per node, not
  per role: each is a Ray worker process that starts while the run waits. The actors are asked
  for with the group, so Ray starts them the moment every bundle is reserved; the launcher starts
  its own node's stream while they come up (`await_roles`). `RemoteProcess` is the
  launcher's handle on a role, shaped like `subprocess.Popen` (poll / wait / send_signal / kill), so
  supervision and stopping are the launcher's own code for both placements.
- A role's process gets its node's address (`INFLIGHT_ADVERTISED_ADDRESS`: where its server
  listens, where the weight group's store listens), the interface of the collectives
  (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME), and none of the RAY_* variables of the Ray worker
  that started it: run code never holds the cluster's token.
- A lost node: the launcher asks `unresponsive_roles()` which roles' node actors no longer answer,
  and names their node in the run's error.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

import ray
from ray.exceptions import GetTimeoutError, RayError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rl_core.cluster.layout import ClusterError, RoleSlot, layout_summary, node_bundles
from rl_core.config.run_config import RunConfig
from rl_core.cluster.role_actor import NodeRoles
from rl_core.cluster.role_hosts import LostRoles
from rl_core.common.system_metrics import SystemSampler
from rl_core.rundir.layout import ADVERTISED_ADDRESS_ENV, ClusterRecord, ClusterRole

ROLE_CALL_TIMEOUT_S = 30.0  # one call to a node's actor (start a role) on a live node
ROLE_START_TIMEOUT_S = 120.0  # every node's actor up once the group is ready (a fresh Ray worker each)
SIGNAL_TIMEOUT_S = 5.0  # a signal to a role; longer means its node is gone (the stop goes on without it)


class RemoteProcess:
    """The launcher's handle on a role started by its node's `NodeRoles`, shaped like subprocess.Popen."""

    def __init__(self, name: str, actor: Any, pid: int, node_address: str) -> None:
        self.name = name
        self.actor = actor
        self.pid = pid
        self.node_address = node_address
        self.returncode: int | None = None
        self.lost: str | None = None  # why the exit code is unknown (its node died)
        self._exit = actor.wait.remote(name)

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
            ray.get(self.actor.signal.remote(self.name, int(signum)), timeout=SIGNAL_TIMEOUT_S)
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
    """Every role of one run on its node of a Ray cluster (a `role_hosts.RoleHost`)."""

    def __init__(self, config: RunConfig, slots: list[RoleSlot], run_dir: Path) -> None:
        self.config = config
        self.slots = {slot.name: slot for slot in slots}
        self.run_dir = run_dir
        self.group: Any = None
        self.node_actors: dict[int, Any] = {}  # node index -> its NodeRoles actor
        self.actors: dict[str, Any] = {}  # role -> its node's actor
        self.nodes: dict[str, dict[str, str]] = {}  # role -> {address, node_id, hostname}
        self.placement_wait_s = 0.0
        self.actors_wait_s = 0.0  # the group asked for -> every node's actor answering (`await_roles`)
        self._asked_at = 0.0
        self._node_refs: dict[int, Any] = {}  # node index -> its actor's pending `node()` answer
        self.processes: dict[str, RemoteProcess] = {}  # role -> the launcher's handle on it

    # --- before any role starts ------------------------------------------------------
    def prepare(self, waiting: Callable[[str | None], None], reserved: Callable[[], None]) -> str:
        """Reserve every node (`reserve`), call `reserved` while the nodes' actors start, wait for
        them (`await_roles`)."""
        cluster = self.config.cluster
        waiting(f"waiting for the Ray placement group: cluster.nodes={cluster.nodes}, at most "
                f"{cluster.placement_timeout_s:g} s; no role starts before every node is reserved")
        self.reserve()
        reserved()  # the nodes' actors start meanwhile (a Ray worker process each)
        self.await_roles()
        waiting(None)
        return (f"placement group ready after {self.placement_wait_s:.1f} s (every node's Ray actor up after "
                f"{self.actors_wait_s:.1f} s):\n{self.summary()}")

    def stream_address(self) -> str | None:
        return self.advertised_address()

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
        started = self._asked_at = time.monotonic()
        self.group = placement_group(bundles, strategy=strategy, name=f"inflight-{self.run_dir.name}")
        # The node actors are asked for now, not once the group is ready: Ray schedules them into
        # their bundles the moment every bundle is reserved (none can run before), with no round
        # trip back here first, and their `node` answers queue behind them (`await_roles`).
        self.request_actors()
        ready, _ = ray.wait([self.group.ready()], timeout=cluster.placement_timeout_s)
        self.placement_wait_s = time.monotonic() - started
        if not ready:
            shortfall = self.describe_shortfall(bundles)
            self.kill_actors()
            remove_placement_group(self.group)
            self.group = None
            raise ClusterError(f"cluster: the placement group was not ready within cluster.placement_timeout_s="
                               f"{cluster.placement_timeout_s:g} s: {shortfall}")

    def request_actors(self) -> None:
        """One `NodeRoles` per node in its bundle, taking the CPUs (and GPUs) of the node's roles
        from it; the actors start (a Ray worker process each) while the launcher goes on."""
        node_cls = ray.remote(NodeRoles)
        for node in sorted({slot.node for slot in self.slots.values()}):
            roles = [slot for slot in self.slots.values() if slot.node == node]
            in_bundle = PlacementGroupSchedulingStrategy(placement_group=self.group, placement_group_bundle_index=node)
            # A thread per role for its pending `wait`, and a few for start / signal / ping / samples.
            self.node_actors[node] = node_cls.options(
                num_cpus=self.config.cluster.cpus_per_process * len(roles), num_gpus=sum(slot.gpus for slot in roles),
                max_concurrency=len(roles) + 4, scheduling_strategy=in_bundle, max_restarts=0).remote()
            for slot in roles:
                self.actors[slot.name] = self.node_actors[node]
        self._node_refs = {node: actor.node.remote() for node, actor in self.node_actors.items()}

    def await_roles(self, timeout_s: float = ROLE_START_TIMEOUT_S) -> None:
        """Wait until every node's actor answers (after `reserve`; the launcher starts its own
        node's stream meanwhile) and learn each role's node."""
        try:
            infos = dict(zip(self._node_refs, ray.get(list(self._node_refs.values()), timeout=timeout_s)))
        except GetTimeoutError as exc:
            raise ClusterError(f"cluster: the nodes' Ray actors did not start within {timeout_s:g} s") from exc
        except RayError as exc:  # a node lost between its reservation and its actor's start
            raise ClusterError(f"cluster: a node's Ray actor died while starting: {exc}") from exc
        self.nodes = {name: infos[slot.node] for name, slot in self.slots.items()}
        self.actors_wait_s = time.monotonic() - self._asked_at

    def gpu_share(self, name: str) -> tuple[int, int]:
        """(first, count) of role `name`'s GPUs among its node actor's: the node's roles in slot order."""
        node = self.slots[name].node
        first = 0
        for slot in self.slots.values():
            if slot.name == name:
                return first, slot.gpus
            if slot.node == node:
                first += slot.gpus
        raise KeyError(name)

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

    def listen_address(self, name: str) -> str | None:
        return self.address(name)  # its node's, on the cluster network: other nodes reach it there

    def role_nodes(self, names: list[str]) -> list[int] | None:
        return [self.slots[name].node for name in names]

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
            pid = ray.get(actor.start.remote(name, command, full_env, str(log_file), os.getcwd(), self.gpu_share(name)),
                          timeout=ROLE_CALL_TIMEOUT_S)
        except (RayError, GetTimeoutError) as exc:
            raise ClusterError(f"{name}: cannot start on node {self.address(name)}: {exc}") from exc
        process = self.processes[name] = RemoteProcess(name, actor, int(pid), self.address(name))
        return process

    def unresponsive_roles(self, timeout_s: float) -> LostRoles:
        """Node address -> roles whose node's actor did not answer within `timeout_s` (the node is
        gone or cut off). Ray's own verdict on a dead node comes from the GCS health checks, later."""
        pings = {node: actor.ping.remote() for node, actor in self.node_actors.items()}
        ready, _ = ray.wait(list(pings.values()), num_returns=len(pings), timeout=timeout_s)
        answered = set()
        for node, ref in pings.items():
            if ref in ready:
                try:
                    ray.get(ref, timeout=0)
                    answered.add(node)
                except RayError:
                    pass
        lost: dict[str, list[str]] = {}
        for name in self.actors:
            if self.slots[name].node not in answered:
                lost.setdefault(self.address(name), []).append(name)
        return lost

    def sample_system(self, sampler: SystemSampler, pids: Mapping[str, int]) -> dict[str, float]:
        """The launcher's machine, then every node of the run: the roles' pids are their nodes'."""
        sample = sampler.sample(roles=None)
        sample.update(self.node_metrics())
        return sample

    def forget(self, lost: LostRoles) -> None:
        names = {name for roles in lost.values() for name in roles}
        for name, process in self.processes.items():
            if name in names:
                process.mark_lost("its node was lost")

    def where(self, name: str) -> str:
        process = self.processes.get(name)  # the run's stream is the launcher's own child
        return f" on node {process.node_address}" if process is not None else ""

    def lost_reason(self, name: str) -> str | None:
        process = self.processes.get(name)
        return process.lost if process is not None else None

    def cluster_record(self, pids: Mapping[str, int]) -> ClusterRecord | None:
        roles = [ClusterRole(role=name, node=self.slots[name].node, address=self.address(name), pid=pid)
                 for name, pid in pids.items() if name in self.slots]
        return ClusterRecord(placement_wait_s=round(self.placement_wait_s, 3), roles=roles)

    def node_metrics(self, timeout_s: float = 2.0) -> dict[str, float]:
        """`system/node<k>/<metric>` for every node of the run (what `system/<metric>` is for the
        launcher's machine), sampled by each node's actor; a node that does not answer in
        `timeout_s` is left out of this sample."""
        refs = {node: actor.system_sample.remote() for node, actor in self.node_actors.items()}
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

    def dead_nodes(self) -> LostRoles:
        """Node address -> roles on nodes the GCS has declared dead."""
        dead_ids = {node["NodeID"] for node in ray.nodes() if not node.get("Alive")}
        lost: dict[str, list[str]] = {}
        for name, info in self.nodes.items():
            if info["node_id"] in dead_ids:
                lost.setdefault(info["address"], []).append(name)
        return lost

    def kill_actors(self) -> None:
        for actor in self.node_actors.values():
            try:
                ray.kill(actor)
            except RayError:
                pass
        self.node_actors.clear()
        self.actors.clear()

    def close(self) -> None:
        self.kill_actors()
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
