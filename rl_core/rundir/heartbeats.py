"""A role's heartbeat: the file `heartbeats/<role>` of the run directory, rewritten every
`HEARTBEAT_EVERY_S` by a thread of the role, which the launcher's watchdog (`launch/watchdog.py`)
reads. Here, below every role, so the actor and the trainer ranks write it without importing the
launcher.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from rl_core.rundir.layout import heartbeat_path

HEARTBEAT_EVERY_S = 2.0  # a role rewrites its heartbeat this often


def trainer_rank_name(rank: int) -> str:
    """A trainer rank's role name (heartbeat file, logs, metrics): `trainer`, `trainer<r>`."""
    return "trainer" if rank == 0 else f"trainer{rank}"


def start_heartbeat(run_dir: str | Path, role: str, every_s: float = HEARTBEAT_EVERY_S) -> threading.Thread:
    """Rewrite `heartbeats/<role>` every `every_s` from a daemon thread, for the process's life.
    Called first thing in a role's `main`, before its slow imports and model load: loading is
    answering too (the thread runs while the main thread works, and stops with the process)."""
    path = heartbeat_path(run_dir, role)
    path.parent.mkdir(parents=True, exist_ok=True)

    def beat() -> None:
        count = 0
        while True:
            count += 1
            try:
                tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps({"pid": os.getpid(), "beat": count, "t": time.time()}))
                os.replace(tmp, path)
            except OSError:
                pass  # a full or vanished disk: the watchdog reports the silence, which is the point
            time.sleep(every_s)

    thread = threading.Thread(target=beat, name=f"heartbeat-{role}", daemon=True)
    thread.start()
    return thread


def start_trainer_heartbeat(run_dir: str | Path) -> threading.Thread:
    """A trainer rank's heartbeat, named as the launcher names the rank (`trainer`, `trainer<r>`)."""
    return start_heartbeat(run_dir, trainer_rank_name(int(os.environ.get("RANK", "0"))))
