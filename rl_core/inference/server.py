"""HTTP server around one ReferenceEngine: the inference contract of docs/ARCHITECTURE.md.

`python -m rl_core serve --model DIR --port 0` starts it on 127.0.0.1 and
prints `INFLIGHT_SERVER_READY <url>` once it accepts connections. Requests are
validated here (400 with `{"error": {"message": ...}}` naming the field) before
anything reaches the engine; the engine runs in its own thread and the event
loop only waits on its futures, so weight updates and aborts are served while
generation runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Literal

import torch
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from rl_core.common.contracts import GenerationResult, SamplingParams
from rl_core.inference.engine import EngineConfig, ReferenceEngine
from rl_core.common.processes import freeze_startup_objects, run_event_loop
from rl_core.rundir.layout import ready_line
from rl_core.weights.handoff import SegmentReceiver
from rl_core.weights.sync import DEFAULT_BUCKET_BYTES, MAX_STREAMS, WeightReceiver


# Cumulative engine counters /health reports beside the spec_* ones (the actor logs their deltas).
HEALTH_COUNTERS = ("prompt_tokens_shared", "prompt_tokens_retained")


class _Body(BaseModel):
    # Unknown fields are refused by name instead of silently ignored.
    model_config = ConfigDict(extra="forbid")


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant"] = Field(description="Who speaks.")
    content: str = Field(description="The message text.")
    name: str | None = Field(None, description="Optional speaker name (ignored by the template).")


class ChatCompletionRequest(_Body):
    model: str = Field(description="Served model name (GET /v1/models).")
    messages: list[ChatMessage] = Field(
        default_factory=list, description="The conversation, rendered by the tokenizer's chat template (or prompt_token_ids).")
    prompt_token_ids: list[int] | None = Field(
        None, min_length=1,
        description="Extension: the prompt as token ids instead of messages (a multi-turn trajectory's next turn: "
        "the previous prompt + the model's tokens + the tool output's tokens, exactly as sampled; no template).")
    n: int = Field(1, ge=1, le=256, description="Completions for this prompt.")
    temperature: float = Field(1.0, ge=0.0, description="Sampling temperature; 0 = greedy.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus mass.")
    max_tokens: int | None = Field(None, ge=1, description="Most generated tokens per completion.")
    max_completion_tokens: int | None = Field(None, ge=1, description="OpenAI's newer name for max_tokens.")
    seed: int | None = Field(None, ge=0, description="Seed; completion i uses seed + i.")
    logprobs: bool = Field(False, description="Return logprobs.content per completion.")
    top_logprobs: int | None = Field(None, ge=0, le=0, description="Only 0 is supported (no alternatives are kept).")
    stream: bool = Field(False, description="Streaming is not supported; must be false.")
    stop_token_ids: list[int] = Field(default_factory=list, description="Extra token ids that end a completion.")
    stop: str | list[str] | None = Field(
        None, description="Texts that end a completion once its generated text contains one (OpenAI's and vLLM's `stop`); "
        "the token that completed it is the last returned (its text included), and the choice's `stop_reason` names it.")
    prompt_id: str | None = Field(None, description="History key (HistoSpec / HistoPipe): the same problem shares it across epochs.")
    request_id: str | None = Field(None, description="Prefix of the engine request ids (`<request_id>-<i>`), for POST /abort.")
    priority: int = Field(0, description="Admission order when the engine is full: lower first, then arrival (as vLLM's `priority`).")
    user: str | None = Field(None, description="Ignored (OpenAI compatibility).")


class InitProcessGroupRequest(_Body):
    master_address: str = Field(description="Host of the trainer's TCPStore.")
    master_port: int = Field(ge=1, le=65535, description="Port of the trainer's TCPStore.")
    rank: int = Field(ge=1, description="This server's rank (the trainer is 0).")
    world_size: int = Field(ge=2, description="Trainer + all servers.")
    backend: Literal["gloo", "nccl"] = Field("gloo", description="gloo on CPU, nccl on GPU.")
    group_name: str = Field("inflight-weights", description="Label of the group.")
    streams: int = Field(1, ge=1, le=MAX_STREAMS, description="Process groups the buckets are spread over (bucket k on k % streams).")


class WeightUpdateRequest(_Body):
    version: int = Field(ge=0, description="Policy version the new weights are.")
    params: list[dict[str, Any]] = Field(min_length=1, description="[{name, dtype, shape}] in broadcast order.")
    bucket_bytes: int = Field(DEFAULT_BUCKET_BYTES, ge=1, description="Bucket size the trainer packs with.")
    segment: dict[str, Any] | None = Field(
        None, description="Same-device handoff (weight_handoff.py): the trainer's segment {kind, name, nbytes[, cuda_ipc]} "
        "holding the weights; no process group is involved. Absent: the weights come over the process group.")


class AbortRequest(_Body):
    request_ids: list[str] = Field(description="Request ids, or prefixes given as `request_id` (aborts all `<prefix>-<i>`).")


def error_response(status: int, message: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": "invalid_request_error", "code": status}})


def validation_message(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in item['loc']) or 'body'}: {item['msg']}" for item in error.errors()
    )


async def parse_body(request: Request, model: type[_Body]) -> _Body | JSONResponse:
    try:
        data = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return error_response(400, f"request body is not valid JSON: {exc}")
    if not isinstance(data, dict):
        return error_response(400, "request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        return error_response(400, validation_message(exc))


class EngineCollector:
    """Prometheus view of `engine.stats()`, read at scrape time."""

    COUNTERS = {
        "generated_tokens": ("inflight_tokens_generated", "Tokens sampled."),
        "prompt_tokens": ("inflight_prompt_tokens", "Prompt tokens prefilled."),
        "prompt_tokens_shared": ("inflight_prompt_tokens_shared", "Prompt tokens copied from a cached prompt (the same prompt, or the same start) instead of prefilled."),
        "requests_finished": ("inflight_requests_finished", "Requests finished (any reason)."),
        "requests_aborted": ("inflight_requests_aborted", "Requests aborted."),
        "steps": ("inflight_engine_steps", "Decode loop steps."),
        "spec_drafted_tokens": ("inflight_spec_drafted_tokens", "Speculative tokens drafted."),
        "spec_accepted_tokens": ("inflight_spec_accepted_tokens", "Speculative tokens accepted."),
        "spec_verify_steps": ("inflight_spec_verify_steps", "Sequence-steps that verified a non-empty draft."),
        "weight_updates": ("inflight_weight_updates", "In-flight weight updates applied."),
        "prompt_tokens_retained": ("inflight_prompt_tokens_retained", "Of the prompt tokens shared, those copied from a finished sequence's kept K/V (a tool call's next turn)."),
        "decode_rows_shared": ("inflight_decode_rows_shared", "Decode rows not computed: the sequence's history was another's this step."),
    }
    GAUGES = {
        "running": ("inflight_requests_running", "Sequences in the running batch."),
        "waiting": ("inflight_requests_waiting", "Requests waiting for a slot."),
        "version": ("inflight_policy_version", "Policy version of the current weights."),
        "last_update_pause_s": ("inflight_weight_update_pause_seconds", "Decode pause of the last weight update."),
    }

    def __init__(self, engine: ReferenceEngine) -> None:
        self.engine = engine

    def collect(self):
        # Another engine behind create_app (vLLM) may not count everything: expose what it has.
        stats = self.engine.stats()
        for key, (name, help_text) in self.COUNTERS.items():
            if key in stats:
                yield CounterMetricFamily(name, help_text, value=float(stats[key]))
        for key, (name, help_text) in self.GAUGES.items():
            if key in stats:
                yield GaugeMetricFamily(name, help_text, value=float(stats[key]))


def create_app(engine: ReferenceEngine, model_name: str, receiver: WeightReceiver | None = None) -> FastAPI:
    app = FastAPI(title="Inflight inference server")
    # Another engine's receiver (vLLM's workers) takes updates over the process group only.
    segment_receiver = SegmentReceiver(engine) if receiver is None else None
    receiver = receiver or WeightReceiver(engine)
    registry = CollectorRegistry()
    registry.register(EngineCollector(engine))
    tokenizer = engine.tokenizer
    token_texts = TokenTexts(tokenizer)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return error_response(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        return error_response(500, f"internal error: {exc!r}")

    @app.get("/health")
    async def health() -> dict[str, Any]:
        stats = engine.stats()
        # spec_* counters are cumulative; the actor turns deltas of them into spec/* metrics.
        # prompt_tokens_shared (prompt K/V copied, not computed) becomes env/prefix_reuse_tokens.
        spec = {key: value for key, value in stats.items() if key.startswith("spec_") or key in HEALTH_COUNTERS}
        return {"status": "ok", "version": engine.version, "running": stats["running"], "waiting": stats["waiting"],
                "engine": "reference", "counters": spec}

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "inflight"}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await parse_body(request, ChatCompletionRequest)
        if isinstance(body, JSONResponse):
            return body
        if body.model != model_name:
            return error_response(404, f"model {body.model!r} not found; this server serves {model_name!r}")
        if body.stream:
            return error_response(400, "stream: streaming responses are not supported")
        max_tokens = body.max_completion_tokens or body.max_tokens or 256
        if (body.prompt_token_ids is None) == (not body.messages):
            return error_response(400, "messages: give either messages or prompt_token_ids, not both or neither")
        if body.prompt_token_ids is not None:
            prompt = list(body.prompt_token_ids)  # the engine refuses ids outside the vocabulary (400 below)
        else:
            messages = [{"role": message.role, "content": message.content} for message in body.messages]
            try:
                encoded = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            except Exception as exc:  # a template that cannot render these messages
                return error_response(400, f"messages: the chat template failed: {exc}")
            prompt = list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)
        prefix = body.request_id or f"chatcmpl-{uuid.uuid4().hex}"
        futures = []
        try:
            for index in range(body.n):
                params = SamplingParams(
                    temperature=body.temperature,
                    top_p=body.top_p,
                    max_new_tokens=max_tokens,
                    stop_token_ids=list(body.stop_token_ids),
                    stop=[body.stop] if isinstance(body.stop, str) else list(body.stop or []),
                    seed=None if body.seed is None else body.seed + index,
                    priority=body.priority,
                )
                futures.append(engine.submit(prompt, params, request_id=f"{prefix}-{index}", history_key=body.prompt_id))
        except ValueError as exc:
            for future_index in range(len(futures)):
                engine.abort(f"{prefix}-{future_index}")
            return error_response(400, str(exc))
        results = await _wait_or_abort(engine, request, futures, [f"{prefix}-{i}" for i in range(body.n)])
        if results is None:
            return error_response(499, "client disconnected; requests aborted")
        # A JSONResponse of plain dicts and lists: FastAPI's jsonable_encoder walk over every
        # token's logprob entry is skipped (the content is JSON-ready as built).
        return JSONResponse(_completion_json(prefix, model_name, prompt, results, body.logprobs, token_texts))

    @app.post("/abort")
    async def abort(request: Request):
        body = await parse_body(request, AbortRequest)
        if isinstance(body, JSONResponse):
            return body
        aborted = []
        in_flight = engine.in_flight_ids()
        for request_id in body.request_ids:
            for candidate in [request_id] + [rid for rid in in_flight if rid.startswith(request_id + "-")]:
                if engine.abort(candidate):
                    aborted.append(candidate)
        return {"aborted": aborted}

    @app.post("/init_process_group")
    async def init_process_group(request: Request):
        body = await parse_body(request, InitProcessGroupRequest)
        if isinstance(body, JSONResponse):
            return body
        try:
            await asyncio.to_thread(
                receiver.init_process_group, body.master_address, body.master_port, body.rank, body.world_size, body.backend,
                streams=body.streams,
            )
        except ValueError as exc:
            return error_response(400, str(exc))
        except RuntimeError as exc:  # rendezvous timeout / connection refused
            return error_response(503, f"could not join the process group: {exc}")
        return {"status": "ok", "rank": body.rank, "world_size": body.world_size}

    @app.post("/request_weight_update")
    async def request_weight_update(request: Request):
        body = await parse_body(request, WeightUpdateRequest)
        if isinstance(body, JSONResponse):
            return body
        if body.segment is not None:
            if segment_receiver is None:
                return error_response(400, "segment: this server takes weight updates over the process group only "
                                      "(inference.weight_handoff: collective)")
            try:
                pause_s = await asyncio.to_thread(segment_receiver.receive, body.version, body.params, body.segment)
            except ValueError as exc:
                return error_response(400, str(exc))
            return {"version": engine.version, "pause_s": pause_s}
        if receiver.group is None:
            return error_response(409, "no process group: POST /init_process_group first")
        try:
            # Validation happens inside: a refusal is agreed with the trainer in the group.
            pause_s = await asyncio.to_thread(receiver.receive, body.version, body.params, body.bucket_bytes)
        except ValueError as exc:
            return error_response(400, str(exc))
        except RuntimeError as exc:
            return error_response(503, f"weight broadcast failed: {exc}")
        return {"version": engine.version, "pause_s": pause_s}

    return app


async def _wait_or_abort(
    engine: ReferenceEngine, request: Request, futures: list, request_ids: list[str]
) -> list[GenerationResult] | None:
    """Wait for the engine; if the client goes away first, abort its requests (tail batching
    relies on this) and return None.

    The disconnect is awaited, not polled: polling `is_disconnected()` woke every waiting
    request 5 times a second, and with an eval's 64 requests in flight those wake-ups took
    the GIL from the engine's decode thread in the same process."""
    gathered = asyncio.gather(*(asyncio.wrap_future(future) for future in futures))
    disconnected = asyncio.ensure_future(_client_gone(request))
    try:
        await asyncio.wait({gathered, disconnected}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        disconnected.cancel()
    if gathered.done():
        return gathered.result()
    for request_id in request_ids:
        engine.abort(request_id)
    # Not cancelled: the engine ends each aborted request itself (vLLM counts an abort only
    # when its generate loop ends that way); the results are dropped, their errors read.
    gathered.add_done_callback(lambda done: done.cancelled() or done.exception())
    return None


async def _client_gone(request: Request) -> None:
    """Return once the client has closed the connection. The body was read already, so the
    ASGI server's next receive() message is the disconnect; it blocks until then."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class TokenTexts:
    """Each token id's text and UTF-8 bytes for the OpenAI `logprobs.content` entries, decoded
    once per id. Decoding every generated token anew cost the server process a slice of every
    step (the event loop shares the GIL with the engine's decode thread)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token: int) -> tuple[str, list[int]]:
        entry = self.cache.get(token)
        if entry is None:
            text = self.tokenizer.decode([token])
            entry = self.cache[token] = (text, list(text.encode("utf-8")))
        return entry


def _completion_json(
    prefix: str, model_name: str, prompt: list[int], results: list[GenerationResult], with_logprobs: bool,
    token_texts: TokenTexts,
) -> dict[str, Any]:
    choices = []
    for index, result in enumerate(results):
        logprobs = None
        if with_logprobs:
            content = []
            for token, logprob in zip(result.token_ids, result.logprobs):
                text, utf8 = token_texts(token)
                content.append({"token": text, "logprob": logprob, "bytes": utf8, "top_logprobs": []})
            logprobs = {"content": content}
        choices.append(
            {
                "index": index,
                "message": {"role": "assistant", "content": result.text},
                "finish_reason": result.finish_reason,
                "stop_reason": result.stop_reason,
                "logprobs": logprobs,
                "token_ids": result.token_ids,
                "token_versions": result.token_versions,
                "request_id": result.request_id,
            }
        )
    completion_tokens = sum(len(result.token_ids) for result in results)
    return {
        "id": prefix,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": choices,
        "prompt_token_ids": prompt,
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion_tokens, "total_tokens": len(prompt) + completion_tokens},
    }



SERVER_KEEPALIVE_S = 30  # idle keep-alive of the HTTP server, well above client.KEEPALIVE_EXPIRY_S


def bind_listening_socket(host: str, port: int) -> socket.socket | None:
    """Bind before serving so port 0 resolves to the real port the READY line announces;
    None (with the reason on stderr) when the address is taken."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        print(f"cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        sock.close()
        return None
    return sock


async def serve_until_stopped(app: Any, sock: socket.socket) -> None:
    """Serve `app` on `sock` with uvicorn; print `INFLIGHT_SERVER_READY <url>` once it accepts
    connections (the launcher and the tests wait for that line)."""
    import uvicorn

    host, port = sock.getsockname()[:2]
    # The server keeps idle connections longer than clients do (client.KEEPALIVE_EXPIRY_S):
    # a client must never send on a pooled connection the server is closing at that instant
    # (the request is lost with httpx.ReadError before the server sees it).
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5, timeout_keep_alive=SERVER_KEEPALIVE_S))

    async def announce() -> None:
        while not server.started:
            await asyncio.sleep(0.02)
        print(ready_line(f"http://{host}:{port}"), flush=True)

    announcer = asyncio.create_task(announce())
    try:
        await server.serve(sockets=[sock])
    finally:
        announcer.cancel()

def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_core serve", description="Serve one reference engine over HTTP.")
    parser.add_argument("--model", required=True, help="Local HF model directory.")
    parser.add_argument("--served-model-name", default=None, help="Name clients pass as `model` (default: the directory name).")
    parser.add_argument("--host", default="127.0.0.1", help="Interface to listen on.")
    parser.add_argument("--port", type=int, default=0, help="Port (0 = pick a free one).")
    parser.add_argument("--device", default="cpu", help="Torch device: cpu, cuda, cuda:1, ...")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="Parameter dtype.")
    parser.add_argument("--max-batch-size", type=int, default=64, help="Most sequences decoded together.")
    parser.add_argument("--max-seq-len", type=int, default=None, help="Longest prompt+response (default: model limit, at most 4096).")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU).")
    parser.add_argument("--seed", type=int, default=0, help="Seed for requests without one.")
    parser.add_argument("--histospec", action="store_true", help="Speculative decoding drafted from each prompt's earlier responses.")
    parser.add_argument("--run-dir", default=None,
                        help="A run's server: every setting above but --model/--host/--port comes from DIR/config.yaml.")
    parser.add_argument("--server-index", type=int, default=0, help="With --run-dir: which of the run's servers this is.")
    args = parser.parse_args(argv)

    drafter = None
    if args.run_dir:
        from rl_core.config.files import ConfigError
        from rl_core.config.engine import engine_config_for
        from rl_core.rundir.layout import load_run_config

        try:
            config = load_run_config(args.run_dir)
        except ConfigError as exc:
            print(f"--run-dir: {exc}", file=sys.stderr)
            return 2
        args.device, args.dtype, args.threads = config.inference.device, config.model.dtype, config.inference.threads_per_server
        engine_config = engine_config_for(config, args.server_index)
        args.seed = engine_config.seed
        histospec = config.accelerations.histospec
    else:  # standalone: the flags
        from rl_core.config.run_config import HistoSpecConfig

        engine_config = EngineConfig(max_batch_size=args.max_batch_size, max_seq_len=args.max_seq_len, seed=args.seed)
        histospec = HistoSpecConfig(enabled=args.histospec)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if histospec.enabled:
        from rl_core.inference.speculation import make_drafter

        drafter = make_drafter(histospec)
    try:
        engine = ReferenceEngine.from_pretrained(args.model, device=args.device, dtype=args.dtype, config=engine_config, drafter=drafter)
    except (OSError, ValueError) as exc:
        print(f"cannot load model {args.model}: {exc}", file=sys.stderr)
        return 2
    if args.run_dir:  # the run page's Timeline: this server's decode spans and pauses
        from rl_core.rundir.timeline import ServerTimeline, TimelineWriter

        engine.timeline = ServerTimeline(TimelineWriter(args.run_dir, "server", f"server{args.server_index}"))
    model_name = args.served_model_name or Path(args.model).resolve().name
    app = create_app(engine, model_name)

    sock = bind_listening_socket(args.host, args.port)
    if sock is None:
        return 2

    async def serve() -> None:
        await serve_until_stopped(app, sock)

    freeze_startup_objects()
    engine.start()
    try:
        run_event_loop(serve())
    finally:
        engine.stop()
    return 0
