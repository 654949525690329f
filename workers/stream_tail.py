"""The actor's stream as the supervisor reads it for the rollout viewer: the file stream
(`stream/rollouts.jsonl`, a `JsonlTail`) or a Redis stream, read the same way.

`RedisStreamTail` has JsonlTail's `peek` / `commit` / `line_no`: a line number is the entry's
0-based place in the stream (what the platform's idempotency key and step need), the offset the
last delivered entry id. Redis being unreachable is not a delivery failure: the run's private
server is not up yet, or has stopped with the run, so there is nothing to read. What the run wrote
after the supervisor's last poll is still in the private server's append-only file: the
supervisor's final drain starts the server again on it (`RunSupervisor.final_drain`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import yaml
from pydantic import ValidationError

from rl_core.config.run_config import StreamConfig  # no torch: the config's models only
from rl_core.common.jsonl_tail import JsonlTail, parse_record
from rl_core.rundir.layout import REDIS_DIR, REDIS_PASSWORD_FILE, ROLLOUTS_FILE, stream_redis_url
from rl_core.rundir.stream import redis_stream_key

logger = logging.getLogger(__name__)


def _next_id(entry_id: str) -> str:
    """The smallest entry id after `entry_id` (XRANGE's start is inclusive)."""
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


class RedisStreamTail:
    def __init__(self, url: str, key: str, embedded_dir: Path | None = None) -> None:
        self.url = url
        self.key = key
        self.embedded_dir = embedded_dir  # the run's private server's data (stream.redis_embedded), else None
        self.offset = "0-0"  # id of the last delivered entry ("0-0": none yet)
        self.line_no = 0
        self.bad_lines = 0
        self._client: Any = None
        self._unreachable = False

    def password(self) -> str | None:
        """A cluster run's server asks for its password on the unix socket too (run_dir.REDIS_PASSWORD_FILE)."""
        if self.embedded_dir is None:
            return None
        try:
            return (self.embedded_dir / REDIS_PASSWORD_FILE).read_text().strip() or None
        except OSError:
            return None

    def peek(self, max_lines: int = 5000, wanted: Callable[[int], bool] | None = None) -> tuple[list[tuple[int, dict[str, Any]]], str, int]:
        """As `JsonlTail.peek`, `wanted` included: an entry it declines is passed over unparsed."""
        import redis

        try:
            if self._client is None:
                self._client = redis.Redis.from_url(self.url, socket_timeout=2, socket_connect_timeout=2,
                                                    password=self.password())
            entries = self._client.xrange(self.key, min=_next_id(self.offset), max="+", count=max_lines)
        except (redis.RedisError, OSError) as exc:
            if not self._unreachable:
                logger.info("rollout stream %s unreachable (%s); nothing to read until it answers", self.url, exc)
            self._unreachable, self._client = True, None
            return [], self.offset, self.line_no
        self._unreachable = False
        records: list[tuple[int, dict[str, Any]]] = []
        offset, line_no = self.offset, self.line_no
        for entry_id, fields in entries:
            if wanted is None or wanted(line_no):
                record = parse_record(fields.get(b"json") or fields.get("json") or b"")
                if record is not None:
                    records.append((line_no, record))
                else:
                    self.bad_lines += 1
            line_no += 1
            offset = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
        return records, offset, line_no

    def commit(self, offset: str, line_no: int) -> None:
        self.offset, self.line_no = offset, line_no

    def has_stream(self) -> bool:
        return True


class FileStreamTail(JsonlTail):
    def has_stream(self) -> bool:
        return self._handle is not None or self.path.exists()  # once opened, the file is there for good (append-only)


def rollouts_tail(run_dir: Path, config_yaml: str) -> FileStreamTail | RedisStreamTail:
    """The tail of the run's stream, from the submitted config's `stream` section."""
    try:
        stream = StreamConfig.model_validate((yaml.safe_load(config_yaml) or {}).get("stream") or {})
    except (yaml.YAMLError, AttributeError, ValidationError):
        stream = StreamConfig()  # not a config the engine would run: its default file stream
    if stream.kind != "redis":
        return FileStreamTail(run_dir / ROLLOUTS_FILE)
    embedded_dir = run_dir / REDIS_DIR if stream.redis_embedded else None
    return RedisStreamTail(stream_redis_url(stream, run_dir), redis_stream_key(run_dir), embedded_dir=embedded_dir)
