"""Where users' uploaded datasets live: `<INFLIGHT_DATASETS_DIR>/<user id>/`. Imports no model,
so the run path check (`runs.run_paths`) can use it at import time."""

from __future__ import annotations

import os
from pathlib import Path

from django.conf import settings


def datasets_root() -> Path:
    """INFLIGHT_DATASETS_DIR resolved (symlinks followed): the one spelling stored paths and the
    run path check use."""
    return Path(os.path.normpath(Path(settings.INFLIGHT_DATASETS_DIR).resolve()))


def user_folder(user_id: int) -> Path:
    """One user's folder: only that user's runs may read under it."""
    return datasets_root() / str(int(user_id))
