"""Set-up shared by the bench scripts: import it first (`import benchlib`, the scripts' own
folder is on sys.path when run as `python bench/NAME.py`).

- puts the checkout (`rl_core`, `workers`) and `platform/` (`inflight`) on sys.path, so a bench
  runs from a checkout with or without the editable install;
- `platform_services`: a private embedded PostgreSQL + Redis with Django set up on them;
- `start_reference_server`: a real `python -m rl_core serve` process;
- workloads and measurements more than one bench uses: the long-tailed length profile (tail
  batching, HistoPipe), metric points and the WebSocket latency probe (ingest, rollouts), the
  ~125M model and the weight-update measurements (reference and vLLM weight updates).

- `parse_bench_args`: every bench's `--smoke` flag (its smallest real settings: CI runs them all,
  bench/smoke.py), and `smoke_demo_config`, the demo's config at its smallest real settings for
  the benches that run the demo.

Run as a script only as the bare receiver of `bare_broadcast` (`--bare-receiver`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

REPO_ROOT = Path(__file__).resolve().parent.parent
for _path in (REPO_ROOT / "platform", REPO_ROOT):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

# torch and Django are imported where used: the platform benches need no torch, the engine
# benches no Django.
from rl_core.config.run_config import DEFAULT_TINY_MODEL_DIR  # noqa: E402
from rl_core.common.processes import free_port  # noqa: E402
from tests.rl_core.server_process import ServerProcess, start_server_process  # noqa: E402  (the tests' server handle)

if TYPE_CHECKING:
    import torch


# --- --smoke: every bench at its smallest real settings (bench/smoke.py, `make bench-smoke`) ---


def parse_bench_args(parser: argparse.ArgumentParser, smoke: dict[str, object], argv: list[str] | None = None) -> argparse.Namespace:
    """`parser.parse_args` plus `--smoke`: the bench's smallest real settings, seconds, the same code
    path. `smoke` maps argument names (dest) to their values then; a flag given on the command
    line still wins. The benches that need more than flags read `args.smoke` themselves."""
    flags = []
    for dest, value in smoke.items():
        flag = "--" + dest.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, (list, tuple)):
            flags += [f"{flag} {item}" for item in value]
        elif value is not False:
            flags.append(f"{flag} {value}")
    parser.add_argument("--smoke", action="store_true",
                        help=f"Smallest real settings, seconds (CI's `make bench-smoke`): {' '.join(flags) or 'see the docstring'}.")
    if parser.parse_known_args(argv)[0].smoke:
        parser.set_defaults(**smoke)
    return parser.parse_args(argv)


# The demo (examples/tiny-cpu.yaml) at its smallest real settings: every role, a held-out
# evaluation at step 0, mid-run and at the end, a few optimizer steps (the first is a start-up
# step: a per-step time needs three).
DEMO_CONFIG = REPO_ROOT / "examples" / "tiny-cpu.yaml"
SMOKE_DEMO_OVERRIDES = (
    "trainer.max_steps=4", "trainer.samples_per_step=16", "trainer.warmup_steps=1", "trainer.checkpoint_every=0",
    "actor.groups_in_flight=2", "task.heldout_size=8", "eval.heldout_k=1", "eval.heldout_every_n_steps=2",
)


def demo_config_data(smoke: bool, config: Path = DEMO_CONFIG) -> dict:
    """`config` (by default the demo's) as a dict, with SMOKE_DEMO_OVERRIDES applied under --smoke."""
    import yaml

    from rl_core.config.files import apply_overrides

    return apply_overrides(yaml.safe_load(Path(config).read_text()), list(SMOKE_DEMO_OVERRIDES) if smoke else [])


def smoke_demo_config(folder: Path, config: Path = DEMO_CONFIG) -> Path:
    """`config` with SMOKE_DEMO_OVERRIDES applied, written into `folder`; its path."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"smoke-{Path(config).name}"
    path.write_text(yaml.safe_dump(demo_config_data(True, config), sort_keys=False))
    return path


# --- processes ---------------------------------------------------------------------------


def run_cli(config: str | Path, out: Path, overrides: list[str] | tuple[str, ...] = (), env: dict[str, str] | None = None) -> list[dict]:
    """The product's own run, as a user starts it: `python -m rl_core run CONFIG --out OUT --quiet
    --set ...` from the checkout; its metrics.jsonl records. A failed run ends the bench with its
    output's tail."""
    from tests.metrics_file import read_metrics

    command = [sys.executable, "-m", "rl_core", "run", str(config), "--out", str(out), "--quiet"]
    for item in overrides:
        command += ["--set", item]
    result = subprocess.run(command, cwd=REPO_ROOT, env={**os.environ, **(env or {})}, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command[1:])} failed ({result.returncode}):\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return read_metrics(out / "metrics.jsonl")


@contextmanager
def platform_services(name: str, fast_unsafe: bool = False) -> Iterator[None]:
    """Embedded PostgreSQL + Redis under var/bench-NAME/PID, their settings in the environment,
    Django set up and migrated; everything stopped and removed on exit."""
    from inflight.devservices import start_services, stop_services

    folder = REPO_ROOT / "var" / f"bench-{name}" / str(os.getpid())
    # A bench stopped by SIGTERM (`timeout`, `kill`, CI's cap) unwinds through the `finally` below
    # instead of dying in place and leaving its PostgreSQL, Redis and children running.
    on_term = signal.signal(signal.SIGTERM, _exit_on_signal) if threading.current_thread() is threading.main_thread() else None
    services_info = start_services(folder, postgres_port=free_port(), redis_port=free_port(), fast_unsafe=fast_unsafe)
    try:
        os.environ.update(services_info.env())
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "inflight.settings")
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        yield
    finally:
        from django.db import connections

        connections.close_all()
        stop_services(folder, only=services_info.started)
        shutil.rmtree(folder, ignore_errors=True)
        if on_term is not None:
            signal.signal(signal.SIGTERM, on_term)


def _exit_on_signal(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)


def tiny_or_given_model(path: str | Path) -> Path:
    """The model directory at `path`; the default tiny model (var/models/tiny) is built there first
    if missing, any other directory is the caller's own."""
    from rl_core.models.tiny_model import ensure_tiny_model

    path = Path(path)
    return ensure_tiny_model(path) if path.resolve() == (REPO_ROOT / DEFAULT_TINY_MODEL_DIR).resolve() else path


def start_reference_server(model_dir: Path, timeout_s: float = 300.0, **flags: object) -> ServerProcess:
    """`python -m rl_core serve --model DIR --port 0 --threads 1` plus `--flag value` per keyword."""
    command = [sys.executable, "-m", "rl_core", "serve", "--model", str(model_dir), "--port", "0", "--threads", "1"]
    for key, value in flags.items():
        command += ["--" + key.replace("_", "-"), str(value)]
    return start_server_process(command, timeout_s, what="reference server")


# --- long-tailed response lengths (tail batching, HistoPipe) ------------------------------

PROMPT_LEN = 24  # tokens per synthetic prompt; their content does not matter with EOS disabled


@dataclass
class LengthProfile:
    """Long-tailed response lengths. A prompt is long with probability `long_fraction`; each
    response is its prompt's base length × log-normal noise, and with probability
    `runaway_fraction` a response runs `runaway_factor` times longer (the per-response tail)."""

    short_range: tuple[int, int] = (12, 40)
    long_range: tuple[int, int] = (120, 240)
    long_fraction: float = 0.15
    noise_sigma: float = 0.3
    runaway_fraction: float = 0.04
    runaway_factor: float = 4.0
    max_len: int = 320
    seed: int = 0

    @classmethod
    def scaled(cls, factor: float, seed: int = 0) -> LengthProfile:
        """The default profile with every length times `factor` (--smoke: shorter responses, the same shape)."""
        default = cls()
        return cls(short_range=(max(4, round(default.short_range[0] * factor)), max(4, round(default.short_range[1] * factor))),
                   long_range=(max(4, round(default.long_range[0] * factor)), max(4, round(default.long_range[1] * factor))),
                   max_len=max(4, round(default.max_len * factor)), seed=seed)

    def base(self, prompt_id: str) -> float:
        rng = random.Random(f"{self.seed}:base:{prompt_id}")
        low, high = self.long_range if rng.random() < self.long_fraction else self.short_range
        return rng.uniform(low, high)

    def length(self, prompt_id: str, response_key: int, attempt: int) -> int:
        rng = random.Random(f"{self.seed}:resp:{prompt_id}:{response_key}:{attempt}")
        value = self.base(prompt_id) * math.exp(rng.gauss(0.0, self.noise_sigma))
        if rng.random() < self.runaway_fraction:
            value *= self.runaway_factor
        return int(min(self.max_len, max(4, round(value))))


def load_model_without_eos(model_dir: Path) -> torch.nn.Module:
    """The tiny model with every end-of-sequence id removed, so a request decodes exactly
    `max_new_tokens` tokens (the engine reads stop ids from the model's configs)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    model.config.eos_token_id = None
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = None
    return model


def prompt_tokens(prompt_id: str, vocab_size: int) -> list[int]:
    rng = random.Random(zlib.crc32(prompt_id.encode()))
    return [rng.randrange(3, vocab_size) for _ in range(PROMPT_LEN)]


def prepare_model(args: argparse.Namespace) -> torch.nn.Module:
    import torch

    torch.set_num_threads(args.threads)
    return load_model_without_eos(tiny_or_given_model(args.model))


# --- metric points and the live WebSocket latency (ingest, rollouts) -----------------------


@contextmanager
def live_run(owner, name: str, config: dict | None = None, worker_name: str = "bench@localhost") -> Iterator:
    """A run through the life a worker gives it: submitted (`services.create_run`, its checks and
    the per-user active-run limit), claimed, running while the block ingests into it, then
    succeeded, so a bench measures any number of runs one after the other as a user's runs come
    and go (INFLIGHT_MAX_ACTIVE_RUNS_PER_USER counts only the ones not ended)."""
    from inflight.runs import services
    from inflight.runs.models import RunStatus

    run = services.create_run(owner, name, config or {})
    services.claim_run(run.pk, worker_name)
    run = services.transition_run(run.pk, RunStatus.RUNNING)
    try:
        yield run
    finally:
        services.finish_run(run.pk, RunStatus.SUCCEEDED)


METRICS_PER_LINE = 20


def make_points(first_line: int, lines: int):
    from inflight.live.ingest import PointIn

    now = time.time()
    return [
        PointIn(line=line, name=f"metric/{m:02d}", step=line, t=now, value=float(line * 0.001 + m))
        for line in range(first_line, first_line + lines)
        for m in range(METRICS_PER_LINE)
    ]


async def ws_latency(owner, run, batches: int, lines_per_batch: int, interval_s: float) -> tuple[list[float], list[float]]:
    from channels.routing import URLRouter
    from channels.testing import WebsocketCommunicator

    from inflight.live.ingest import ingest_metrics
    from inflight.live.routing import websocket_urlpatterns

    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/runs/{run.pk}/")
    communicator.scope["user"] = owner
    connected, _ = await communicator.connect()
    assert connected, "the live consumer refused the connection"
    hello = await communicator.receive_json_from(timeout=10)
    assert hello.get("type") == "hello", hello
    sent_at: dict[int, float] = {}

    def produce() -> None:
        from django.db import connection

        for index in range(batches):
            batch = make_points(index * lines_per_batch, lines_per_batch)
            sent_at[index] = time.time()
            ingest_metrics(run.pk, batch)
            time.sleep(interval_s)
        connection.close()

    producer = threading.Thread(target=produce)
    producer.start()
    latencies: list[float] = []
    push_times: list[float] = []
    expected = batches * lines_per_batch * METRICS_PER_LINE
    received = 0
    while received < expected:
        message = await communicator.receive_json_from(timeout=30)
        arrived = time.time()
        if message.get("type") != "metrics.batch":
            continue
        push_times.append(arrived)
        for name, step, t, value in message["points"]:
            latencies.append((arrived - sent_at[int(step) // lines_per_batch]) * 1000)
            received += 1
    producer.join()
    await communicator.disconnect()
    return latencies, push_times


# --- the ~125M model and weight updates (reference and vLLM servers) -----------------------


def build_model(directory: Path) -> int:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rl_core.models.tiny_model import build_tokenizer

    tokenizer = build_tokenizer(0, 1024)
    config = Qwen2Config(
        vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12,
        num_key_value_heads=4, head_dim=64, max_position_embeddings=1024, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return sum(parameter.numel() for parameter in model.parameters())


def bare_receiver(master_port: int, plan_file: str, rounds: int) -> None:
    """Rank 1 of a plain gloo group: handshake, then receive every bucket; print the times."""
    import torch

    from rl_core.models.model_io import torch_dtype
    from rl_core.weights.sync import ParamSpec, create_group, plan_buckets

    torch.set_num_threads(1)
    specs = [ParamSpec.from_json(item) for item in json.loads(Path(plan_file).read_text())["params"]]
    bucket_bytes = json.loads(Path(plan_file).read_text())["bucket_bytes"]
    buckets = plan_buckets(specs, bucket_bytes)
    group = create_group("gloo", "127.0.0.1", master_port, 1, 2)
    buffers = {bucket.dtype: torch.empty(max(b.numel for b in buckets if b.dtype == bucket.dtype), dtype=torch_dtype(bucket.dtype)) for bucket in buckets}
    times = []
    for _ in range(rounds):
        work, _ = group.agree(False, torch.device("cpu"))
        work.wait()
        started = time.perf_counter()
        for bucket in buckets:
            group.broadcast(buffers[bucket.dtype][: bucket.numel]).wait()
        times.append(time.perf_counter() - started)
    print(json.dumps({"receive_s": times}), flush=True)


def bare_broadcast(named: list[tuple[str, torch.Tensor]], bucket_bytes: int, rounds: int, scratch: Path) -> list[float]:
    import torch

    from rl_core.models.model_io import dtype_name
    from rl_core.weights.sync import ParamSpec, create_group, plan_buckets

    specs = [ParamSpec(name, dtype_name(tensor.dtype), tuple(tensor.shape)) for name, tensor in named]
    plan_file = scratch / "plan.json"
    plan_file.write_text(json.dumps({"params": [spec.to_json() for spec in specs], "bucket_bytes": bucket_bytes}))
    port = free_port()
    receiver = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "--bare-receiver", "--master-port", str(port), "--plan", str(plan_file), "--rounds", str(rounds)],
        stdout=subprocess.PIPE, text=True,
    )
    group = create_group("gloo", "127.0.0.1", port, 0, 2)
    tensors = dict(named)
    for _ in range(rounds):
        work, _ = group.agree(False, torch.device("cpu"))
        work.wait()
        # Same sender pipelining as WeightBroadcaster: assemble bucket k+1 while k is on the wire.
        in_flight = None
        for bucket in plan_buckets(specs, bucket_bytes):
            flat = torch.cat([tensors[specs[index].name].reshape(-1) for index, _, _ in bucket.members])
            if in_flight is not None:
                in_flight[0].wait()
            in_flight = (group.broadcast(flat), flat)
        in_flight[0].wait()
    output, _ = receiver.communicate(timeout=600)
    return json.loads(output.strip().splitlines()[-1])["receive_s"]


def keep_decoding(url: str, stop: threading.Event) -> None:
    """Requests in flight during every update, as in a real run."""
    from rl_core.inference.client import InferenceClient
    from rl_core.common.contracts import SamplingParams

    async def loop() -> None:
        async with InferenceClient(url) as client:
            while not stop.is_set():
                await client.generate([{"role": "user", "content": "1+1"}], SamplingParams(temperature=1.0, max_new_tokens=32), n=2)

    asyncio.run(loop())


def updates_while_decoding(url: str, named: list[tuple[str, torch.Tensor]], updates: int, bucket_bytes: int,
                           sender: object | None = None, first_version: int = 1) -> tuple[list[float], list[float]]:
    """Broadcast `updates` new weight versions to the server at `url` while it keeps decoding;
    returns the server's pause and the trainer's broadcast time per update. `sender`: the
    trainer-side sender to use (default: a gloo `WeightBroadcaster`; `weight_handoff.SameDeviceSender`)."""
    import torch

    from rl_core.weights.sync import WeightBroadcaster

    stop = threading.Event()
    decoder = threading.Thread(target=keep_decoding, args=(url, stop), daemon=True)
    broadcaster = sender or WeightBroadcaster([url], bucket_bytes=bucket_bytes)
    try:
        broadcaster.connect()
        decoder.start()
        time.sleep(2.0)  # updates land mid-decode, as in a run
        pauses, broadcasts = [], []
        for version in range(first_version, first_version + updates):
            with torch.no_grad():
                for _, tensor in named:
                    tensor.mul_(1.0001)
            figures = broadcaster.broadcast(named, version)
            pauses.append(figures["weights/update_pause_s"])
            # The trainer's side of the update: the broadcast, or the write into the shared segment.
            broadcasts.append(figures.get("weights/broadcast_s", figures.get("weights/handoff_write_s", 0.0)))
    finally:
        stop.set()
        decoder.join(120)
        broadcaster.close()
    return pauses, broadcasts


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="bare_broadcast's receiving rank")
    parser.add_argument("--bare-receiver", action="store_true", required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--plan", required=True)
    parser.add_argument("--rounds", type=int, required=True)
    cli = parser.parse_args()
    bare_receiver(cli.master_port, cli.plan, cli.rounds)
