"""Environment variables the launcher sets for the roles of a cluster run (`cluster.enabled`).

A module of constants only: `ray_placement` (imported by the launcher and by every role's Ray
actor) reads them from here, so neither pays for torch (which `weight_sync` needs) at start-up.
"""

from __future__ import annotations

# The address of the node a role runs on, as the other nodes reach it (set by the launcher on a
# cluster run, rl_core/ray_placement.py); the weight group's TCPStore listens there.
ADVERTISED_ADDRESS_ENV = "INFLIGHT_ADVERTISED_ADDRESS"
