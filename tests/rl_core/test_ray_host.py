"""RayHost's bookkeeping that needs no cluster: one actor per node hands each of its roles its
own GPUs (tests/multinode runs the real thing on a cluster of network namespaces)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("ray")

from rl_core.cluster.layout import RoleSlot  # noqa: E402
from rl_core.config.run_config import RunConfig  # noqa: E402
from rl_core.cluster.ray_placement import RayHost  # noqa: E402


def test_each_role_gets_its_own_slice_of_its_node_actors_gpus(tmp_path: Path) -> None:
    slots = [RoleSlot("server0", 1, 2), RoleSlot("server1", 1, 2), RoleSlot("trainer", 0, 1), RoleSlot("trainer1", 1, 1),
             RoleSlot("actor", 0, 0)]
    host = RayHost(RunConfig(), slots, tmp_path)
    shares = {slot.name: host.gpu_share(slot.name) for slot in slots}
    assert shares == {"server0": (0, 2), "server1": (2, 2), "trainer": (0, 1), "trainer1": (4, 1), "actor": (1, 0)}
