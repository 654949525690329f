"""API reads of a run's own files: its process logs, its checkpoints and its W&B/TensorBoard
mirror folders (api/mirror_files.py) for `inflight logs` and `inflight download`; token auth like
the rest of /api/, other users' runs answer 404.

Logs are read from `<runs dir>/<id>/logs/` (the launcher's output is `supervisor_child.log`, each
engine process has `<process>.log`); follow one by asking again with offset=<next_offset>. Only
regular files directly in those folders are served: names are checked against a pattern and
symlinks are skipped, so no request reaches outside the run's directory.
"""

from __future__ import annotations

import os
import re
import tarfile
from pathlib import Path
from typing import Any, Iterator

from django.http import HttpRequest, StreamingHttpResponse
from ninja import Query

from inflight.api import schema
from inflight.api.auth import ApiRouter, OptionalQueryInt, QueryInt
from inflight.api.errors import ApiError
from inflight.api.mirror_files import mirror_archive_response
from inflight.runs import run_paths, selectors
from inflight.runs.safe_input import MAX_INT
from rl_core.rundir.layout import LOGS_DIR

router = ApiRouter(tags=["runs"])

LOG_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,100}\.log$")
DEFAULT_LOG_TAIL_BYTES = 16 * 1024
MAX_LOG_CHUNK_BYTES = 1024 * 1024
TAR_CHUNK_BYTES = 1024 * 1024


def _logs_dir(run_id: int) -> Path:
    return run_paths.run_dir(run_id) / LOGS_DIR


def _log_files(run_id: int) -> list[Path]:
    try:
        entries = list(_logs_dir(run_id).iterdir())
    except OSError:
        return []
    return sorted(path for path in entries if LOG_NAME_RE.match(path.name) and path.is_file() and not path.is_symlink())


def download(content_type: str, what: str) -> dict[str, Any]:
    """The OpenAPI description of a route whose 200 answer is a file, not JSON."""
    return {"responses": {200: {"description": what, "content": {content_type: {"schema": {"type": "string", "format": "binary"}}}}}}


@router.get("/runs/{int:run_id}/logs/", response={200: schema.LogList, **schema.ERRORS}, url_name="run-logs", summary="The run's process logs")
def run_logs(request: HttpRequest, run_id: int) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    files = [{"name": path.name, "size": path.stat().st_size} for path in _log_files(run.pk)]
    return {"run": run.pk, "files": files, "count": len(files)}


@router.get("/runs/{int:run_id}/logs/{name}", response={200: schema.LogChunk, **schema.ERRORS}, url_name="run-log",
            summary="A piece of one log (follow with offset=next_offset)")
def run_log_chunk(
    request: HttpRequest, run_id: int, name: str,
    offset: OptionalQueryInt = Query(None, ge=0, le=MAX_INT, description="Read from this byte."),
    tail: OptionalQueryInt = Query(None, ge=0, le=MAX_INT, description=f"Read the last N bytes (default {DEFAULT_LOG_TAIL_BYTES} when no offset)."),
    max_bytes: QueryInt = Query(MAX_LOG_CHUNK_BYTES, ge=1, le=MAX_LOG_CHUNK_BYTES, description="At most this many bytes."),
) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    path = _logs_dir(run.pk) / name
    if not LOG_NAME_RE.match(name) or path not in _log_files(run.pk):
        names = ", ".join(p.name for p in _log_files(run.pk)) or "none yet"
        raise ApiError(404, f"run {run.pk} has no log {name[:80]!r} (logs: {names})")
    if offset is not None and tail is not None:
        raise ApiError(400, "send either 'offset' (read from there) or 'tail' (the last N bytes), not both")
    with path.open("rb") as log:
        size = log.seek(0, 2)
        if offset is None:
            offset = max(0, size - (DEFAULT_LOG_TAIL_BYTES if tail is None else tail))
        # A log shorter than the offset was rewritten (a resumed run starts it again): from the top.
        start = offset if offset <= size else 0
        log.seek(start)
        data = log.read(max_bytes)
    # Cut at the last newline so a follower never prints half a line (unless one line fills the chunk).
    if len(data) == max_bytes and b"\n" in data:
        data = data[: data.rindex(b"\n") + 1]
    return {
        "run": run.pk, "name": name, "offset": start, "next_offset": start + len(data), "size": size,
        "text": data.decode("utf-8", errors="replace"),
    }


def _tar_stream(folder: Path, arcname: str) -> Iterator[bytes]:
    """The folder as a tar archive, file by file and chunk by chunk: a checkpoint of several GB
    never sits in memory. Regular files and folders only; symlinks are skipped."""
    paths = [folder]
    for parent, dirs, files in os.walk(folder, followlinks=False):  # a symlinked folder is not entered
        paths += [Path(parent) / name for name in dirs + files]
    for path in sorted(paths):
        if path.is_symlink() or not (path.is_file() or path.is_dir()):
            continue
        info = tarfile.TarInfo(arcname if path == folder else f"{arcname}/{path.relative_to(folder).as_posix()}")
        stat = path.stat()
        info.mtime = int(stat.st_mtime)
        info.mode = 0o755 if path.is_dir() else 0o644
        if path.is_dir():
            info.type = tarfile.DIRTYPE
            yield info.tobuf(tarfile.PAX_FORMAT)
            continue
        info.size = stat.st_size
        yield info.tobuf(tarfile.PAX_FORMAT)
        sent = 0
        with path.open("rb") as source:
            while sent < info.size and (chunk := source.read(min(TAR_CHUNK_BYTES, info.size - sent))):
                sent += len(chunk)
                yield chunk
        if sent < info.size:  # the file shrank while being sent: pad so the archive stays readable
            yield b"\0" * (info.size - sent)
        if info.size % tarfile.BLOCKSIZE:
            yield b"\0" * (tarfile.BLOCKSIZE - info.size % tarfile.BLOCKSIZE)
    yield b"\0" * (2 * tarfile.BLOCKSIZE)  # end of archive


@router.get("/runs/{int:run_id}/mirrors/{kind}/download/", response=schema.ERRORS, url_name="run-mirror-download",
            summary="A metric mirror folder (wandb or tensorboard) as a .tar.gz",
            openapi_extra=download("application/gzip", "A gzipped tar of the run's wandb/ or tensorboard/ folder (`wandb sync` its offline-run-* folder)."))
def mirror_download(request: HttpRequest, run_id: int, kind: str) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    return mirror_archive_response(run.pk, kind)


@router.get("/runs/{int:run_id}/checkpoints/{int:step}/download/", response=schema.ERRORS, url_name="run-checkpoint-download",
            summary="One checkpoint folder as a tar archive", openapi_extra=download("application/x-tar", "An uncompressed tar of checkpoints/step_NNNNNN/."))
def checkpoint_download(request: HttpRequest, run_id: int, step: int) -> Any:
    run = selectors.visible_run_or_404(request.user, run_id)
    folder = run_paths.checkpoint_path(run.pk, step)
    if step > 10**12 or folder.is_symlink() or not folder.is_dir():
        raise ApiError(404, f"run {run.pk} has no checkpoint at step {step} on disk; GET /api/runs/{run.pk}/checkpoints/ lists them")
    response = StreamingHttpResponse(_tar_stream(folder, folder.name), content_type="application/x-tar")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-{folder.name}.tar"'
    return response
