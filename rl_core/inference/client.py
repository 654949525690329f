"""Async client of the inference HTTP contract (actor, evaluation, tests).

`InferenceClient(url).generate(messages, sampling, n=...)` returns one
`GenerationResult` per completion with token ids, sampling logprobs and the
policy version of every token. Any failure to get a valid answer — server
unreachable, died mid-request, refused the request — raises `ServerError`
naming the server, so the caller can tell which of several servers failed.
"""

from __future__ import annotations

import uuid
from typing import Any

import httpx

from rl_core.common.contracts import GenerationResult, SamplingParams


KEEPALIVE_EXPIRY_S = 2.0  # seconds an idle pooled connection is kept by the client
# Idle connections beyond this many are closed. httpcore (1.0.x) walks every pooled connection,
# and for each idle one every connection again, whenever a request starts or ends: after an
# evaluation's 64 concurrent requests that walk was most of the actor's CPU (py-spy); with this
# bound the 40-step demo's actor used 2.4 CPU-s instead of 5.0. A new localhost connection costs far less.
MAX_IDLE_CONNECTIONS = 8
# Reaching a server at all: a refused or unroutable address fails within this, whatever the request.
CONNECT_DEADLINE_S = 10.0


class ServerError(RuntimeError):
    def __init__(self, url: str, message: str, status: int | None = None) -> None:
        super().__init__(f"inference server {url}: {message}")
        self.url = url
        self.status = status


class InferenceClient:
    """`timeout_s`: the longest one request may take, None for no limit of its own. A run's actor
    passes None: a generation of a large model may rightly take long, and a server that stopped
    answering is caught by the launcher's watchdog (rl_core/launch/watchdog.py: its /health, not the
    request's duration) which fails the run naming it; a standalone caller (the eval CLI, a bench)
    keeps the default."""

    def __init__(self, base_url: str, timeout_s: float | None = 600.0, model: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        # trust_env=False: a proxy from the environment must never sit between us and 127.0.0.1.
        # Idle pooled connections are dropped well before the server's keep-alive timeout
        # (server.SERVER_KEEPALIVE_S), so a request never races the server closing its connection.
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(timeout_s, connect=CONNECT_DEADLINE_S), trust_env=False,
            limits=httpx.Limits(keepalive_expiry=KEEPALIVE_EXPIRY_S, max_keepalive_connections=MAX_IDLE_CONNECTIONS),
        )
        self._model = model

    async def _request(self, method: str, route: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            response = await self._http.request(method, route, json=body)
        except httpx.HTTPError as exc:
            raise ServerError(self.base_url, f"{method} {route} failed: {exc!r}") from exc
        if response.status_code != 200:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text[:500]
            raise ServerError(self.base_url, f"{method} {route} -> {response.status_code}: {message}", response.status_code)
        try:
            return response.json()
        except ValueError as exc:
            raise ServerError(self.base_url, f"{method} {route} returned invalid JSON") from exc

    async def model_name(self) -> str:
        if self._model is None:
            listing = await self._request("GET", "/v1/models")
            self._model = str(listing["data"][0]["id"])
        return self._model

    async def health(self) -> dict[str, Any]:
        return await self._request("GET", "/health")

    async def abort(self, request_ids: list[str]) -> list[str]:
        """Abort requests by id or by the `request_id_prefix` given to `generate`."""
        return list((await self._request("POST", "/abort", {"request_ids": list(request_ids)}))["aborted"])

    async def generate(
        self,
        messages: list[dict[str, str]],
        sampling: SamplingParams,
        n: int = 1,
        prompt_id: str | None = None,
        request_id_prefix: str | None = None,
        prompt_token_ids: list[int] | None = None,
    ) -> list[GenerationResult]:
        """`prompt_token_ids` (with `messages` empty): a token prompt, sent as is (a trajectory's next turn)."""
        body: dict[str, Any] = {
            "model": await self.model_name(),
            "messages": messages,
            "n": n,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_new_tokens,
            "logprobs": True,
            "request_id": request_id_prefix or f"req-{uuid.uuid4().hex}",
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop_token_ids:
            body["stop_token_ids"] = list(sampling.stop_token_ids)
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if prompt_id is not None:
            body["prompt_id"] = prompt_id
        if prompt_token_ids is not None:
            body["prompt_token_ids"] = list(prompt_token_ids)
        if sampling.priority:
            body["priority"] = sampling.priority
        data = await self._request("POST", "/v1/chat/completions", body)
        try:
            prompt_token_ids = [int(token) for token in data["prompt_token_ids"]]
            results = []
            for choice in sorted(data["choices"], key=lambda choice: choice["index"]):
                content = (choice.get("logprobs") or {}).get("content") or []
                results.append(
                    GenerationResult(
                        request_id=str(choice.get("request_id", f"{body['request_id']}-{choice['index']}")),
                        prompt_token_ids=prompt_token_ids,
                        token_ids=[int(token) for token in choice["token_ids"]],
                        logprobs=[float(item["logprob"]) for item in content],
                        token_versions=[int(version) for version in choice["token_versions"]],
                        finish_reason=str(choice["finish_reason"]),
                        text=choice["message"]["content"] or "",
                        stop_reason=choice["stop_reason"] if isinstance(choice.get("stop_reason"), str) else None,
                    )
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise ServerError(self.base_url, f"malformed completion response: {exc!r}") from exc
        return results

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> InferenceClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
