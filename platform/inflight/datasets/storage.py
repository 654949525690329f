"""Where users' datasets live and the writes that put them there.

Uploaded files go to `<INFLIGHT_DATASETS_DIR>/<user id>/<name>.jsonl` (the datasets root,
resolved once by `datasets_root`): one folder per user, which the runs of that user, and only
theirs, may read (`runs.run_paths.checked_paths`). A file is written to a hidden part file in
that folder, checked (`validation.check_stream`), and only then renamed into place, so a refused
or broken upload leaves nothing behind. A registered dataset is a file the operator put under a
data root (INFLIGHT_DATA_ROOTS): it is checked and listed, never copied or deleted.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db import IntegrityError, transaction

from inflight.datasets.models import Dataset, DatasetSource
from inflight.datasets.roots import datasets_root, user_folder
from inflight.datasets import validation
from inflight.datasets.validation import CheckedFile, check_stream, name_error

COPY_CHUNK_BYTES = 1024 * 1024
DATASET_SUFFIX = ".jsonl"


class DatasetRefused(Exception):
    """Why a dataset was not stored, keyed by the field at fault (`name`, `file`, `path`)."""

    def __init__(self, field: str, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.problems = problems or [message]  # a bad file: one entry per bad line


def _free_name(owner: Any, name: str) -> None:
    problem = name_error(name)
    if problem:
        raise DatasetRefused("name", problem)
    if Dataset.objects.filter(owner=owner, name=name).exists():
        raise DatasetRefused("name", f"you already have a dataset named {name!r}: delete it or pick another name")


def _refuse_bad_file(field: str, checked: CheckedFile) -> None:
    if not checked.ok:
        extra = [f"and {checked.more_errors} more bad lines"] if checked.more_errors else []
        raise DatasetRefused(field, checked.summary(), checked.errors + extra)


def store_upload(owner: Any, name: str, source: IO[bytes]) -> Dataset:
    """Copy `source` (at most validation.MAX_DATASET_BYTES) into the owner's folder as `<name>.jsonl`, check
    it and record it; raises DatasetRefused naming the field and, for a bad file, each bad line."""
    _free_name(owner, name)
    folder = user_folder(owner.pk)
    folder.mkdir(parents=True, exist_ok=True)
    part = folder / f".upload-{uuid.uuid4().hex}.part"
    try:
        copied = 0
        with part.open("wb") as out:
            while chunk := source.read(COPY_CHUNK_BYTES):
                copied += len(chunk)
                if copied > validation.MAX_DATASET_BYTES:
                    raise DatasetRefused("file", f"the file is over {validation.MAX_DATASET_BYTES // (1024 * 1024)} MiB (the limit of a dataset)")
                out.write(chunk)
        with part.open("rb") as handle:
            checked = check_stream(handle)
        _refuse_bad_file("file", checked)
        final = folder / f"{name}{DATASET_SUFFIX}"
        try:
            with transaction.atomic():
                dataset = Dataset.objects.create(owner=owner, name=name, source=DatasetSource.UPLOADED, path=str(final),
                                                 rows=checked.rows, size_bytes=checked.size_bytes, sha256=checked.sha256)
                os.replace(part, final)
        except IntegrityError as exc:  # the same name uploaded twice at once
            raise DatasetRefused("name", f"you already have a dataset named {name!r}") from exc
        return dataset
    finally:
        part.unlink(missing_ok=True)


def _registrable_path(raw: str) -> Path:
    """The absolute file a registration names, if it lies under a data root (not the datasets
    root, whose files belong to their uploaders, nor the runs directory)."""
    from inflight.runs import run_paths

    if not raw or "\x00" in raw or len(raw) > 1000:
        raise DatasetRefused("path", "give the path of a JSONL file under a data root")
    lexical = run_paths._absolute(raw)
    if lexical is None:
        raise DatasetRefused("path", "must not contain '..' after a folder name")
    real = Path(os.path.realpath(lexical))
    roots = [Path(os.path.realpath(root)) for root in settings.INFLIGHT_DATA_ROOTS]
    inside = any(run_paths._under(lexical, root) or run_paths._under(real, root) for root in roots)
    if not inside or run_paths._under(real, datasets_root()) or run_paths._under(real, run_paths.runs_dir()):
        raise DatasetRefused("path", f"must be a file under the data roots ({run_paths._shown(list(settings.INFLIGHT_DATA_ROOTS))})")
    if not real.is_file():
        raise DatasetRefused("path", "no file there (give a JSONL file, not a folder)")
    return lexical


def register_path(owner: Any, name: str, raw_path: str) -> Dataset:
    """Record a file under a data root as one of the owner's datasets, after checking it."""
    _free_name(owner, name)
    path = _registrable_path(raw_path)
    with path.open("rb") as handle:
        checked = check_stream(handle)
    _refuse_bad_file("path", checked)
    try:
        return Dataset.objects.create(owner=owner, name=name, source=DatasetSource.REGISTERED, path=str(path),
                                      rows=checked.rows, size_bytes=checked.size_bytes, sha256=checked.sha256)
    except IntegrityError as exc:
        raise DatasetRefused("name", f"you already have a dataset named {name!r}") from exc


def delete_dataset(dataset: Dataset) -> None:
    """Forget it; an uploaded file is removed too (a registered one is the operator's)."""
    path = Path(dataset.path)
    with transaction.atomic():
        dataset.delete()
        if dataset.source == DatasetSource.UPLOADED and path.parent == user_folder(dataset.owner_id) and not path.is_symlink():
            path.unlink(missing_ok=True)


def dataset_json(dataset: Dataset) -> dict[str, Any]:
    return {
        "id": dataset.pk, "name": dataset.name, "source": dataset.source, "path": dataset.path, "rows": dataset.rows,
        "size_bytes": dataset.size_bytes, "sha256": dataset.sha256, "created_at": dataset.created_at.isoformat(),
        "use": {"task.kind": "math_jsonl", "task.train_path": dataset.path},
    }
