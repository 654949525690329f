"""Issue 33: a run records what ran it (code version, packages, host, exact command) and where its
time goes per process (CPU, memory, GPU memory of each role's process tree)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

from rl_core.launch.provenance import code_version, differences, read_provenance, record_launch
from rl_core.rundir.layout import PROVENANCE_FILE
from rl_core.common.system_metrics import SystemSampler, proc_metric

REPO_ROOT = Path(__file__).resolve().parents[2]
SPIN = "import subprocess, sys, time\nchild = subprocess.Popen([sys.executable, '-c', 'import time\\nwhile True: pass'])\ntime.sleep(60)"


def test_each_launch_appends_what_ran_it(tmp_path: Path) -> None:
    first = record_launch(tmp_path, resume=False)
    second = record_launch(tmp_path, resume=True)
    lines = (tmp_path / PROVENANCE_FILE).read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["resume"] is True
    head = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, check=True).stdout.strip())
    assert first.code.source == "git" and first.code.git_commit == head and first.code.git_dirty is dirty
    assert first.packages["pydantic"] == metadata.version("pydantic") and first.packages["psutil"] == metadata.version("psutil")
    assert first.command[0] == sys.executable and first.host.hostname and first.host.python.startswith(sys.version.split()[0])
    assert [r.resume for r in read_provenance(tmp_path)] == [False, True] and read_provenance(tmp_path)[0] == first
    assert second.code == first.code


def test_outside_a_checkout_the_package_version_is_the_code_version(tmp_path: Path) -> None:
    version = code_version(tmp_path)  # no git repository there
    assert version.source == "package" and version.git_commit is None
    assert version.package_version == metadata.version("inflight") and version.label() == f"inflight {version.package_version}"


def test_differences_name_only_what_differs(tmp_path: Path) -> None:
    a = record_launch(tmp_path, resume=False)
    b = a.model_copy(deep=True)
    b.packages["torch"] = "0.0.1"
    b.packages.pop("pydantic")
    b.host.hostname = "elsewhere"
    # Differs from whatever the checkout is now: the platform tests, run alongside, re-take the
    # tracked screenshots, so `a` may be dirty already (with 3 changed paths, as it once was).
    b.code.git_dirty, b.code.changed_count = True, a.code.changed_count + 3
    found = differences([a, b, None])
    assert [name for name, _ in found["fields"]] == ["code", "host"]
    packages = dict(found["packages"])
    assert packages["torch"][1] == "0.0.1" and packages["pydantic"][1] is None and packages["pydantic"][2] is None
    assert "psutil" not in packages and found["missing"] == [2]
    assert differences([a, a.model_copy(deep=True)]) == {"fields": [], "packages": [], "missing": []}


def test_each_role_gets_its_own_cpu_and_memory_summed_over_its_process_tree() -> None:
    busy = subprocess.Popen([sys.executable, "-c", SPIN])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        import psutil

        deadline = time.monotonic() + 30
        while not psutil.Process(busy.pid).children() and time.monotonic() < deadline:
            time.sleep(0.05)  # the spinning child exists before the first sample
        sampler = SystemSampler()
        roles = {"trainer": busy.pid, "actor": idle.pid, "server0": 2**22 + 12345}  # the last: no such process
        sampler.sample(roles)  # sets each process's CPU reference point
        time.sleep(2.0)
        sample = sampler.sample(roles)
        assert sample[proc_metric("trainer", "cpu_percent")] > 20  # its spinning child counts to it (a shared machine gives it less than a core)
        assert sample[proc_metric("actor", "cpu_percent")] < 20
        assert sample[proc_metric("trainer", "rss_mb")] > sample[proc_metric("actor", "rss_mb")] > 1
        assert not any(key.startswith("system/proc/server0/") for key in sample)
        assert "system/cpu_util" in sample
        assert (proc_metric("trainer", "gpu_mem_mb") in sample) == (sampler.num_gpus > 0)
        assert not any(key.startswith("system/proc/") for key in sampler.sample())  # no roles, no per-process figures
    finally:
        for child in psutil.Process(busy.pid).children(recursive=True):
            child.kill()
        for process in (busy, idle):
            process.kill()
            process.wait()
