"""A stand-in role for tests/rl_core/test_role_forks.py, run as `python -m tests.rl_core.forked_role_probe
ACTION [ARG]`: `report` prints what a fresh role would see of its start, then exits with ARG;
`sleep` prints its pid and sleeps ARG seconds; `lock` makes a multiprocessing lock and exits."""

from __future__ import annotations

import json
import multiprocessing
import os
import sys
import time
from pathlib import Path


def main(argv: list[str]) -> int:
    action, arg = argv[0], (argv[1] if len(argv) > 1 else "0")
    if action == "report":
        print(json.dumps({
            "argv0": sys.argv[0], "argv": sys.argv[1:], "name": __name__,
            "probe_env": os.environ.get("PROBE_ENV"), "launcher_only": os.environ.get("LAUNCHER_ONLY"),
            "start_method": multiprocessing.get_start_method(),
            "cmdline": Path("/proc/self/cmdline").read_text().replace("\0", " ").strip(), "sigint_ignored": __import__("signal").getsignal(2) == __import__("signal").SIG_IGN,
        }))
        print("to stderr", file=sys.stderr)
        return int(arg)
    if action == "sleep":
        print(os.getpid(), flush=True)
        time.sleep(float(arg))
        return 0
    if action == "lock":
        lock = multiprocessing.RLock()
        print(lock._semlock.name)  # None: unlinked at once, as under the fork start method
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
