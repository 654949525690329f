"""The bench's children (Daphne, ingest, the pages) and the CPU each used, with its PostgreSQL's and
Redis's (bench/platform_scale.py): what the live phase's CPU figures are made of."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from benchlib import REPO_ROOT


class Processes:
    """Children of the bench (Daphne, ingest, clients), each in its own session, with their CPU time."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.children: dict[str, subprocess.Popen] = {}
        self.cpu_s: dict[str, float] = {}
        self.borrowed: set[str] = set()  # adopted: counted here, stopped by the holder that started them

    def adopt(self, name: str, process: subprocess.Popen) -> None:
        """Another holder's process (--smoke's shared web node), counted here as if started here
        (its CPU over a phase is the difference of two readings) and left running by `stop`."""
        self.children[name] = process
        self.borrowed.add(name)

    def start(self, name: str, command: list[str], env: dict[str, str]) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "ab")
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        self.children[name] = process
        return process

    def cpu_of(self, name: str) -> float:
        import psutil

        try:
            process = psutil.Process(self.children[name].pid)
            times = process.cpu_times()
            total = times.user + times.system
            for child in process.children(recursive=True):
                child_times = child.cpu_times()
                total += child_times.user + child_times.system
            return total
        except psutil.NoSuchProcess:
            return self.cpu_s.get(name, 0.0)

    def note_cpu(self) -> None:
        for name in self.children:
            if self.children[name].poll() is None:
                self.cpu_s[name] = self.cpu_of(name)

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout: float = 60) -> None:
        process = self.children[name]
        if process.poll() is None:
            self.cpu_s[name] = self.cpu_of(name)
            if name in self.borrowed:
                return
            os.killpg(process.pid, sig)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)

    def stop_all(self) -> None:
        for name in list(self.children):
            self.stop(name)

    def log_tail(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")[-3000:]


SERVICES_FOLDER: list[Path] = []  # where this bench's PostgreSQL and Redis keep their pid files


def service_cpu_s() -> dict[str, float]:
    """CPU seconds of this bench's PostgreSQL (the postmaster, its live backends and the ended
    ones it reaped) and Redis so far."""
    import psutil

    totals = {"postgres": 0.0, "redis": 0.0}
    if not SERVICES_FOLDER:
        return totals
    folder = SERVICES_FOLDER[0]
    try:
        postmaster = psutil.Process(int((folder / "postgres" / "postmaster.pid").read_text().split()[0]))
        times = postmaster.cpu_times()
        totals["postgres"] = times.user + times.system + times.children_user + times.children_system
        for child in postmaster.children():
            try:
                child_times = child.cpu_times()
                totals["postgres"] += child_times.user + child_times.system
            except psutil.NoSuchProcess:
                pass
        redis_times = psutil.Process(int((folder / "redis.pid").read_text().strip())).cpu_times()
        totals["redis"] = redis_times.user + redis_times.system
    except (OSError, ValueError, psutil.Error):
        pass
    return totals


def own_cpu_s() -> float:
    """CPU seconds of this process: during a live phase, mostly its `ReplayWriter` thread (the
    simulated engines' writes, which share the cores with what the bench measures)."""
    times = os.times()
    return times.user + times.system
