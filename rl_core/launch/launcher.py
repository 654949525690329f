"""`python -m rl_core run CONFIG.yaml --out DIR [--set key=value ...] [--resume]`.

Runs a whole RL run standalone, in this order:

1. validate everything that can be checked without starting anything (config fields,
   model path, task data, benchmark files, and the GPU placement: whether this node has
   the GPUs the config asks for, `cluster/placement.py`) — a bad input exits 2 with a message
   naming the field, and nothing is written (`launch/preflight.py`);
2. build the tiny model if the config points at its default place and it is missing;
3. write `config.yaml` and `status.json` (`starting`);
4. start the children, each `python -m rl_core <role>` with its log in `DIR/logs/`:
   [redis-server], the inference server(s), the trainer rank(s), the actor. Every
   server and trainer rank gets exactly its GPUs through CUDA_VISIBLE_DEVICES (a vLLM
   server `tensor_parallel_size` of them, a trainer rank one; none on CPU), and the
   ranks of a multi-rank trainer get torch.distributed's RANK/WORLD_SIZE/MASTER_* —
   the commands and environments are built by the pure functions `server_children` /
   `trainer_children` (`launch/child_specs.py`);
5. supervise: a child that dies unexpectedly fails the run with an error naming it and
   its exit code; everything else is stopped and the metrics so far stay on disk.
   SIGTERM / Ctrl-C → graceful stop of all children → `cancelled`. The trainer reaching
   `trainer.max_steps`, or `max_wall_time_s` passing (the trainer then stops at the next
   step boundary and checkpoints), ends the run `succeeded` once the actor's final
   evaluation is written; status.json's `ended_reason` says which of the two it was
   (`max_steps` or `wall_time`), or `cancelled`, `failed`, `hung`.

No orphans: children stay in the launcher's process group (one signal to the group
reaches all of them), and each child gets PR_SET_PDEATHSIG=SIGTERM so that even a
SIGKILLed launcher takes its children with it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rl_core.cluster.layout import ClusterError
from rl_core.rundir.heartbeats import trainer_rank_name
from rl_core.rundir.role_args import role_flags
from rl_core.config.run_config import RunConfig
from rl_core.config.files import config_to_yaml, load_config_or_exit
from rl_core.common.jsonl_tail import JsonlTail
from rl_core.rundir.metrics import ConsoleSink, JsonlSink, MetricsMirror
from rl_core.cluster.placement import Placement, detect_gpus
from rl_core.weights.segments import remove_run_segments
from rl_core.launch.child_specs import ChildSpec, server_children, trainer_children
from rl_core.launch.preflight import (
    LaunchError,
    place_cluster_run,
    place_run,
    prepare_run_dir,
    resolve_model_path,
    validate_inputs,
)
from rl_core.launch.provenance import record_launch
from rl_core.launch.role_forks import RoleForks, fork_roles_enabled
from rl_core.cluster.role_hosts import LocalHost, LostRoles, RoleHost, RoleProcess
from rl_core.launch.watchdog import RoleHung, Watchdog
from rl_core.rundir.layout import (
    CLUSTER_FILE,
    CONFIG_FILE,
    METRICS_FILE,
    REDIS_DIR,
    REDIS_LOG_FILE,
    REDIS_PASSWORD_FILE,
    EndedReason,
    RunState,
    ended_sentence,
    checkpoint_step,
    latest_checkpoint,
    log_path,
    parse_ready_line,
    read_progress,
    request_stop,
    stop_requested,
    write_json_atomic,
    write_servers,
    write_status,
)

SERVER_START_TIMEOUT_S = 300.0
FINAL_EVAL_TIMEOUT_S = 1800.0  # the actor's final evaluation after the trainer finished
STOP_TIMEOUT_S = 10.0  # SIGTERM → SIGKILL
SYSTEM_METRICS_EVERY_S = 5.0
NODE_CHECK_EVERY_S = 1.0  # a cluster run asks Ray which nodes are alive this often
CONSOLE_LOG_EVERY_S = 5.0  # progress lines when the console is not a terminal


class HangError(LaunchError):
    """A role answered nothing for `monitoring.hang_limit_s` (rl_core/launch/watchdog.py)."""

    ended_reason: EndedReason = "hung"


# --- 3. children -------------------------------------------------------------------


@dataclass
class Child:
    name: str
    process: RoleProcess  # subprocess.Popen, or what the run's host hands back (role_hosts.RoleHost.start)
    log_path: Path
    log_offset: int = 0  # the log is appended to across resumes: this launch's part starts here


def start_child(name: str, command: list[str], run_dir: Path, extra_env: dict[str, str] | None = None,
                host: RoleHost | None = None) -> Child:
    log_file = log_path(run_dir, name)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    offset = log_file.stat().st_size if log_file.exists() else 0
    process = (host or LocalHost()).start(name, command, extra_env or {}, log_file)
    return Child(name, process, log_file, offset)


def wait_for_server(child: Child, timeout_s: float, should_stop: Any) -> str:
    """The server's URL from its `INFLIGHT_SERVER_READY <url>` log line."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if should_stop():
            raise LaunchError("cancelled while starting servers")
        with open(child.log_path, "rb") as handle:
            handle.seek(child.log_offset)
            text = handle.read().decode(errors="replace")
        for line in text.splitlines():
            url = parse_ready_line(line)
            if url is not None:
                return url
        if child.process.poll() is not None:
            raise LaunchError(f"{child.name} exited with code {child.process.returncode} while starting; "
                              f"last log lines:\n{log_tail(child.log_path)}")
        time.sleep(0.1)
    raise LaunchError(f"{child.name} did not become ready within {timeout_s:.0f} s; see {child.log_path}")


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def stop_children(children: list[Child], timeout_s: float = STOP_TIMEOUT_S) -> None:
    """SIGTERM to every live child, SIGKILL to any still alive after `timeout_s`."""
    for child in children:
        if child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for child in children:
        try:
            child.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()


def exit_description(code: int | None) -> str:
    if code is None:
        return "is still running"
    return f"exited with code {code}" if code >= 0 else f"was killed by signal {signal.Signals(-code).name}"


# --- 4. the run --------------------------------------------------------------------


class Launcher:
    def __init__(self, config: RunConfig, run_dir: Path, model_path: Path, resume: bool, console: bool = True,
                 placement: Placement | None = None, host: RoleHost | None = None) -> None:
        self.config = config
        self.run_dir = run_dir
        self.model_path = model_path
        self.resume = resume
        self.placement = placement or place_run(config, detect_gpus())
        # Where the children run: here (LocalHost), or on a Ray cluster's nodes (ray_placement.RayHost);
        # the launcher reaches it only through RoleHost's members, never asking which it is.
        self.host: RoleHost = host or LocalHost()
        self.child_env: dict[str, str] = {}  # on top of each spec's own (a cluster run's stream password)
        self._next_node_check = 0.0
        self.children: list[Child] = []
        self.stop_signal: int | None = None
        self.started = time.monotonic()
        self.console = ConsoleSink(config.trainer.max_steps) if console else None
        self._metrics_tail = JsonlTail(run_dir / METRICS_FILE)
        self._console_step = 0
        self._console_pending: dict[str, float] = {}
        self._console_last = 0.0
        self.wall_time_stop = False  # the launcher asked the trainer to stop: max_wall_time_s passed
        # Whether every role still answers, from the moment all servers are ready (start_all).
        self.watchdog: Watchdog | None = None
        self._next_watchdog_check = 0.0

    def ended_reason(self, state: str, error: LaunchError | None) -> EndedReason:
        """Why the run ended: a succeeded run finished its steps unless the wall-time budget
        stopped its trainer first (the trainer's last published version says which)."""
        if state == "cancelled":
            return "cancelled"
        if state != "succeeded":
            return error.ended_reason if error is not None else "failed"
        progress = read_progress(self.run_dir)
        finished = progress is not None and progress.version >= self.config.trainer.max_steps
        return "wall_time" if self.wall_time_stop and not finished else "max_steps"

    def set_status(self, state: RunState, error: str | None = None, detail: str | None = None,
                   ended_reason: EndedReason | None = None, ended_detail: str | None = None) -> None:
        write_status(self.run_dir, state, error, detail, ended_reason, ended_detail)

    def on_signal(self, signum: int, _frame: Any) -> None:
        self.stop_signal = signum

    def python_child(self, name: str, *args: str) -> Child:
        return self.spec_child(ChildSpec(name, [sys.executable, "-m", "rl_core", *args], {}))

    def spec_child(self, spec: ChildSpec) -> Child:
        child = start_child(spec.name, spec.command, self.run_dir, {**self.child_env, **spec.env}, self.host)
        self.children.append(child)
        return child

    def start_stream(self) -> None:
        """The run's own redis-server on the launcher's node (`stream.redis_embedded`), if the
        config asks for one: on its unix socket alone when every role is on this node, else on
        the address the host names (`RoleHost.stream_address`)."""
        c = self.config
        if not (c.stream.kind == "redis" and c.stream.redis_embedded):
            return
        bind = self.host.stream_address()
        if bind is None:
            from rl_core.rundir.stream import start_redis_server

            process, _url = start_redis_server(self.run_dir / REDIS_DIR, die_with_parent=True)
            self.children.append(Child("redis", process, self.run_dir / REDIS_DIR / REDIS_LOG_FILE))
            return
        self.start_networked_stream(bind)

    def start_networked_stream(self, bind: str) -> None:
        """A stream the roles reach over the network: on `bind`, behind a fresh password that only
        the roles' environments hold. The children read its address from config.yaml, rewritten here."""
        import secrets

        from rl_core.rundir.stream import STREAM_REDIS_PASSWORD_ENV, start_redis_server

        password = secrets.token_urlsafe(24)
        process, url = start_redis_server(self.run_dir / REDIS_DIR, die_with_parent=True, bind=bind, password=password)
        self.children.append(Child("redis", process, self.run_dir / REDIS_DIR / REDIS_LOG_FILE))
        # The platform's rollout viewer reads the stream on the unix socket, which asks for it too.
        secret = os.open(self.run_dir / REDIS_DIR / REDIS_PASSWORD_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(secret, "w") as handle:
            handle.write(password)
        self.config.stream.redis_url = url
        self.config.stream.redis_embedded = False
        (self.run_dir / CONFIG_FILE).write_text(config_to_yaml(self.config))
        self.child_env[STREAM_REDIS_PASSWORD_ENV] = password

    def waiting(self, detail: str | None) -> None:
        """What the run waits for before any role starts (None: nothing any more), in the run log
        and in status.json, where the platform shows it."""
        if detail is not None:
            print(detail, flush=True)
        self.set_status("starting", detail=detail)

    def start_all(self) -> None:
        try:
            # The run's stream starts as soon as the machines are the run's (`reserved`).
            where = self.host.prepare(self.waiting, self.start_stream)
        except ClusterError as exc:
            raise LaunchError(str(exc)) from exc
        if where:
            print(where, flush=True)
        print(f"placement:\n{self.placement.summary()}", flush=True)
        serve_model = latest_checkpoint(self.run_dir) if self.resume else self.model_path
        hosts = [self.host.listen_address(f"server{index}") for index in range(len(self.placement.servers))]
        servers = [self.spec_child(spec) for spec in server_children(self.config, self.placement, self.run_dir, str(serve_model), hosts=hosts)]
        # The trainer and the actor start now and load while the servers do; they read the
        # servers' URLs from servers.json, written below once every server is ready.
        rank_nodes = self.host.role_nodes([trainer_rank_name(rank) for rank in range(self.placement.trainer_world_size)])
        for spec in trainer_children(self.config, self.placement, self.run_dir, self.model_path, None, self.resume,
                                     self.host.free_port("trainer"), master_address=self.host.address("trainer"),
                                     rank_nodes=rank_nodes):
            self.spec_child(spec)
        self.python_child("actor", "actor", *role_flags(self.run_dir, None))
        urls = [wait_for_server(server, SERVER_START_TIMEOUT_S, lambda: self.stop_signal is not None) for server in servers]
        write_servers(self.run_dir, urls)
        self.watch_roles(servers, urls)
        self.write_cluster_record()

    def watch_roles(self, servers: list[Child], urls: list[str]) -> None:
        """Every role is watched the same way wherever it runs (this node or a Ray node): a
        server by its /health, a trainer rank and the actor by their heartbeat in the run directory."""
        self.watchdog = Watchdog(self.run_dir, self.config.monitoring.hang_limit_s)
        for server, url in zip(servers, urls):
            self.watchdog.watch_server(server.name, url)
        for child in self.children:
            if child.name == "actor" or child.name.startswith("trainer"):
                self.watchdog.watch_heartbeat(child.name)

    def running_roles(self) -> set[str]:
        return {child.name for child in self.children if child.process.poll() is None}

    def check_watchdog(self, now: float) -> None:
        """Fail the run naming a role that answered nothing for the hang limit (after the children's
        exits were checked: a role that died is named by its exit code, not as silent)."""
        if self.watchdog is None or now < self._next_watchdog_check:
            return
        self._next_watchdog_check = now + 1.0
        try:
            self.watchdog.check(time.monotonic(), self.running_roles())
        except RoleHung as exc:
            child = self.child(exc.role)
            raise HangError(f"{exc}; last log lines of {child.log_path}:\n{log_tail(child.log_path)}") from exc

    def pids(self) -> dict[str, int]:
        """Each child's pid on its own node, in the order they started."""
        return {child.name: child.process.pid for child in self.children}

    def write_cluster_record(self) -> None:
        """`cluster.json`: each role's node, address and pid there (the run page's "where" table),
        for a run its host spread over several nodes."""
        record = self.host.cluster_record(self.pids())
        if record is not None:
            write_json_atomic(self.run_dir / CLUSTER_FILE, record.model_dump(mode="json"))

    def child(self, name: str) -> Child:
        return next(child for child in self.children if child.name == name)

    def echo_metrics(self, force: bool = False) -> None:
        """Feed new metric lines to the console progress bar."""
        if self.console is None:
            return
        for _line_no, record in self._metrics_tail.read():
            # Evaluations log at the step they started: the bar shows the newest step.
            self._console_step = max(self._console_step, int(record.pop("step", 0)))
            record.pop("t", None)
            self._console_pending.update(record)
        # On a TTY the bar redraws in place; in a log file one line every few seconds is enough.
        interval = 0.0 if self.console.stream.isatty() else CONSOLE_LOG_EVERY_S
        if self._console_pending and (force or time.monotonic() - self._console_last >= interval):
            self.console.log(self._console_step, self._console_pending)
            self._console_pending = {}
            self._console_last = time.monotonic()

    def supervise(self) -> str:
        """Returns the final state; raises LaunchError naming the child that failed."""
        from rl_core.common.system_metrics import SystemSampler

        sink = JsonlSink(self.run_dir / METRICS_FILE)
        sampler = SystemSampler()
        start_step = sample_start_step(self.run_dir, self.resume)
        next_sample = 0.0
        trainer_done_at: float | None = None
        try:
            while True:
                if self.stop_signal is not None:
                    return "cancelled"
                now = time.monotonic()
                if now >= next_sample:
                    progress = read_progress(self.run_dir)
                    sample = self.host.sample_system(sampler, self.pids())
                    if self.watchdog is not None:  # the platform's `stalled` rule reads these
                        sample.update(self.watchdog.metrics(time.monotonic(), self.running_roles()))
                    sink.log(progress.version if progress else start_step, sample)
                    next_sample = now + SYSTEM_METRICS_EVERY_S
                wall = self.config.max_wall_time_s
                if wall is not None and now - self.started > wall and not stop_requested(self.run_dir):
                    request_stop(self.run_dir, "max_wall_time_s reached")
                    self.wall_time_stop = True
                if now >= self._next_node_check:
                    self.check_nodes()
                    self._next_node_check = now + NODE_CHECK_EVERY_S
                self.check_children()
                self.check_watchdog(now)
                trainer = self.child("trainer")
                if trainer_done_at is None and trainer.process.poll() == 0:
                    trainer_done_at = now
                if trainer_done_at is not None:
                    if self.child("actor").process.poll() == 0:
                        return "succeeded"
                    if now - trainer_done_at > FINAL_EVAL_TIMEOUT_S:
                        raise LaunchError(f"actor did not finish its final evaluation within {FINAL_EVAL_TIMEOUT_S:.0f} s")
                self.echo_metrics()
                time.sleep(0.2)
        finally:
            self.echo_metrics(force=True)
            sampler.close()
            sink.close()

    def check_nodes(self) -> None:
        """A run fails as soon as its host declares one of its nodes dead, naming it and its roles."""
        dead = self.host.dead_nodes()
        if dead:
            self.host.forget(dead)  # stopping their roles must not wait on a dead machine
            raise LaunchError(lost_nodes_message(dead, "Ray declared it dead"))

    def check_children(self) -> None:
        # The actor may exit a moment before the trainer process does: trust the published flag.
        progress = read_progress(self.run_dir)
        trainer_finished = self.child("trainer").process.poll() == 0 or bool(progress and progress.done)

        def finished_ok(child: Child) -> bool:
            # The trainer ends by itself; the actor only after it (final evaluation done).
            role = child.name.rstrip("0123456789")
            return child.process.returncode == 0 and (role == "trainer" or (role == "actor" and trainer_finished))

        failed = [child for child in self.children if child.process.poll() is not None and not finished_ok(child)]
        if not failed or self.stop_signal is not None:
            return  # (a group-wide SIGTERM that reached the children first is a cancel)
        # A dying server makes the actor/trainer fail a moment later: name the root cause.
        time.sleep(0.5)
        failed = [child for child in self.children if child.process.poll() is not None and not finished_ok(child)]
        order = {"redis": 0, "server": 1, "trainer": 2, "actor": 3}
        failed.sort(key=lambda child: order.get(child.name.rstrip("0123456789"), 9))
        # On several nodes the first death is often the symptom (the trainer losing its server):
        # a node whose roles stopped answering is the cause, named first.
        lost = self.host.unresponsive_roles(self.config.cluster.node_lost_grace_s)
        if lost:
            self.host.forget(lost)
            raise LaunchError(lost_nodes_message(lost, "its roles stopped answering"))
        first = failed[0]
        code = first.process.returncode
        if first.name == "actor" and code == 0:
            message = "actor exited before the trainer finished"
        else:
            where = self.host.where(first.name)
            lost_reason = self.host.lost_reason(first.name)
            message = f"{first.name} (pid {first.process.pid}{where}) {exit_description(code)}"
            if lost_reason:
                message = f"{first.name} (pid {first.process.pid}{where}): {lost_reason}"
        raise LaunchError(f"{message}; last log lines of {first.log_path}:\n{log_tail(first.log_path)}")

    def run(self) -> int:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.on_signal)
        self.set_status("starting")
        state, error = "failed", None
        launch_error: LaunchError | None = None
        # W&B / TensorBoard copies of metrics.jsonl (monitoring.mirror.sinks), fed on a thread of their own.
        mirror = None
        if self.config.monitoring.mirror.sinks:
            mirror = MetricsMirror(self.run_dir, self.config.monitoring.mirror, self.config.name,
                                   self.config.model_dump(mode="json"), from_end=self.resume)
        try:
            self.start_all()
            if self.stop_signal is None:
                self.set_status("running")
            state = self.supervise()
        except LaunchError as exc:
            state, error = ("cancelled", None) if self.stop_signal is not None else ("failed", str(exc))
            launch_error = exc
        except Exception as exc:  # noqa: BLE001 - any launcher bug still stops the children and says why
            state, error = "failed", f"launcher error: {exc!r}"
            # Where it came from, in the launcher's own output (supervisor_child.log under the
            # platform): status.json keeps the one line, and a bug without its traceback hides.
            traceback.print_exc(file=sys.stderr)
        finally:
            if self.watchdog is not None:
                self.watchdog.close()
            # Actor first (stop new traffic), then trainer, servers, redis last.
            stop_children(list(reversed(self.children)))
            # A trainer killed while making its weight segment leaves it named: the run's end removes it.
            remove_run_segments(self.run_dir)
            self.host.close()
            if mirror is not None:
                mirror.close()
        if self.console is not None:
            self.console.close()
        reason = self.ended_reason(state, launch_error)
        progress = read_progress(self.run_dir)
        cause = error.splitlines()[0].split(";")[0].split(":")[0][:120] if error else None
        detail = ended_sentence(reason, progress.version if progress else 0, self.config.trainer.max_steps, self.config.max_wall_time_s, cause)
        self.set_status(state, error, ended_reason=reason, ended_detail=detail)
        if error:
            print(f"run failed: {error}", file=sys.stderr, flush=True)
        else:
            print(f"run {state} ({detail}): {self.run_dir}", flush=True)
        # A budget stop exits 0 like a finished run: its checkpoint and final evaluation are
        # written as configured; status.json's `ended_reason` and the line above say it stopped early.
        return {"succeeded": 0, "cancelled": 130}.get(state, 1)


def lost_nodes_message(lost: LostRoles, why: str) -> str:
    return "; ".join(f"node {address} lost ({why}): role(s) {', '.join(names)} ran there" for address, names in lost.items())


def sample_start_step(run_dir: Path, resume: bool) -> int:
    """The step of the system samples logged before the trainer publishes its progress: 0, or a
    resumed run's checkpoint step (a resumed run logged a second step-0 sample, which drew its
    system charts back to the start)."""
    latest = latest_checkpoint(run_dir) if resume else None
    return (checkpoint_step(latest.name) or 0) if latest is not None else 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m rl_core run", description="Run a whole RL run standalone.")
    parser.add_argument("config", help="Run config YAML.")
    parser.add_argument("--out", required=True, help="Run directory (created if missing).")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="Override a field: key.path=value.")
    parser.add_argument("--resume", action="store_true", help="Continue the run in --out from checkpoints/latest.")
    parser.add_argument("--quiet", action="store_true", help="No progress bar on the console.")
    args = parser.parse_args(argv)
    config = load_config_or_exit(args.config, args.overrides)
    run_dir = Path(args.out).resolve()
    host: RoleHost | None = None
    forks: RoleForks | None = None
    try:
        model_path = resolve_model_path(config)
        if fork_roles_enabled() and not config.cluster.enabled:
            # The roles' imports start now, while the run is checked and its directory prepared.
            forks = RoleForks(model_path)
            forks.warm()
        validate_inputs(config)
        if config.cluster.enabled:
            placement, slots = place_cluster_run(config)
            from rl_core.cluster.ray_placement import RayHost  # Ray is imported by cluster runs only

            host = RayHost(config, slots, run_dir)
        else:
            placement = place_run(config, detect_gpus())
            host = LocalHost(forks)
        # Children read config.yaml; they get the model as an absolute path.
        config.model.path = str(model_path)
        prepare_run_dir(run_dir, config, args.resume)
        record_launch(run_dir, resume=args.resume)  # rl_core/launch/provenance.py: code, packages, host, command
    except LaunchError as exc:
        if forks is not None:
            forks.close()
        print(f"cannot start the run: {exc}", file=sys.stderr)
        return 2
    return Launcher(config, run_dir, model_path, args.resume, console=not args.quiet, placement=placement, host=host).run()
