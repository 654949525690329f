"""`inflight`: log in, submit and watch runs, read their logs, stop/resume them, download results.

Every command is a few calls of the JSON API; failures print one line (`inflight: error: ...`)
and exit 1 (2 for a wrong command line, 130 when interrupted). Watching a run exits 0 only when it
finished its steps; 3 when its wall-time budget stopped it first (`EXIT_STOPPED_BY_BUDGET`).
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import shutil
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence, TextIO

import yaml

from inflight_cli import credentials, datasets, mirrors
from inflight_cli.client import ApiFailure, Client
from inflight_cli.run_statuses import RUN_STATUSES, TERMINAL_STATUSES
# The engine's metric-name owner: a module of constants that imports nothing (no Django, no torch).
from rl_core.common import metric_names as mn

FINAL_STATES = TERMINAL_STATUSES  # the run model's own list (its choices are built from run_statuses)
LAUNCHER_LOG = "supervisor_child.log"  # the engine launcher's output, which the worker keeps
# The figures `watch` prints per trained step (their full names, as the run page, the API and the
# CSV name them), and the held-out success printed on a line of its own.
STEP_METRICS = (mn.TRAIN_REWARD_MEAN, mn.ROLLOUT_SUCCESS_MEAN, mn.TRAIN_LOSS)
WATCHED_METRICS = (*STEP_METRICS, mn.HELDOUT_SUCCESS)
DEFAULT_LOG_BYTES = 16 * 1024
# A run its wall-time budget stopped early ended well but did not do what was asked (its steps):
# a script running `submit --watch && ...` must be able to tell it from a finished run, and from a failure.
EXIT_STOPPED_BY_BUDGET = 3


class UsageError(Exception):
    """A bad argument the parser could not see (e.g. a malformed --set)."""


# ---------------------------------------------------------------- helpers


def _client() -> Client:
    return Client(credentials.load())


def parse_override(item: str) -> tuple[list[str], Any]:
    """`trainer.lr=3e-4` → (["trainer", "lr"], 0.0003): the value is read as YAML (numbers, true,
    lists); a number YAML 1.1 leaves as text (3e-4) is still a number."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip() or any(not part for part in key.strip().split(".")):
        raise UsageError(f"--set {item!r}: write KEY=VALUE, e.g. --set trainer.max_steps=20")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise UsageError(f"--set {item!r}: the value is not valid YAML ({exc})") from exc
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            pass
    return key.strip().split("."), value


def apply_overrides(config: dict[str, Any], items: Sequence[str]) -> dict[str, Any]:
    for item in items:
        path, value = parse_override(item)
        section = config
        for part in path[:-1]:
            child = section.setdefault(part, {})
            if not isinstance(child, dict):
                raise UsageError(f"--set {item!r}: {part!r} is a value in the config, not a section")
            section = child
        section[path[-1]] = value
    return config


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() + "\n")


def _run_url(client: Client, run_id: int) -> str:
    return f"{client.url}/runs/{run_id}/"


# ---------------------------------------------------------------- watch


def _latest_step(client: Client, run: dict[str, Any]) -> int | None:
    """The newest step a run logged: the highest step of its latest stored batch of points (one
    small read), or None before its first metrics."""
    if run.get("step") is not None:
        return int(run["step"])
    seq = int(run.get("metrics_seq") or 0)
    if seq <= 0:
        return None
    page = client.get(f"/api/runs/{run['id']}/metrics/", since_seq=seq - 1, format="records")
    return max((int(point["step"]) for point in page["points"]), default=None)


def watch(client: Client, run_id: int, out: TextIO, poll_s: float = 1.0, since_seq: int = 0) -> int:
    """Print status changes and, each poll, the newest training step, any held-out scores and
    alerts, until the run ends, then why it ended. 0 when it finished its steps, 3 when its
    wall-time budget stopped it first, 1 otherwise."""
    run = client.get(f"/api/runs/{run_id}/")
    max_steps = (run.get("config") or {}).get("trainer", {}).get("max_steps")
    # A resumed run is watched from where the resume found it (`since_seq`): the superseded
    # attempt's steps are not replayed, and no step is printed below one already printed (the
    # worker drops a superseded attempt's points after the new attempt has started writing).
    cursor, status, started = since_seq, None, time.monotonic()
    shown_step = -1
    alerts_seen: set[int] = set()
    while True:
        run = client.get(f"/api/runs/{run_id}/")  # status first: metrics read after a final status are complete
        if run["status"] != status:
            status = run["status"]
            out.write(f"[{time.monotonic() - started:6.1f}s] run {run_id} {status}" + (f": {run['error']}" if run.get("error") else "") + "\n")
        while True:
            page = client.get(f"/api/runs/{run_id}/metrics/", since_seq=cursor, format="records", names=",".join(WATCHED_METRICS))
            cursor = page["seq"]
            by_step: dict[int, dict[str, float]] = {}
            for point in page["points"]:
                by_step.setdefault(point["step"], {})[point["name"]] = point["value"]
            for step, values in sorted(by_step.items()):
                if mn.HELDOUT_SUCCESS in values and step > shown_step:
                    out.write(f"  step {step}: {mn.HELDOUT_SUCCESS} {_fmt(values[mn.HELDOUT_SUCCESS])}\n")
            trained = [step for step, values in by_step.items() if (mn.TRAIN_LOSS in values or mn.TRAIN_REWARD_MEAN in values) and step > shown_step]
            if trained:
                step = max(trained)
                values = by_step[step]
                shown = [f"{name} {_fmt(values[name])}" for name in STEP_METRICS if name in values]
                progress = f"{step}/{max_steps}" if max_steps else str(step)
                out.write(f"  step {progress}  " + "  ".join(shown) + "\n")
                shown_step = step
            if not page["truncated"]:
                break
        for alert in reversed(client.get(f"/api/runs/{run_id}/alerts/", limit=50)["alerts"]):  # newest first → oldest first
            if alert["id"] not in alerts_seen:
                alerts_seen.add(alert["id"])
                where = f"step {alert['step']} " if alert.get("step") is not None else ""
                out.write(f"  ! alert {where}{alert['title']}: {alert['message']}\n")
        out.flush()
        if status in FINAL_STATES:
            ended = f" ({run['ended']})" if run.get("ended") else ""
            out.write(f"run {run_id} {status}{ended} · {_run_url(client, run_id)}\n")
            if status != "succeeded":
                return 1
            return EXIT_STOPPED_BY_BUDGET if run.get("ended_reason") == "wall_time" else 0
        time.sleep(poll_s)


# ---------------------------------------------------------------- commands


def cmd_login(args: argparse.Namespace, out: TextIO) -> int:
    url = credentials.normalise_url(args.url or os.environ.get(credentials.URL_ENV) or input("Server URL [http://127.0.0.1:8000]: ") or "http://127.0.0.1:8000")
    token = (args.token or os.environ.get(credentials.TOKEN_ENV) or getpass.getpass("API token: ")).strip()
    if not token:
        raise UsageError("no token given (make demo prints one; `python manage.py create_token USERNAME` makes one)")
    creds = credentials.Credentials(url=url, token=token)
    client = Client(creds)
    try:
        client.get("/api/runs/", limit=1)  # proves the server answers and accepts the token
    finally:
        client.close()
    path = credentials.save(creds)
    out.write(f"logged in to {url}; token saved in {path} (mode 0600)\n")
    return 0


def cmd_logout(args: argparse.Namespace, out: TextIO) -> int:
    path = credentials.credentials_path()
    path.unlink(missing_ok=True)
    out.write(f"removed {path}\n")
    return 0


def cmd_submit(args: argparse.Namespace, out: TextIO) -> int:
    path = Path(args.config)
    config = _read_config(path)
    apply_overrides(config, args.set or [])
    name = args.name or str(config.get("name") or path.stem)
    client = _client()
    run = client.post("/api/runs/", {"name": name, "config": config})
    out.write(f"run {run['id']} {run['status']}: {run['name']} · {_run_url(client, run['id'])}\n")
    out.flush()
    return watch(client, run["id"], out) if args.watch else 0


def _read_config(path: Path) -> dict[str, Any]:
    try:
        config = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(config, dict):
        raise UsageError(f"{path} must hold a YAML mapping (a run config), not {type(config).__name__}")
    return config


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """`--grid trainer.lr=1e-4,3e-4` (repeatable) → {"trainer.lr": [0.0001, 0.0003]}: each value
    is read as `--set` reads one (YAML, numbers stay numbers)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not raw.strip():
            raise UsageError(f"--grid {item!r}: write KEY=V1,V2,..., e.g. --grid trainer.lr=1e-4,3e-4")
        grid[key.strip()] = [parse_override(f"{key}={part}")[1] for part in raw.split(",") if part.strip()]
    return grid


def parse_seeds(text: str) -> int | list[int]:
    """`3` → 3 seeds (0, 1, 2); `0,1,7` → those seeds."""
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isdigit() for part in parts):
        raise UsageError(f"--seeds {text!r}: a count (3) or a list of seeds (0,1,7)")
    return int(parts[0]) if "," not in text else [int(part) for part in parts]


def cmd_sweep(args: argparse.Namespace, out: TextIO) -> int:
    path = Path(args.config)
    config = apply_overrides(_read_config(path), args.set or [])
    name = args.name or str(config.get("name") or path.stem)
    client = _client()
    sweep = client.post("/api/sweeps/", {"name": name, "config": config, "grid": parse_grid(args.grid or []), "seeds": parse_seeds(args.seeds)})
    waiting = sweep["statuses"]["waiting"]
    later = f", {waiting} waiting for a free slot (your active-run limit): each is queued as one of your runs ends" if waiting else ""
    out.write(f"sweep {sweep['id']} {sweep['name']}: {sweep['run_count']} runs queued{later} · {client.url}/compare/?groups={sweep['id']}\n")
    for run in sweep["runs"]:
        out.write(f"  run {run['id']} {run['status']}: {run['name']}\n")
    return 0


def cmd_runs(args: argparse.Namespace, out: TextIO) -> int:
    client = _client()
    page = client.get("/api/runs/", status=args.status, tag=args.tag, q=args.query, archived="all" if args.all else None, limit=args.limit)
    if args.json:
        out.write(json.dumps(page["runs"], indent=1) + "\n")
        return 0
    if not page["runs"]:
        out.write("no runs\n")
        return 0
    rows = [["ID", "STATUS", "NAME", "OWNER", "STEP", "WALL", "CREATED"]]
    for run in page["runs"]:
        wall = run.get("wall_time_s")
        # Progress: the newest step logged of trainer.max_steps ("-/100" before the first step).
        max_steps = (run.get("config") or {}).get("trainer", {}).get("max_steps")
        step = _latest_step(client, run)
        rows.append([
            str(run["id"]), run["status"], run["name"], run["owner"], f"{_fmt(step)}/{_fmt(max_steps)}",
            f"{wall:.0f}s" if isinstance(wall, (int, float)) else "-", str(run["created_at"])[:19].replace("T", " "),
        ])
    _table(rows, out)
    if page.get("count", 0) > len(page["runs"]):
        out.write(f"({len(page['runs'])} of {page['count']}; --limit N shows more)\n")
    return 0


def cmd_watch(args: argparse.Namespace, out: TextIO) -> int:
    return watch(_client(), args.run, out)


def cmd_cancel(args: argparse.Namespace, out: TextIO) -> int:
    run = _client().post(f"/api/runs/{args.run}/cancel/")
    out.write(f"run {run['id']} {run['status']}" + (" (stopping)" if run["status"] not in FINAL_STATES else "") + "\n")
    return 0


def cmd_resume(args: argparse.Namespace, out: TextIO) -> int:
    client = _client()
    run = client.post(f"/api/runs/{args.run}/resume/")
    out.write(f"run {run['id']} {run['status']} again (resume {run.get('resume_count')}) · {_run_url(client, run['id'])}\n")
    out.flush()
    # Only what the resumed attempt logs: the points stored so far are the earlier attempts'.
    return watch(client, run["id"], out, since_seq=int(run.get("metrics_seq") or 0)) if args.watch else 0


def cmd_logs(args: argparse.Namespace, out: TextIO) -> int:
    client = _client()
    if args.list:
        listing = client.get(f"/api/runs/{args.run}/logs/")
        for item in listing["files"]:
            out.write(f"{item['name']}\t{item['size']}\n")
        return 0
    name = f"{args.process}.log" if args.process else LAUNCHER_LOG
    offset: int | None = 0 if args.bytes == 0 else None
    while True:
        try:
            chunk = client.get(f"/api/runs/{args.run}/logs/{name}", offset=offset, tail=args.bytes if offset is None else None)
        except ApiFailure as exc:
            if exc.status != 404 or not args.follow or "has no log" not in str(exc):
                raise
            chunk = None  # not written yet: the run is queued or starting
        if chunk is not None:
            out.write(chunk["text"])
            out.flush()
            offset = chunk["next_offset"]
            if chunk["next_offset"] < chunk["size"]:
                continue  # more than one chunk behind: read on without waiting
        if not args.follow:
            return 0
        if client.get(f"/api/runs/{args.run}/")["status"] in FINAL_STATES:
            if chunk is None or chunk["next_offset"] >= chunk["size"]:
                # One last read: lines written between the previous read and the end.
                if chunk is not None:
                    last = client.get(f"/api/runs/{args.run}/logs/{name}", offset=offset)
                    out.write(last["text"])
                return 0
        time.sleep(1.0)


def cmd_download(args: argparse.Namespace, out: TextIO) -> int:
    client = _client()
    run = client.get(f"/api/runs/{args.run}/")
    target = Path(args.output or f"run-{run['id']}")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Everything lands in a hidden folder beside the target first and is moved into place only
    # once every file came: a download that fails half-way (a missing checkpoint, a dropped
    # connection, Ctrl-C) leaves no partial folder that looks like a complete one.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent))
    written: list[tuple[str, int]] = []
    try:
        _download_into(client, run, staging, args, written)
        _move_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    for relative, size in written:
        out.write(f"{target / relative}\t{size} bytes\n")
    return 0


def _download_into(client: Client, run: dict[str, Any], folder: Path, args: argparse.Namespace, written: list[tuple[str, int]]) -> None:
    kinds = [] if args.no_metrics else ["metrics.csv", "metrics_wide.csv", "evals.jsonl"] + (["rollouts.jsonl"] if args.rollouts else [])
    for kind in kinds:
        written.append((kind, client.download(f"/api/runs/{run['id']}/export/{kind}", folder / kind)))
    (folder / "run.json").write_text(json.dumps(run, indent=1))
    if args.mirrors:
        mirrors.download_mirrors(client, run, folder, written)
    if not args.checkpoint:
        return
    listed = client.get(f"/api/runs/{run['id']}/checkpoints/")["checkpoints"]
    if not listed:
        raise ApiFailure(f"run {run['id']} has no checkpoint on disk")
    if args.checkpoint == "all":
        steps = [item["step"] for item in listed]
    elif args.checkpoint == "latest":
        steps = [next((item["step"] for item in listed if item["latest"]), listed[-1]["step"])]
    elif args.checkpoint.isdigit():
        steps = [int(args.checkpoint)]
    else:
        raise UsageError(f"--checkpoint {args.checkpoint!r}: give latest, all or a step number")
    checkpoints = folder / "checkpoints"
    checkpoints.mkdir(exist_ok=True)
    for step in steps:
        archive = checkpoints / f"step_{step:06d}.tar"
        size = client.download(f"/api/runs/{run['id']}/checkpoints/{step}/download/", archive)
        with tarfile.open(archive) as tar:
            tar.extractall(checkpoints, filter="data")  # refuses absolute paths, links out, devices
        archive.unlink()
        written.append((f"checkpoints/step_{step:06d}/", size))


def _move_into_place(staging: Path, target: Path) -> None:
    """`staging` becomes `target`; into an existing folder (a second download of the same run),
    each file or checkpoint folder replaces the one of the same name."""
    if not target.exists():
        staging.rename(target)
        return
    for entry in sorted(staging.rglob("*"), key=lambda path: len(path.parts)):
        relative = entry.relative_to(staging)
        destination = target / relative
        if entry.is_dir():
            if relative.parts[0] == "checkpoints" and len(relative.parts) == 2 and destination.exists():
                shutil.rmtree(destination)  # a checkpoint is replaced whole, never merged
            if not destination.exists():
                entry.rename(destination)
        elif entry.exists():
            entry.replace(destination)
    shutil.rmtree(staging, ignore_errors=True)


# ---------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="inflight", description="Command-line client of an Inflight server (its JSON API, with your API token).",
        epilog=f"Server and token: `inflight login`, or {credentials.URL_ENV} / {credentials.TOKEN_ENV} (these win over the saved login).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    login = commands.add_parser("login", help="check a server URL and API token, and save them (0600)")
    login.add_argument("--url", help="e.g. http://127.0.0.1:8000 (asked for when missing)")
    login.add_argument("--token", help="the API token (asked for, hidden, when missing)")
    login.set_defaults(handler=cmd_login)
    commands.add_parser("logout", help="forget the saved login").set_defaults(handler=cmd_logout)

    submit = commands.add_parser("submit", help="queue a run from a config YAML")
    submit.add_argument("config", help="a run config (e.g. examples/tiny-cpu.yaml)")
    submit.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field, e.g. --set trainer.max_steps=20 (repeatable)")
    submit.add_argument("--name", help="run name (default: the config's name)")
    submit.add_argument("--watch", action="store_true", help="stream the run's progress until it ends (exit 0 only if it finished its steps, 3 if its wall-time budget stopped it)")
    submit.set_defaults(handler=cmd_submit)

    sweep = commands.add_parser("sweep", help="queue a sweep: one run per grid point and seed, compared as a group")
    sweep.add_argument("config", help="the base run config (e.g. examples/tiny-cpu.yaml)")
    sweep.add_argument("--grid", action="append", metavar="KEY=V1,V2", help="values of a config field, e.g. --grid trainer.lr=1e-4,3e-4 (repeatable: every combination)")
    sweep.add_argument("--seeds", default="1", help="a count (3: seeds 0, 1, 2) or a list (0,1,7); each sets the config's seed (default 1)")
    sweep.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a field of the base config (repeatable)")
    sweep.add_argument("--name", help="sweep name (default: the config's name)")
    sweep.set_defaults(handler=cmd_sweep)

    runs = commands.add_parser("runs", help="list runs, newest first")
    runs.add_argument("--status", help="one of: " + ", ".join(value for value, _label in RUN_STATUSES))
    runs.add_argument("--tag")
    runs.add_argument("--query", "-q", help="text in the name or note")
    runs.add_argument("--all", action="store_true", help="include archived runs")
    runs.add_argument("--limit", type=int, default=50)
    runs.add_argument("--json", action="store_true", help="print the API's JSON")
    runs.set_defaults(handler=cmd_runs)

    watch_cmd = commands.add_parser("watch", help="stream a run's progress until it ends")
    watch_cmd.add_argument("run", type=int)
    watch_cmd.set_defaults(handler=cmd_watch)

    logs = commands.add_parser("logs", help="print a run's log (the launcher's output by default)")
    logs.add_argument("run", type=int)
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until the run ends")
    logs.add_argument("--process", help="one engine process's log instead, e.g. trainer (see --list)")
    logs.add_argument("--bytes", type=int, default=DEFAULT_LOG_BYTES, help="start this many bytes before the end (0: the whole log)")
    logs.add_argument("--list", action="store_true", help="list the run's log files")
    logs.set_defaults(handler=cmd_logs)

    for name, handler, text in (("cancel", cmd_cancel, "stop a queued or running run"), ("resume", cmd_resume, "queue an ended run again from its latest checkpoint")):
        action = commands.add_parser(name, help=text)
        action.add_argument("run", type=int)
        if name == "resume":
            action.add_argument("--watch", action="store_true", help="stream its progress until it ends")
        action.set_defaults(handler=handler)

    download = commands.add_parser("download", help="save a run's metrics (long and wide CSV), evaluations and checkpoints")
    download.add_argument("run", type=int)
    download.add_argument("-o", "--output", help="folder (default ./run-<id>)")
    download.add_argument("--checkpoint", metavar="latest|all|STEP", help="also fetch checkpoint folders into <folder>/checkpoints/")
    download.add_argument("--rollouts", action="store_true", help="also the stored rollouts (rollouts.jsonl)")
    download.add_argument("--no-metrics", action="store_true", help="skip metrics and evaluations")
    download.add_argument("--mirrors", action="store_true", help="also the run's W&B / TensorBoard mirror folders (run-<id>-wandb/: `wandb sync` it)")
    download.set_defaults(handler=cmd_download)
    datasets.add_commands(commands)
    return parser


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    args = build_parser().parse_args(argv)
    out = out or sys.stdout
    try:
        return int(args.handler(args, out))
    except UsageError as exc:
        sys.stderr.write(f"inflight: error: {exc}\n")
        return 2
    except (ApiFailure, credentials.NotLoggedIn) as exc:
        sys.stderr.write(f"inflight: error: {exc}\n")
        return 1
    except BrokenPipeError:
        # `inflight runs | head`: the reader has gone, which is no error; keep Python's exit quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        if args.command in ("submit", "watch", "resume", "logs"):
            sys.stderr.write("\ninflight: stopped watching; the run goes on (`inflight cancel RUN` stops it)\n")
        return 130
