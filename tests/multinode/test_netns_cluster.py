"""The test cluster itself: nodes really are apart (a wrong advertised address fails as on two
machines), and closing it leaves no namespace and no process behind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from netns_cluster import NetnsCluster, netns_usable

LISTEN = """
import socket, sys, time
sock = socket.socket(); sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
sock.bind((sys.argv[1], 7000)); sock.listen(); print("listening", flush=True); time.sleep(600)
"""
CONNECT = "import socket, sys; socket.create_connection((sys.argv[1], 7000), 2); print('connected')"


@pytest.fixture()
def bare_cluster():
    why = netns_usable()
    if why is not None:
        pytest.skip(why)
    cluster = NetnsCluster.create(nodes=2)
    yield cluster
    cluster.close()


def connects(cluster: NetnsCluster, host: str) -> bool:
    result = subprocess.run(cluster.nodes[0].command([sys.executable, "-c", CONNECT, host]), capture_output=True, text=True, timeout=30)
    return result.returncode == 0


def test_only_the_advertised_address_reaches_another_node_and_close_removes_everything(bare_cluster: NetnsCluster) -> None:
    node1 = bare_cluster.nodes[1]
    listeners = [subprocess.Popen(node1.command([sys.executable, "-c", LISTEN, host]), stdout=subprocess.PIPE, text=True)
                 for host in ("127.0.0.1", node1.address)]
    for listener in listeners:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "listening"
    assert connects(bare_cluster, node1.address)
    assert not connects(bare_cluster, "127.0.0.1")  # node 1's loopback is not node 0's
    assert len(node1.pids()) == 2
    bare_cluster.close()
    for listener in listeners:
        assert listener.wait(timeout=10) != 0  # killed with its namespace
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not [node.netns for node in bare_cluster.nodes if node.netns in names] and bare_cluster.switch not in names
