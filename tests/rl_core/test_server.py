"""Reference-server specifics beyond the shared contract: the CLI, HistoSpec wiring with the
real drafter, and what a client sees when its server dies."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from engine_kinds import start_server  # tests/rl_core is on sys.path (rootdir-relative test modules)
from rl_core.inference.client import InferenceClient, ServerError
from rl_core.common.contracts import SamplingParams

MESSAGES = [{"role": "user", "content": "Compute 12 + 30."}]


def test_serve_refuses_a_missing_model_dir(tmp_path: Path) -> None:
    missing = tmp_path / "no-model"
    completed = subprocess.run(
        [sys.executable, "-m", "rl_core", "serve", "--model", str(missing), "--port", "0"],
        capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 2
    assert str(missing) in completed.stderr and "config.json" in completed.stderr


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", trust_env=False).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"metric {name} missing")


def test_histospec_server_drafts_from_history_and_client_sees_server_death(untrained_tiny_model: Path) -> None:
    server = start_server("reference", untrained_tiny_model, histospec=True, max_batch_size=4)
    try:
        async def repeat_prompt():
            async with InferenceClient(server.url) as client:
                greedy = SamplingParams(temperature=0.0, max_new_tokens=40)
                first = await client.generate(MESSAGES, greedy, prompt_id="problem-42")
                second = await client.generate(MESSAGES, greedy, prompt_id="problem-42")
                return first[0], second[0]

        first, second = asyncio.run(asyncio.wait_for(repeat_prompt(), 180))
        # Lossless: drafting from the first response changes nothing in the greedy output ...
        assert second.token_ids == first.token_ids
        # ... and the second pass really was drafted from the first response's history.
        assert metric(server.url, "inflight_spec_accepted_tokens_total") >= len(first.token_ids) // 2
        assert metric(server.url, "inflight_spec_drafted_tokens_total") > 0

        async def die_mid_request():
            async with InferenceClient(server.url) as client:
                # 16 samples: the response waits for all of them, so one sampling an early EOS
                # cannot finish the request before the kill.
                task = asyncio.create_task(client.generate(MESSAGES, SamplingParams(temperature=1.0, max_new_tokens=900), n=16))
                while (await client.health())["running"] == 0:
                    await asyncio.sleep(0.01)
                server.process.kill()
                return await task

        with pytest.raises(ServerError, match=server.url.removeprefix("http://")):
            asyncio.run(asyncio.wait_for(die_mid_request(), 180))
    finally:
        server.stop()


def test_a_burst_of_requests_leaves_few_idle_connections_in_the_client_pool(untrained_tiny_model: Path) -> None:
    """httpcore walks every pooled connection (and, per idle one, every one again) whenever a
    request starts or ends; an evaluation's burst of concurrent requests used to leave all its
    connections idle in the pool, which made that walk most of the actor's CPU."""
    from rl_core.inference.client import MAX_IDLE_CONNECTIONS

    server = start_server("reference", untrained_tiny_model, max_batch_size=32)
    try:
        async def burst() -> int:
            async with InferenceClient(server.url) as client:
                short = SamplingParams(temperature=1.0, max_new_tokens=4)
                results = await asyncio.gather(*(client.generate(MESSAGES, short) for _ in range(24)))
                assert all(len(result) == 1 for result in results)
                return len(client._http._transport._pool.connections)  # the pool httpx keeps (private)

        assert asyncio.run(asyncio.wait_for(burst(), 180)) <= MAX_IDLE_CONNECTIONS
    finally:
        server.stop()
