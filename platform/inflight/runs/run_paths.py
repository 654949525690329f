"""Where a submitted run may read: the platform decides, not the config.

The engine opens `model.path`, `task.train_path`, `task.eval_path` and `eval.data_dir` as the
worker's user, and a stream of `kind: redis` connects to `stream.redis_url`. For a run
submitted through the platform (the CLI is not affected: it runs as whoever typed it):

- `model.path` must lie under a models root (settings.INFLIGHT_MODELS_ROOTS), be a hub id the
  operator allowed (INFLIGHT_HUB_MODELS), or be a checkpoint directory of one of the
  submitter's own runs (`<runs dir>/<run id>/checkpoints/step_NNNNNN` or `.../latest`);
- the task files and the benchmark folder must lie under a data root (INFLIGHT_DATA_ROOTS);
- the stream Redis is the platform's (INFLIGHT_STREAM_REDIS_URL) or the run's own embedded one;
- a custom env's `env.class_path` must import from a folder the operator lists in INFLIGHT_ENV_ROOTS
  (os.pathsep-separated; `rl_core.envs.environments.class_path_error`, which the launcher runs too).

Paths are made absolute against the repo root (the engine's working directory) and
normalised (`..` folded) before the check, which is lexical: nothing is opened, so a
refusal says which field and which roots, never what exists elsewhere. Symlinks placed
inside a root by the operator are followed (the tiny demo model is one); a checkpoint path
must also resolve (symlinks and all) inside its run's own `checkpoints/` folder. The web
side checks at submit time, the worker again before it starts the engine
(`checked_paths(..., on_worker=True)`), and hands the engine a checkpoint's resolved path.
"""

from __future__ import annotations

import os
import re
from itertools import dropwhile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser

from inflight.datasets.roots import datasets_root, user_folder
from rl_core.config.run_config import RunConfig, StreamConfig
from rl_core.envs.environments import class_path_error
from rl_core.rundir.layout import CHECKPOINTS_DIR, LATEST_CHECKPOINT_LINK, checkpoint_dir, checkpoint_step

_RUN_ID_RE = re.compile(r"[0-9]{1,18}")


@dataclass(frozen=True)
class CheckpointChoice:
    """One checkpoint of a run the user may start from (the create form's picker)."""

    run_id: int
    run_name: str
    step: int
    path: str

    @property
    def key(self) -> str:
        return f"{self.run_id}:{self.step}"

    @property
    def label(self) -> str:
        return f"#{self.run_id} {self.run_name} · step {self.step}"


def _absolute(value: str) -> Path | None:
    """The absolute, normalised path; None when a `..` follows a named part (`a/../b`): the OS
    resolves that through symlinks, not lexically, so no lexical check could vouch for it.
    Leading `..` of a relative path are fine: they climb from the (resolved) repo root."""
    parts = Path(value).parts
    named = parts if Path(value).is_absolute() else tuple(dropwhile(lambda part: part == "..", parts))
    if ".." in named:
        return None
    return Path(os.path.normpath(settings.REPO_ROOT / value))


def _under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _shown(roots: list[Path]) -> str:
    names = []
    for root in roots:
        try:
            names.append(os.path.relpath(root, settings.REPO_ROOT) if _under(root, Path(os.path.normpath(settings.REPO_ROOT.parent))) else str(root))
        except ValueError:
            names.append(str(root))
    return ", ".join(names) or "(none configured)"


def runs_dir() -> Path:
    """INFLIGHT_RUNS_DIR resolved (symlinks followed): every run directory and checkpoint path
    the platform stores, hands the engine or checks access to is under this one spelling."""
    return Path(os.path.normpath(Path(settings.INFLIGHT_RUNS_DIR).resolve()))


def run_dir(run_id: int) -> Path:
    """`<runs dir>/<run id>`: the run's own directory, the engine's `--out`."""
    return runs_dir() / str(int(run_id))


def checkpoints_folder(run_id: int) -> Path:
    return run_dir(run_id) / CHECKPOINTS_DIR


def checkpoint_path(run_id: int, step: int) -> Path:
    return checkpoint_dir(run_dir(run_id), step)


def _checkpoint_owner(path: Path) -> int | None:
    """The run id when `path` (normalised, under runs_dir()) is `<run id>/checkpoints/step_NNNNNN`
    or `<run id>/checkpoints/latest`, else None."""
    parts = path.relative_to(runs_dir()).parts
    if len(parts) != 3 or not _RUN_ID_RE.fullmatch(parts[0]) or parts[1] != CHECKPOINTS_DIR:
        return None
    if parts[2] != LATEST_CHECKPOINT_LINK and checkpoint_step(parts[2]) is None:
        return None
    return int(parts[0])


def checkpoint_run_id(model_path: Any) -> int | None:
    """The id of the run whose checkpoints folder holds `model_path` (as a config names it:
    absolute or relative to the repo root), else None. Read lexically, like the submit-time
    check: deleting a run must not pull a checkpoint from under a run that starts from it."""
    if not isinstance(model_path, str) or not model_path:
        return None
    path = _absolute(model_path)
    if path is None or not _under(path, runs_dir()):
        return None
    return _checkpoint_owner(path)


def checkpoints_of(user: AbstractBaseUser, max_runs: int = 50) -> list[CheckpointChoice]:
    """Checkpoints on disk of the runs `user` may see (own runs; staff: all), newest run first."""
    from inflight.runs.selectors import runs_visible_to

    choices = []
    for run in runs_visible_to(user).select_related(None).only("pk", "name")[:max_runs]:
        try:
            names = sorted((entry.name for entry in os.scandir(checkpoints_folder(run.pk)) if entry.is_dir(follow_symlinks=False)), reverse=True)
        except OSError:
            continue
        for name in names:
            step = checkpoint_step(name)
            if step is not None:
                choices.append(CheckpointChoice(run.pk, run.name, step, str(checkpoint_path(run.pk, step))))
    return choices


def _checkpoint_error(user: AbstractBaseUser, path: Path, on_worker: bool) -> tuple[str | None, Path]:
    """(error or None, resolved path) for a model.path under the runs directory."""
    from inflight.runs.selectors import runs_visible_to

    refusal = "is not a checkpoint of one of your runs (pick one under 'start from checkpoint')"
    run_id = _checkpoint_owner(path)
    if run_id is None or not runs_visible_to(user).filter(pk=run_id).exists():
        return refusal, path
    if not on_worker:
        return None, path
    folder = checkpoints_folder(run_id)
    real = Path(os.path.realpath(path))
    if not _under(real, Path(os.path.realpath(folder))) or real == Path(os.path.realpath(folder)):
        return refusal, path
    return None, real


def _is_own_dataset(user: AbstractBaseUser, path: Path, on_worker: bool) -> bool:
    """Whether `path` (normalised, under the datasets root) lies in `user`'s own datasets folder;
    on the worker also once resolved, so a link placed there cannot reach another user's files."""
    own = user_folder(user.pk)
    if not _under(path, own) or path == own:
        return False
    return not on_worker or _under(Path(os.path.realpath(path)), Path(os.path.realpath(own)))


def checked_paths(user: AbstractBaseUser, config: RunConfig, *, on_worker: bool = False) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(errors keyed by field, resolved absolute paths keyed by field) of a run `user` submits."""
    errors: dict[str, list[str]] = {}
    resolved: dict[str, str] = {}
    models_roots = list(settings.INFLIGHT_MODELS_ROOTS)
    data_roots = list(settings.INFLIGHT_DATA_ROOTS)

    model = config.model.path
    if model in settings.INFLIGHT_HUB_MODELS:
        pass
    else:
        path = _absolute(model)
        if path is None:
            problem = "must not contain '..' after a folder name"
        elif _under(path, runs_dir()):
            problem, path = _checkpoint_error(user, path, on_worker)
        elif any(_under(path, root) for root in models_roots):
            problem = None
        else:
            problem = f"must be under the models roots ({_shown(models_roots)}), an allowed hub id, or a checkpoint of one of your runs"
        if problem:
            errors["model.path"] = [problem]
        elif path is not None and _under(path, runs_dir()):
            resolved["model.path"] = str(path)  # the checkpoint as resolved on the worker (symlinks followed)

    for field, value in (("task.train_path", config.task.train_path), ("task.eval_path", config.task.eval_path), ("eval.data_dir", config.eval.data_dir)):
        if value is None:
            continue
        path = _absolute(value)
        if path is None:
            errors[field] = ["must not contain '..' after a folder name"]
        elif _under(path, datasets_root()):
            if not _is_own_dataset(user, path, on_worker):
                errors[field] = ["is not one of your datasets (each user's uploads are theirs alone; upload yours under Datasets)"]
        elif any(_under(path, root) for root in data_roots) and not _under(path, runs_dir()):
            pass  # kept as written: relative paths mean the same from the engine's working directory
        else:
            errors[field] = [f"must be under the data roots ({_shown(data_roots)}) or be one of your datasets"]

    # A custom env is code the actor runs: only from the folders the operator lists in
    # INFLIGHT_ENV_ROOTS, and importable (rl_core's one check, which the launcher runs too).
    refusal = class_path_error(config)
    if refusal:
        errors["env.class_path"] = [refusal]

    stream = config.stream
    platform_url = settings.INFLIGHT_STREAM_REDIS_URL
    default_url = StreamConfig.model_fields["redis_url"].default
    if stream.redis_url not in (default_url, platform_url):
        errors["stream.redis_url"] = ["is chosen by the platform; leave it at its default (set stream.redis_embedded for a private Redis)"]
    elif stream.kind == "redis" and not stream.redis_embedded:
        if platform_url:
            resolved["stream.redis_url"] = platform_url
        else:
            errors["stream.redis_embedded"] = ["this platform has no shared stream Redis: set stream.redis_embedded (a private one per run) or use stream.kind 'file'"]
    return errors, resolved


def apply_resolved(config_dict: dict[str, Any], resolved: dict[str, str]) -> dict[str, Any]:
    """A copy of `config_dict` with the resolved values put at their dotted paths."""
    out = {key: (dict(value) if isinstance(value, dict) else value) for key, value in config_dict.items()}
    for dotted, value in resolved.items():
        section, _, key = dotted.rpartition(".")
        node = out
        if section:
            node = out.setdefault(section, {})
        node[key] = value
    return out
