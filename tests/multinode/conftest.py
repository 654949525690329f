"""Fixtures of the multi-node tests: a Ray cluster of network namespaces (netns_cluster.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from netns_cluster import NetnsCluster, netns_usable  # noqa: E402


@pytest.fixture(scope="module")
def two_node_cluster() -> Iterator[NetnsCluster]:
    why = netns_usable()
    if why is not None:
        pytest.skip(why)
    cluster = NetnsCluster.create(nodes=2)
    try:
        cluster.start_ray(cpus_per_node=3)
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def three_node_cluster() -> Iterator[NetnsCluster]:
    why = netns_usable()
    if why is not None:
        pytest.skip(why)
    cluster = NetnsCluster.create(nodes=3)
    try:
        cluster.start_ray(cpus_per_node=2)
        yield cluster
    finally:
        cluster.close()
