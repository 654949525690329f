"""A Ray cluster of several "nodes" on this one machine, each node in its own network namespace.

Every node is a namespace with one interface, `eth0`, and an address in a private /24 (for
example 10.231.7.1, .2, ...). The interfaces are veth pairs whose other ends hang on a bridge
that lives in a namespace of its own (the "switch"), so traffic between two nodes really
crosses interfaces, nothing is bound in the machine's own namespace, and a process that
advertises the wrong address (127.0.0.1, the host's IP) is unreachable exactly as it would be
on two machines. Only namespaces this module created are touched; `NetnsCluster.close`
removes them, after killing every process left in them (`ip netns pids`), so nothing outlives
a test. Needs root (CI and this sandbox run as root).

Ray runs with token authentication (RAY_AUTH_MODE=token), every port fixed, the dashboard off
and each node small (a few logical CPUs, a small object store): the cores are shared.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

RAY_GCS_PORT = 6380
RAY_NODE_MANAGER_PORT = 6381
RAY_OBJECT_MANAGER_PORT = 6382
RAY_CLIENT_SERVER_PORT = 6383
RAY_DASHBOARD_AGENT_GRPC_PORT = 6384
RAY_DASHBOARD_AGENT_HTTP_PORT = 6385
RAY_RUNTIME_ENV_AGENT_PORT = 6386
RAY_METRICS_PORT = 6387
RAY_MIN_WORKER_PORT = 11000
RAY_MAX_WORKER_PORT = 11999
OBJECT_STORE_BYTES = 100 * 1024 * 1024
INTERFACE = "eth0"
# Node death is noticed by the GCS's health checks; the defaults take ~30 s, the failure rule
# wants a failed run within 30 s of the loss.
HEAD_SYSTEM_CONFIG = '{"health_check_period_ms":1000,"health_check_failure_threshold":4,"health_check_timeout_ms":1000}'


def netns_usable() -> str | None:
    """None when this process may create network namespaces, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is missing"
    probe = f"inf-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, netns: str | None = None) -> None:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip()}")


@dataclass
class Node:
    index: int
    netns: str
    address: str

    def command(self, argv: list[str]) -> list[str]:
        """`argv` run inside this node's namespace."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.netns], capture_output=True, text=True).stdout
        return [int(pid) for pid in out.split()]

    def kill_all(self, signum: int = signal.SIGKILL) -> None:
        """Every process in the namespace: what a machine losing power looks like to the others."""
        for pid in self.pids():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass


@dataclass
class NetnsCluster:
    """`NetnsCluster.start(nodes=2)`: namespaces, addresses, a Ray head on node 0 and workers."""

    tag: str
    subnet: int
    nodes: list[Node] = field(default_factory=list)
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    temp_dir: Path = field(default_factory=lambda: Path("/tmp") / f"inf-ray-{os.getpid()}")
    switch: str = ""
    python: str = sys.executable

    @classmethod
    def create(cls, nodes: int, subnet: int | None = None, point_to_point: bool = False) -> NetnsCluster:
        """The namespaces and their network only (no Ray yet). `point_to_point` (2 nodes): one veth
        pair straight between the two, no bridge; a bridge on a host with br_netfilter loaded runs
        every frame through netfilter, which made the cross-node update pause ~2x (bench/RESULTS.md)."""
        tag = f"{os.getpid() % 100000}"
        subnet = subnet if subnet is not None else 100 + os.getpid() % 100
        cluster = cls(tag=tag, subnet=subnet)
        if point_to_point:
            if nodes != 2:
                raise ValueError("point_to_point joins exactly 2 nodes")
            try:
                cluster._create_pair()
            except Exception:
                cluster.close()
                raise
            return cluster
        cluster.switch = f"inf-sw-{tag}"
        try:
            _ip("netns", "add", cluster.switch)
            _ip("link", "add", "br0", "type", "bridge", netns=cluster.switch)
            _ip("link", "set", "br0", "up", netns=cluster.switch)
            for index in range(nodes):
                cluster.add_node()
        except Exception:
            cluster.close()
            raise
        return cluster

    def _create_pair(self) -> None:
        for index in range(2):
            node = Node(index, f"inf-n{index}-{self.tag}", f"10.231.{self.subnet}.{index + 1}")
            _ip("netns", "add", node.netns)
            self.nodes.append(node)
        first, second = self.nodes
        _ip("link", "add", INTERFACE, "type", "veth", "peer", "name", "peer0", netns=first.netns)
        _ip("link", "set", "peer0", "netns", second.netns, netns=first.netns)
        _ip("link", "set", "peer0", "name", INTERFACE, netns=second.netns)
        for node in self.nodes:
            _ip("addr", "add", f"{node.address}/24", "dev", INTERFACE, netns=node.netns)
            _ip("link", "set", INTERFACE, "up", netns=node.netns)
            _ip("link", "set", "lo", "up", netns=node.netns)

    def add_node(self) -> Node:
        index = len(self.nodes)
        node = Node(index, f"inf-n{index}-{self.tag}", f"10.231.{self.subnet}.{index + 1}")
        _ip("netns", "add", node.netns)
        self.nodes.append(node)
        port = f"p{index}"
        # Created inside the switch namespace, then one end moved to the node's: the machine's
        # own namespace never holds an interface of the cluster.
        _ip("link", "add", port, "type", "veth", "peer", "name", INTERFACE, netns=self.switch)
        _ip("link", "set", INTERFACE, "netns", node.netns, netns=self.switch)
        _ip("link", "set", port, "master", "br0", netns=self.switch)
        _ip("link", "set", port, "up", netns=self.switch)
        _ip("addr", "add", f"{node.address}/24", "dev", INTERFACE, netns=node.netns)
        _ip("link", "set", INTERFACE, "up", netns=node.netns)
        _ip("link", "set", "lo", "up", netns=node.netns)
        return node

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def address(self) -> str:
        return f"{self.head.address}:{RAY_GCS_PORT}"

    def env(self) -> dict[str, str]:
        """What a process needs to talk to this cluster (the token) on top of os.environ."""
        return {
            **os.environ,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "RAY_USAGE_STATS_ENABLED": "0",
            # Ray's memory monitor kills workers when the *machine* is near full; every "node" here
            # shares one machine with unrelated processes (other tests), whose memory is not the cluster's.
            "RAY_memory_monitor_refresh_ms": "0",
            "GLOO_SOCKET_IFNAME": INTERFACE,
        }

    def _ray(self, node: Node, args: list[str]) -> None:
        ray = str(Path(self.python).parent / "ray")
        common = [
            f"--node-ip-address={node.address}",
            f"--num-cpus={self.cpus_per_node}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            f"--node-manager-port={RAY_NODE_MANAGER_PORT}",
            f"--object-manager-port={RAY_OBJECT_MANAGER_PORT}",
            f"--dashboard-agent-grpc-port={RAY_DASHBOARD_AGENT_GRPC_PORT}",
            f"--dashboard-agent-listen-port={RAY_DASHBOARD_AGENT_HTTP_PORT}",
            f"--runtime-env-agent-port={RAY_RUNTIME_ENV_AGENT_PORT}",
            f"--metrics-export-port={RAY_METRICS_PORT}",
            f"--min-worker-port={RAY_MIN_WORKER_PORT}",
            f"--max-worker-port={RAY_MAX_WORKER_PORT}",
            "--disable-usage-stats",
        ]
        result = subprocess.run(node.command([ray, "start", *args, *common]), env=self.env(), capture_output=True,
                                text=True, timeout=180)
        if result.returncode != 0:
            raise RuntimeError(f"ray start on node {node.index} ({node.address}) failed:\n{result.stdout}\n{result.stderr}")

    cpus_per_node: int = 4

    def start_ray(self, cpus_per_node: int = 4) -> None:
        self.cpus_per_node = cpus_per_node
        self._ray(self.head, [
            "--head", f"--port={RAY_GCS_PORT}", f"--ray-client-server-port={RAY_CLIENT_SERVER_PORT}",
            "--include-dashboard=false", f"--temp-dir={self.temp_dir}",
            f"--system-config={HEAD_SYSTEM_CONFIG}",
        ])
        for node in self.nodes[1:]:
            self.start_worker(node)

    def start_worker(self, node: Node) -> None:
        self._ray(node, [f"--address={self.address}"])

    def python_in(self, node: Node, code: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(node.command([self.python, "-c", code]), env=self.env(), capture_output=True, text=True,
                              timeout=timeout)

    def alive_nodes(self) -> int:
        code = ("import ray; ray.init(address='%s', logging_level='ERROR'); "
                "print(sum(1 for n in ray.nodes() if n['Alive']))" % self.address)
        result = self.python_in(self.head, code)
        if result.returncode != 0:
            raise RuntimeError(result.stderr[-3000:])
        return int(result.stdout.strip().splitlines()[-1])

    def close(self) -> None:
        """Kill every process in every namespace of this cluster, then remove the namespaces."""
        for _ in range(3):
            for node in self.nodes:
                node.kill_all()
            if not any(node.pids() for node in self.nodes):
                break
            time.sleep(0.5)
        for node in self.nodes:
            subprocess.run(["ip", "netns", "del", node.netns], capture_output=True)
        if self.switch:
            subprocess.run(["ip", "netns", "del", self.switch], capture_output=True)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


@contextmanager
def ray_cluster_or_skip(nodes: int, cpus_per_node: int) -> Iterator[NetnsCluster]:
    """A started Ray cluster of `nodes` namespaces for one test or module (pytest skips where
    namespaces cannot be made); everything in it is killed and removed afterwards."""
    import pytest

    why = netns_usable()
    if why is not None:
        pytest.skip(why)
    cluster = NetnsCluster.create(nodes=nodes)
    try:
        cluster.start_ray(cpus_per_node=cpus_per_node)
        yield cluster
    finally:
        cluster.close()


def demo_on_cluster(model: Path, overrides: dict[str, object]) -> dict:
    """The demo config (examples/tiny-cpu.yaml) as a cluster run on a netns cluster: the run's own
    Redis stream, the namespaces' interface; `overrides` as `{"section.field": value}`."""
    import yaml

    config = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples" / "tiny-cpu.yaml").read_text())
    config["model"]["path"] = str(model)
    config["stream"] = {"kind": "redis", "redis_embedded": True}
    config["cluster"] = {"enabled": True, "nodes": 2, "placement_timeout_s": 60, "network_interface": INTERFACE}
    for key, value in overrides.items():
        section, _, field_name = key.partition(".")
        if field_name:
            config.setdefault(section, {})[field_name] = value
        else:
            config[section] = value
    return config
