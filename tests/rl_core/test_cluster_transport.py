"""What a cluster run relies on to cross machines, on one machine: the run's Redis on a network
address behind a password (rl_core/rundir/stream.py), and a weight update that ends with an error when
a server goes silent (rl_core/weights/sync.py), with real redis-server and real gloo groups."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
import torch

from rl_core.common.contracts import RolloutSample
from rl_core.rundir.layout import ADVERTISED_ADDRESS_ENV
from rl_core.rundir.stream import STREAM_REDIS_PASSWORD_ENV, RedisStreamReader, RedisStreamWriter, start_redis_server
from rl_core.weights.sync import ParamSpec, WeightBroadcaster, WeightSyncError, create_group


def sample(index: int) -> RolloutSample:
    return RolloutSample(sample_id=f"s{index}", success=True, group_id=f"g{index}", prompt_id="p", prompt_token_ids=[1, 2], completion_token_ids=[3],
                         behaviour_logprobs=[-0.5], token_versions=[0], reward=1.0, advantage=0.0)


def test_a_networked_stream_refuses_clients_without_its_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    process, url = start_redis_server(tmp_path / "redis", bind="127.0.0.1", password="run-secret")
    try:
        assert url.startswith("redis://127.0.0.1:") and "run-secret" not in url
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis.from_url(url).ping()
        assert "run-secret" not in " ".join(str(arg) for arg in process.args)  # not on the command line
        monkeypatch.setenv(STREAM_REDIS_PASSWORD_ENV, "run-secret")
        writer, reader = RedisStreamWriter(url, "k"), RedisStreamReader(url, "k")
        writer.append([sample(0), sample(1)])
        assert [s.group_id for s in reader.read(10, 1.0)] == ["g0", "g1"]
        writer.close()
        reader.close()
    finally:
        process.terminate()
        process.wait()
    with pytest.raises(ValueError, match="password"):
        start_redis_server(tmp_path / "other", bind="127.0.0.1")


class SilentServer:
    """A server that joins the weight group, then stops answering (its machine froze)."""

    name = "http://10.9.9.9:1"

    def __init__(self) -> None:
        self.group: Any = None
        self.release = threading.Event()

    def init_process_group(self, master_address: str, master_port: int, rank: int, world_size: int, backend: str, group_name: str,
                           streams: int = 1) -> None:
        def join() -> None:
            self.group = create_group(backend, master_address, master_port, rank, world_size, timeout_s=60, streams=streams)

        threading.Thread(target=join, daemon=True).start()

    def request_weight_update(self, version: int, params: list[ParamSpec], bucket_bytes: int) -> dict[str, Any]:
        self.release.wait()  # never votes in the handshake, never says why
        return {}

    def close(self) -> None:
        self.release.set()


def test_a_silent_server_ends_the_update_with_an_error_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ADVERTISED_ADDRESS_ENV, "127.0.0.1")
    server = SilentServer()
    broadcaster = WeightBroadcaster(endpoints=[server], backend="gloo", timeout_s=3)
    assert broadcaster.master_address == "127.0.0.1"  # from the environment a cluster run sets
    broadcaster.connect()
    # The group's own timeout is the same 3 s here; the error must be the broadcaster's, naming the server.
    started = time.monotonic()
    with pytest.raises(WeightSyncError, match=r"not completed by http://10.9.9.9:1 within 3 s"):
        broadcaster.broadcast([("w", torch.zeros(4))], version=1)
    assert time.monotonic() - started < 10
    broadcaster.close()
