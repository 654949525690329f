"""`python -m rl_core cluster-nodes [--address HOST:PORT]`: the Ray cluster's node table as JSON.

The platform's `cluster` workers report it in their heartbeat (the Workers page, the submit-time
check that a cluster run fits). They run it through the same command as the engine
(`INFLIGHT_RL_COMMAND`, e.g. on the head node or inside its network namespace), so the worker
itself never imports Ray and talks to the cluster from where the runs' launchers do.
The token comes from the environment as for every Ray process (`RAY_AUTH_MODE=token`,
`RAY_AUTH_TOKEN`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def node_row(node: dict[str, Any]) -> dict[str, Any]:
    """One row of Ray's node table as the platform stores it."""
    resources = node.get("Resources") or {}
    return {
        "node_id": str(node.get("NodeID", "")),
        "address": str(node.get("NodeManagerAddress", "")),
        "hostname": str(node.get("NodeManagerHostname", "")),
        "alive": bool(node.get("Alive")),
        "cpus": float(resources.get("CPU", 0.0)),
        "gpus": float(resources.get("GPU", 0.0)),
        "memory_gb": round(float(resources.get("memory", 0.0)) / 2**30, 1),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_core cluster-nodes", description=__doc__.split("\n")[0])
    parser.add_argument("--address", default="auto", help="The Ray head's GCS address host:port (default: RAY_ADDRESS or the local head).")
    args = parser.parse_args(argv)
    import ray  # the cluster path only

    try:
        ray.init(address=None if args.address == "auto" else args.address, namespace="inflight-inventory",
                 logging_level="ERROR", log_to_driver=False, configure_logging=False)
    except Exception as exc:  # noqa: BLE001 - said in one line, the caller shows it
        print(f"cannot join the Ray cluster at {args.address!r}: {type(exc).__name__}: {str(exc).strip()[:300]}", file=sys.stderr)
        return 1
    try:
        print(json.dumps([node_row(node) for node in ray.nodes()]))
    finally:
        ray.shutdown()
    return 0
