"""`inflight download RUN --mirrors`: the run's W&B and TensorBoard mirror folders
(`monitoring.mirror.sinks`), fetched as .tar.gz streams and unpacked beside the other downloads,
so `wandb sync` / `tensorboard --logdir` work without shell access to the run storage."""

from __future__ import annotations

import tarfile
from pathlib import Path
from typing import Any

from inflight_cli.client import ApiFailure, Client


def mirror_kinds(run: dict[str, Any]) -> list[str]:
    return list(((run.get("config") or {}).get("monitoring") or {}).get("mirror", {}).get("sinks") or [])


def download_mirrors(client: Client, run: dict[str, Any], folder: Path, written: list[tuple[str, int]]) -> None:
    """Each mirror of the run into `folder/run-<id>-<kind>/`; a run without one is an error naming the setting."""
    kinds = mirror_kinds(run)
    if not kinds:
        raise ApiFailure(f"run {run['id']} has no metric mirror (monitoring.mirror.sinks is empty in its config)")
    for kind in kinds:
        archive = folder / f"run-{run['id']}-{kind}.tar.gz"
        size = client.download(f"/api/runs/{run['id']}/mirrors/{kind}/download/", archive)
        with tarfile.open(archive, "r:gz") as tar:
            tar.extractall(folder, filter="data")  # refuses absolute paths, links out, devices
        archive.unlink()
        written.append((f"run-{run['id']}-{kind}/", size))
