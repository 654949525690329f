"""A run's metric mirror folders (`monitoring.mirror.sinks`: W&B, TensorBoard) as streamed
.tar.gz archives, for the API (`GET /api/runs/<id>/mirrors/<kind>/download/`, api/run_files.py),
the run page (web/mirror_views.py) and `inflight download --mirrors`: a user without shell access
to the run storage can `wandb sync` / `tensorboard --logdir` them. The archive is the checkpoint
download's tar stream (regular files only, links never followed), gzip-compressed as it is sent."""

from __future__ import annotations

import zlib
from typing import Iterator

from django.http import StreamingHttpResponse

from inflight.api.errors import ApiError
from inflight.runs import run_paths
from rl_core.rundir.layout import TENSORBOARD_DIR, WANDB_DIR

# The metric mirrors a run may have: name in the URL → folder in the run directory.
MIRROR_DIRS = {"wandb": WANDB_DIR, "tensorboard": TENSORBOARD_DIR}


def _gzipped(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """A byte stream gzip-compressed as it is sent (the mirrors' event files shrink several-fold)."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 16 + zlib.MAX_WBITS)  # 16+: the gzip wrapper
    for chunk in chunks:
        if packed := packer.compress(chunk):
            yield packed
    yield packer.flush()


def mirror_archive_response(run_id: int, kind: str) -> StreamingHttpResponse:
    """A run's W&B or TensorBoard mirror folder (`monitoring.mirror.sinks`) as a streamed .tar.gz,
    for `wandb sync` / `tensorboard --logdir` by a user without shell access to the run storage.
    Raises ApiError 404 naming the mirrors the run has. The caller checked the run is visible."""
    folder = run_paths.run_dir(run_id) / MIRROR_DIRS.get(kind, "-")
    if kind not in MIRROR_DIRS or folder.is_symlink() or not folder.is_dir():
        present = [name for name, sub in MIRROR_DIRS.items() if (run_paths.run_dir(run_id) / sub).is_dir()]
        raise ApiError(404, f"run {run_id} has no {kind[:40]!r} mirror on disk (its mirrors: {', '.join(present) or 'none'}; "
                            "monitoring.mirror.sinks in the run config turns them on)")
    from inflight.api.run_files import _tar_stream as tar_stream  # the checkpoint download's archive writer

    name = f"run-{run_id}-{kind}"
    response = StreamingHttpResponse(_gzipped(tar_stream(folder, name)), content_type="application/gzip")
    response["Content-Disposition"] = f'attachment; filename="{name}.tar.gz"'
    return response
