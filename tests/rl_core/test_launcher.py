"""`python -m rl_core run` as a real process: bad inputs refused before anything
starts, a server killed mid-run, SIGTERM, and a SIGKILLed launcher (no orphans).
The GPU placement of the children (which GPUs each sees, trainer ranks) is checked on
the commands and environments the launcher builds: no GPU is needed for that."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from rl_core.config.run_config import RunConfig
from rl_core.launch.launcher import LaunchError, place_run, server_children, trainer_children
from tests.metrics_file import read_metrics


def write_config(path: Path, model: Path, **overrides: object) -> Path:
    data: dict = {
        "name": "launcher-test",
        "model": {"path": str(model)},
        "task": {"heldout_size": 4},
        "sampling": {"max_new_tokens": 24},
        "actor": {"group_size": 4, "groups_in_flight": 2, "max_lag": 1},
        "trainer": {"samples_per_step": 8, "max_steps": 3},
        "eval": {"heldout_every_n_steps": 0, "heldout_k": 1},
    }
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key].update(value)
        else:
            data[key] = value
    path.write_text(yaml.safe_dump(data))
    return path


def run_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rl_core", "run", *args], capture_output=True, text=True, timeout=timeout)


def start_run(config: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rl_core", "run", str(config), "--out", str(out), "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def status(out: Path) -> dict:
    try:
        return json.loads((out / "status.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def trained_steps(out: Path) -> int:
    if not (out / "metrics.jsonl").exists():
        return 0
    return sum("train/loss" in record for record in read_metrics(out / "metrics.jsonl"))


def children_of(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def command_words(process: psutil.Process) -> list[str]:
    """The words of a process's command line. A role forked by the run's fork server shows its
    command as one title (setproctitle: `python -m rl_core serve ...`), a fresh one as argv."""
    return " ".join(process.cmdline()).split()


def assert_all_gone(processes: list[psutil.Process], timeout_s: float = 30) -> None:
    gone, alive = psutil.wait_procs(processes, timeout=timeout_s)
    assert not alive, f"orphans left alive: {[(p.pid, p.cmdline()) for p in alive]}"


def test_bad_config_exits_2_naming_the_field(tiny_model: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", tiny_model, trainer={"samples_per_step": 0})
    result = run_cli(str(config), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "trainer.samples_per_step" in result.stderr
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
    result = run_cli(str(config), "--out", str(tmp_path / "run"), "--set", "trainer.samples_per_step=8", "--set", "actor.typo=1")
    assert result.returncode == 2 and "actor.typo" in result.stderr


def test_missing_model_path_is_a_clear_error(tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", tmp_path / "no-such-model")
    result = run_cli(str(config), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "model.path" in result.stderr and "no-such-model" in result.stderr and "does not exist" in result.stderr


def test_dataset_row_without_answer_is_refused_before_start(tiny_model: Path, tmp_path: Path) -> None:
    data = tmp_path / "train.jsonl"
    rows = [{"id": f"p{i}", "problem": f"What is {i}+1?", "answer": str(i + 1)} for i in range(10)]
    del rows[3]["answer"]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    config = write_config(tmp_path / "c.yaml", tiny_model, task={"kind": "math_jsonl", "train_path": str(data), "heldout_size": 2})
    result = run_cli(str(config), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "train.jsonl" in result.stderr and "answer" in result.stderr
    assert not (tmp_path / "run" / "logs").exists()


def test_validate_checks_what_run_would_refuse_without_writing_anything(tiny_model: Path, tmp_path: Path) -> None:
    """`python -m rl_core validate` is `run`'s preflight without the run: the fields, then the files and
    imports they name; `--schema-only` the fields alone."""
    def validate(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "rl_core", "validate", *args], capture_output=True, text=True, timeout=120)

    good = write_config(tmp_path / "good.yaml", tiny_model)
    result = validate(str(good))
    assert result.returncode == 0, result.stderr
    assert RunConfig.model_validate(yaml.safe_load(result.stdout)).model.path == str(tiny_model)

    missing_model = write_config(tmp_path / "no-model.yaml", tmp_path / "no-such-model")
    result = validate(str(missing_model))
    assert result.returncode == 2 and "model.path" in result.stderr and "does not exist" in result.stderr
    assert validate(str(missing_model), "--schema-only").returncode == 0

    result = validate(str(good), "--set", "task.kind=math_jsonl", "--set", f"task.train_path={tmp_path / 'absent.jsonl'}")
    assert result.returncode == 2 and "task:" in result.stderr and "absent.jsonl" in result.stderr
    result = validate(str(good), "--set", "env.name=custom", "--set", "env.class_path=nowhere_module:Env")
    assert result.returncode == 2 and "env.class_path" in result.stderr
    result = validate(str(good), "--set", "eval.benchmarks=[no_such_benchmark]")
    assert result.returncode == 2 and "eval.benchmarks" in result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["good.yaml", "no-model.yaml"]  # nothing written


def gpu_run_config(**sections: dict) -> RunConfig:
    data: dict = {
        "inference": {"engine": "vllm", "device": "cuda", "num_servers": 2, "gpus_per_server": 2, "tensor_parallel_size": 2},
        "trainer": {"backend": "deepspeed", "device": "cuda:3", "gpus": 4, "zero_stage": 3},
    }
    for name, values in sections.items():
        data[name] = {**data.get(name, {}), **values}
    return RunConfig.model_validate(data)


def test_children_get_exactly_their_gpus_on_an_eight_gpu_node(tmp_path: Path) -> None:
    config = gpu_run_config()
    placement = place_run(config, list(range(8)))
    assert config.trainer.device == "cuda"  # renumbered inside each process: cuda:3 would not exist there
    servers = server_children(config, placement, tmp_path, "/models/m", vllm_python="/opt/vllm/bin/python")
    assert [spec.name for spec in servers] == ["server0", "server1"]
    assert [spec.env["CUDA_VISIBLE_DEVICES"] for spec in servers] == ["0,1", "2,3"]
    for index, spec in enumerate(servers):
        assert spec.command[:3] == ["/opt/vllm/bin/python", "-m", "rl_core.inference.vllm_engine"]
        # Settings come from the run directory's config.yaml, not from flags.
        assert spec.command[3:] == ["--run-dir", str(tmp_path), "--server-index", str(index), "--model", "/models/m", "--port", "0"]
    ranks = trainer_children(config, placement, tmp_path, "/models/m", ["http://a", "http://b"], False, 29501, python="py")
    assert [spec.name for spec in ranks] == ["trainer", "trainer1", "trainer2", "trainer3"]
    assert [spec.env["CUDA_VISIBLE_DEVICES"] for spec in ranks] == ["4", "5", "6", "7"]
    assert [spec.env["RANK"] for spec in ranks] == ["0", "1", "2", "3"]
    assert {spec.env["WORLD_SIZE"] for spec in ranks} == {"4"} and {spec.env["MASTER_PORT"] for spec in ranks} == {"29501"}
    assert {spec.env["LOCAL_RANK"] for spec in ranks} == {"0"}  # each sees its one GPU as cuda:0
    command = ranks[0].command
    assert command[:4] == ["py", "-m", "rl_core", "trainer"] and all(spec.command == command for spec in ranks)
    assert command[command.index("--servers") + 1] == "http://a,http://b"
    assert command[command.index("--weight-sync-backend") + 1] == "nccl"


def test_cpu_run_children_see_no_gpu_and_cpu_ranks_rendezvous(tmp_path: Path) -> None:
    config = RunConfig.model_validate({"inference": {"num_servers": 2}, "trainer": {"backend": "deepspeed", "cpu_ranks": 2}})
    placement = place_run(config, [0, 1])  # GPUs present, but a CPU run must not touch them
    servers = server_children(config, placement, tmp_path, "/models/m", python="py")
    assert [spec.env for spec in servers] == [{"CUDA_VISIBLE_DEVICES": ""}] * 2
    assert servers[1].command[:4] == ["py", "-m", "rl_core", "serve"]
    ranks = trainer_children(config, placement, tmp_path, "/models/m", ["http://a"], True, 4000, python="py")
    assert [(spec.name, spec.env["RANK"], spec.env["LOCAL_RANK"], spec.env["CUDA_VISIBLE_DEVICES"]) for spec in ranks] == [
        ("trainer", "0", "0", ""), ("trainer1", "1", "1", "")]
    assert "--resume" in ranks[1].command
    assert ranks[0].command[ranks[0].command.index("--weight-sync-backend") + 1] == "gloo"
    single = trainer_children(RunConfig(), place_run(RunConfig(), []), tmp_path, "/m", [], False, 4000, python="py")
    assert [(spec.name, spec.env) for spec in single] == [("trainer", {"CUDA_VISIBLE_DEVICES": ""})]


def test_a_node_without_the_gpus_is_refused_by_place_run() -> None:
    with pytest.raises(LaunchError, match=r"placement: the run needs 8 GPUs .* but the node has 4 \(0,1,2,3\)"):
        place_run(gpu_run_config(), [0, 1, 2, 3])


def test_cli_refuses_a_run_this_node_cannot_place_before_starting(tiny_model: Path, tmp_path: Path) -> None:
    # More GPUs than any machine this runs on has: refused whatever the node.
    config = write_config(tmp_path / "c.yaml", tiny_model, inference={"device": "cuda", "num_servers": 64, "gpus_per_server": 1},
                          trainer={"samples_per_step": 8, "max_steps": 3, "device": "cuda", "gpus": 1})
    result = run_cli(str(config), "--out", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "placement: the run needs 65 GPUs" in result.stderr and "inference.num_servers" in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_server_killed_mid_run_fails_naming_it_and_keeps_metrics(tiny_model: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", tiny_model, trainer={"max_steps": 200})
    out = tmp_path / "run"
    launcher = start_run(config, out)
    try:
        wait_for(lambda: trained_steps(out) >= 1, 180, "a first training step")
        server = next(p for p in children_of(launcher.pid) if "serve" in command_words(p))
        others = [p for p in children_of(launcher.pid) if p.pid != server.pid]
        server.send_signal(signal.SIGKILL)
        assert launcher.wait(60) == 1
    finally:
        if launcher.poll() is None:
            launcher.kill()
    final = status(out)
    assert final["state"] == "failed"
    assert "server0" in final["error"] and "SIGKILL" in final["error"]
    assert trained_steps(out) >= 1  # metrics so far are kept
    assert_all_gone(others)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigterm_cancels_and_leaves_no_child(tiny_model: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", tiny_model, trainer={"max_steps": 200})
    out = tmp_path / "run"
    launcher = start_run(config, out)
    try:
        wait_for(lambda: status(out).get("state") == "running", 180, "state running")
        children = children_of(launcher.pid)
        assert {"serve", "trainer", "actor"} <= {word for p in children for word in command_words(p)}
        # The CPU run's server and trainer are forked from the run's fork server, which hides the
        # GPUs from itself (what a forked role sees is the environment it is given: test_role_forks;
        # the CPU roles are given CUDA_VISIBLE_DEVICES="": test_placement). /proc/PID/environ of a
        # forked process is its fork server's start-up environment, so it is not read here.
        placed = [p for p in children if {"serve", "trainer"} & set(command_words(p))]
        fork_servers = {p.ppid() for p in placed}
        assert len(placed) == 2 and len(fork_servers) == 1
        assert "multiprocessing.forkserver" in " ".join(psutil.Process(fork_servers.pop()).cmdline())
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(60) == 130
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert status(out)["state"] == "cancelled" and status(out)["error"] is None
    assert_all_gone(children)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sigkilled_launcher_takes_its_children_along(tiny_model: Path, tmp_path: Path) -> None:
    config = write_config(tmp_path / "c.yaml", tiny_model, trainer={"max_steps": 200})
    out = tmp_path / "run"
    launcher = start_run(config, out)
    try:
        wait_for(lambda: status(out).get("state") == "running", 180, "state running")
        children = children_of(launcher.pid)
        assert len(children) >= 3
        os.kill(launcher.pid, signal.SIGKILL)
        launcher.wait(10)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert_all_gone(children)


def test_every_engine_setting_of_a_run_config_reaches_the_engine_config() -> None:
    """engine_config_for is the one config → EngineConfig mapping: every EngineConfig field
    is set from the run config (none left at a default the config cannot change)."""
    import dataclasses

    from rl_core.config.engine import EngineConfig, engine_config_for

    config = RunConfig.model_validate({
        "seed": 7,
        "inference": {"max_batch_size": 5, "max_seq_len": 300, "initial_cache_len": 33, "max_prefill_tokens": 99,
                      "spec_step_token_budget": 12, "forward_overhead_tokens": 3, "share_identical_decodes": False,
                      "retained_sequences": 4},
        "accelerations": {"histospec": {"enabled": True, "initial_draft_len": 3, "max_draft_len": 9}},
    })
    engine = engine_config_for(config, server_index=2)
    assert dataclasses.asdict(engine) == {
        "max_batch_size": 5, "max_seq_len": 300, "initial_cache_len": 33, "max_prefill_tokens": 99, "seed": 9,
        "initial_draft_len": 3, "max_draft_len": 9, "spec_step_token_budget": 12, "forward_overhead_tokens": 3,
        "share_identical_decodes": False, "retained_sequences": 4,
    }
    defaults = engine_config_for(RunConfig())
    assert dataclasses.asdict(defaults) == dataclasses.asdict(EngineConfig())  # the config's defaults are the engine's


def test_a_vllm_server_of_a_run_takes_its_settings_from_config_yaml(tmp_path: Path) -> None:
    from rl_core.config.files import config_to_yaml
    from rl_core.inference.vllm_engine import _parser, apply_run_config

    config = RunConfig.model_validate({"seed": 4, "inference": {"max_batch_size": 6, "max_seq_len": 512, "threads_per_server": 2,
                                                                "cpu_kv_cache_gib": 3, "prefix_caching": True}})
    args = _parser().parse_args(["--model", "/m", "--run-dir", str(tmp_path)])
    apply_run_config(args, config, 0)
    assert (args.max_batch_size, args.max_seq_len, args.threads, args.cpu_kv_cache_gib, args.prefix_caching, args.seed) == (6, 512, 2, 3, True, 4)
    assert config_to_yaml(config)  # what the launcher writes is what the server reads back


def test_a_resumed_run_logs_its_first_system_sample_at_its_checkpoint_step(tmp_path: Path) -> None:
    """Issue 33: the launcher's system samples before the trainer publishes progress were logged at
    step 0, so a resumed run logged a second step-0 sample; now at the step it resumes from."""
    from rl_core.launch.launcher import sample_start_step
    from rl_core.rundir.layout import CHECKPOINTS_DIR, LATEST_CHECKPOINT_LINK, checkpoint_dir

    assert sample_start_step(tmp_path, resume=False) == 0
    checkpoint_dir(tmp_path, 20).mkdir(parents=True)
    (tmp_path / CHECKPOINTS_DIR / LATEST_CHECKPOINT_LINK).symlink_to(checkpoint_dir(tmp_path, 20).name)
    assert sample_start_step(tmp_path, resume=True) == 20
    assert sample_start_step(tmp_path, resume=False) == 0  # a fresh run starts at 0 whatever is there
