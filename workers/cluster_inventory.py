"""The Ray cluster a `cluster` worker drives: its nodes, for the heartbeat (the Workers page and
the submit-time check that a cluster run fits, `inflight.runs.run_limits.cluster_errors`).

The worker never imports Ray: it runs `rl_core cluster-nodes` through the engine's command
(`INFLIGHT_RL_COMMAND`), i.e. from where its runs' launchers talk to the cluster (the head node,
or a namespace of it), with `RAY_ADDRESS` / `RAY_AUTH_MODE=token` / `RAY_AUTH_TOKEN` from the
worker's environment. A Ray driver costs a second or two of CPU to start, so the table is read
at most every `REFRESH_S` and the last one is reported in between.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import threading
from typing import Any, Callable

logger = logging.getLogger(__name__)

REFRESH_S = 30.0
TIMEOUT_S = 60.0


class ClusterInventory:
    """Reads the node table on a thread of its own (a cluster that does not answer makes the read
    wait up to `TIMEOUT_S`: the heartbeat must never wait with it); `read()` returns the latest."""

    def __init__(self, command_prefix: Callable[[], list[str]], refresh_s: float = REFRESH_S) -> None:
        self.command_prefix = command_prefix
        self.refresh_s = refresh_s
        self.address = os.environ.get("RAY_ADDRESS", "auto")
        self._last: tuple[list[dict[str, Any]], str] = ([], "the Ray cluster has not been read yet")
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="inflight-ray-inventory", daemon=True)

    def start(self) -> ClusterInventory:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def read(self) -> tuple[list[dict[str, Any]], str]:
        """(nodes, "") or (the last nodes known, marked dead, and why the cluster cannot be read now)."""
        return self._last

    def _loop(self) -> None:
        while not self._stopped.is_set():
            self._last = self.read_now()
            self._stopped.wait(self.refresh_s)

    def read_now(self) -> tuple[list[dict[str, Any]], str]:
        known = [dict(node, alive=False) for node in self._last[0]]  # unknown now: not counted as alive
        command = [*self.command_prefix(), "cluster-nodes", "--address", self.address]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return known, f"reading the Ray cluster at {self.address!r} failed: {type(exc).__name__}"
        if done.returncode != 0:
            why = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1][:500]
            if why != self._last[1]:
                logger.warning("Ray cluster at %s: %s", self.address, why)
            return known, why
        try:
            return json.loads(done.stdout.strip().splitlines()[-1]), ""
        except (ValueError, IndexError) as exc:
            return known, f"unreadable node table from `rl_core cluster-nodes`: {exc}"
