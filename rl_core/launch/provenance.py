"""What ran a run: the code version, the Python packages, the host and the exact command.

The launcher appends one `ProvenanceRecord` per launch (the first start, then each `--resume`) to
`run_dir.PROVENANCE_FILE` before it starts any child, so a run's results can be traced to what
produced them and two runs compared on it (the platform's worker stores the lines, its run page
shows the latest and compare shows what differs). Imports neither torch nor Django.

The code version is the git commit of the checkout `rl_core` is imported from, with whether
tracked files differ from it (`dirty`: a run of uncommitted code says so), or, outside a git
checkout, the installed `inflight` package's version.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from rl_core import CHECKOUT_ROOT
from rl_core.rundir.layout import PROVENANCE_FILE

PACKAGE_NAME = "inflight"
GIT_TIMEOUT_S = 10.0
# How many changed paths a dirty checkout lists (the count is always whole).
MAX_CHANGED_PATHS = 50


class CodeVersion(BaseModel):
    source: str = Field(description="`git` (a checkout) or `package` (an installed inflight).")
    git_commit: str | None = Field(None, description="HEAD of the checkout rl_core was imported from.")
    git_dirty: bool | None = Field(None, description="Tracked files differ from that commit.")
    changed_paths: list[str] = Field(default_factory=list, description="The first tracked paths that differ.")
    changed_count: int = Field(0, description="How many tracked paths differ.")
    package_version: str | None = Field(None, description="The installed inflight distribution's version.")

    def label(self) -> str:
        if self.git_commit:
            return self.git_commit[:12] + (f" + {self.changed_count} uncommitted change(s)" if self.git_dirty else "")
        return f"inflight {self.package_version or 'unknown version'}"


class HostInfo(BaseModel):
    hostname: str
    platform: str = Field(description="Operating system and machine (platform.platform()).")
    python: str = Field(description="Python version and implementation.")
    cpu_count: int | None = None
    gpus: list[str] = Field(default_factory=list, description="NVIDIA GPU names (NVML), empty without one.")


class ProvenanceRecord(BaseModel):
    """One launch of a run: one line of provenance.jsonl."""

    t: float = Field(description="Unix seconds of the launch.")
    resume: bool = Field(description="A `--resume` launch (the first launch is False).")
    code: CodeVersion
    packages: dict[str, str] = Field(description="Every installed distribution of the environment: name → version.")
    host: HostInfo
    command: list[str] = Field(description="The launcher's command line, as the OS started it.")
    cwd: str


def _git(repo: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def code_version(source_dir: Path | None = None) -> CodeVersion:
    repo = source_dir or CHECKOUT_ROOT
    commit = _git(repo, "rev-parse", "HEAD")
    try:
        package = metadata.version(PACKAGE_NAME)
    except metadata.PackageNotFoundError:
        package = None
    if not commit:
        return CodeVersion(source="package", package_version=package)
    status = _git(repo, "status", "--porcelain", "--untracked-files=no") or ""
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    return CodeVersion(source="git", git_commit=commit.strip(), git_dirty=bool(changed), changed_paths=changed[:MAX_CHANGED_PATHS],
                       changed_count=len(changed), package_version=package)


def installed_packages() -> dict[str, str]:
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            found[name.lower()] = dist.version
    return dict(sorted(found.items()))


def _gpu_names() -> list[str]:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver / no library / no GPU: none listed
        return []
    return [name.decode() if isinstance(name, bytes) else str(name) for name in names]


def host_info() -> HostInfo:
    return HostInfo(hostname=socket.gethostname(), platform=platform.platform(),
                    python=f"{platform.python_version()} ({platform.python_implementation()})", cpu_count=os.cpu_count(), gpus=_gpu_names())


def launch_command() -> list[str]:
    """The command line as the OS started this process (`python -m rl_core run ...`)."""
    return [sys.executable, *getattr(sys, "orig_argv", sys.argv)[1:]]


def collect(resume: bool) -> ProvenanceRecord:
    return ProvenanceRecord(t=time.time(), resume=resume, code=code_version(), packages=installed_packages(), host=host_info(),
                            command=launch_command(), cwd=os.getcwd())


def record_launch(run_dir: str | Path, resume: bool) -> ProvenanceRecord:
    """Append this launch's record to the run's provenance file (one write of one line)."""
    record = collect(resume)
    line = json.dumps(record.model_dump(mode="json"), separators=(",", ":")) + "\n"
    with open(Path(run_dir) / PROVENANCE_FILE, "a", encoding="utf-8") as out:
        out.write(line)
    return record


def read_provenance(run_dir: str | Path) -> list[ProvenanceRecord]:
    """Every launch recorded in the run directory, oldest first; unreadable lines are skipped."""
    try:
        text = (Path(run_dir) / PROVENANCE_FILE).read_text(encoding="utf-8")
    except OSError:
        return []
    records = []
    for line in text.splitlines():
        try:
            records.append(ProvenanceRecord.model_validate_json(line))
        except ValueError:
            continue
    return records


def differences(records: list[ProvenanceRecord | None]) -> dict[str, Any]:
    """What differs between runs' records (None: a run without one): the code, host, Python and
    command lines side by side, and the packages whose versions differ (name → one value per run,
    None where a run lacks it). Empty lists where everything is the same."""
    present = [r for r in records if r is not None]
    rows: list[tuple[str, list[str | None]]] = []
    fields = {
        "code": lambda r: r.code.label(),
        "host": lambda r: r.host.hostname,
        "python": lambda r: r.host.python,
        "platform": lambda r: r.host.platform,
        "GPUs": lambda r: ", ".join(r.host.gpus) or "none",
    }
    for name, read in fields.items():
        values = [read(r) if r is not None else None for r in records]
        if len({v for v, r in zip(values, records) if r is not None}) > 1:
            rows.append((name, values))
    names = sorted({name for r in present for name in r.packages})
    packages = []
    for name in names:
        versions = [r.packages.get(name) if r is not None else None for r in records]
        if len({v for v, r in zip(versions, records) if r is not None}) > 1:
            packages.append((name, versions))
    return {"fields": rows, "packages": packages, "missing": [i for i, r in enumerate(records) if r is None]}
