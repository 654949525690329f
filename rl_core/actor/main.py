"""The actor's process: `python -m rl_core actor --run-dir DIR --servers URL[,URL]` (started by
`run`). Opens the clients, the stream writer and the metrics sink, runs `actor.Actor`, closes them."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rl_core.actor.loop import Actor
from rl_core.config.run_config import RunConfig
from rl_core.rundir.metrics import JsonlSink
from rl_core.common.processes import freeze_startup_objects, run_event_loop
from rl_core.rundir.layout import METRICS_FILE, load_run_config, stream_redis_url
from rl_core.rundir.role_args import role_parser, role_servers
from rl_core.rundir.stream import open_writer
from rl_core.rundir.heartbeats import start_heartbeat


def actor_clients(server_urls: list[str]) -> list[Any]:
    """One client per server, with no request deadline of their own: a long generation is no hang,
    and a server that stops answering is the launcher's watchdog's to catch (rl_core/launch/watchdog.py)."""
    from rl_core.inference.client import InferenceClient

    return [InferenceClient(url, timeout_s=None) for url in server_urls]


async def run_actor(config: RunConfig, run_dir: Path, server_urls: list[str]) -> None:
    clients = actor_clients(server_urls)
    writer = open_writer(config.stream.kind, run_dir, stream_redis_url(config.stream, run_dir))
    sink = JsonlSink(run_dir / METRICS_FILE)
    try:
        await Actor(config, run_dir, clients, writer, sink).run()
    finally:
        writer.close()
        sink.close()
        for client in clients:
            await client.aclose()


def build_parser() -> argparse.ArgumentParser:
    """The shared role flags (rundir/role_args.py); the actor adds none of its own."""
    return role_parser("actor", "Rollout actor of a run (started by `run`).", "to generate on")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    run_dir = Path(args.run_dir)
    start_heartbeat(run_dir, "actor")  # the launcher's watchdog: a stopped actor stops beating
    config = load_run_config(run_dir)
    servers = role_servers(args)
    if not servers:
        print("actor: no servers (give --servers or --await-servers)", file=sys.stderr)
        return 2
    freeze_startup_objects()
    run_event_loop(run_actor(config, run_dir, servers))
    print("actor: finished", flush=True)
    return 0
