"""Fixtures of the multi-node tests: a Ray cluster of network namespaces (netns_cluster.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from netns_cluster import NetnsCluster, ray_cluster_or_skip  # noqa: E402


@pytest.fixture(scope="module")
def two_node_cluster() -> Iterator[NetnsCluster]:
    with ray_cluster_or_skip(nodes=2, cpus_per_node=3) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def three_node_cluster() -> Iterator[NetnsCluster]:
    with ray_cluster_or_skip(nodes=3, cpus_per_node=2) as cluster:
        yield cluster
