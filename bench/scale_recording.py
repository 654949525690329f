"""The demo run bench/platform_scale.py replays: recorded once per command, code and machine, kept
with a recording.json that says what recorded it, and recorded anew when any of those changed, so a
kept, older run never stands in for today's demo (issue 36). A helper of platform_scale.py, not a
bench of its own (bench/smoke.py's HELPER_MODULES)."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from benchlib import DEMO_CONFIG, REPO_ROOT, run_cli

DEFAULT_RECORDING = REPO_ROOT / "var" / "bench-platform-scale" / "demo-recording"
RECORDING_FILE = "recording.json"  # in a demo run this bench recorded: what recorded it (demo_recording)


def recording_identity(overrides: list[str]) -> dict[str, str]:
    """What must match for a recorded demo run to be replayed: the command, the code that sets the
    demo's pace (rl_core, the config, the model's recipe), and the machine."""
    code = hashlib.sha256()
    for path in sorted(REPO_ROOT.glob("rl_core/**/*.py")) + [DEMO_CONFIG]:
        code.update(path.relative_to(REPO_ROOT).as_posix().encode() + b"\0" + path.read_bytes())
    machine_id = Path("/etc/machine-id").read_text().strip() if Path("/etc/machine-id").exists() else ""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() else platform.processor()
    command = f"python -m rl_core run {DEMO_CONFIG.relative_to(REPO_ROOT)}" + "".join(f" --set {item}" for item in overrides)
    return {"command": command, "code_sha256": code.hexdigest(),
            "machine": f"{platform.node()} {machine_id} {cpu}, {os.cpu_count()} cores"}


def demo_recording(folder: Path, overrides: list[str]) -> tuple[Path, dict[str, Any]]:
    """A demo run recorded by `recording_identity`'s command on this machine with this code, in
    `folder`: the one there if its recording.json matches, else recorded now. A folder holding
    anything else (a run this bench did not record) is refused, never replayed or overwritten."""
    identity = recording_identity(overrides)
    marker = folder / RECORDING_FILE
    if marker.exists():
        recorded = json.loads(marker.read_text())
        changed = [key for key, value in identity.items() if recorded.get(key) != value]
        if not changed:
            return folder, recorded
        print(f"demo run {folder}: recorded with another {', '.join(changed)}: recording it anew")
    elif folder.exists() and any(folder.iterdir()):
        raise SystemExit(f"{folder} holds no {RECORDING_FILE}: not a demo run this bench recorded here with this code, so its rate "
                         "may be another one's; name an empty or new folder with --demo-run (the bench records into it)")
    shutil.rmtree(folder, ignore_errors=True)
    print(f"recording the demo run to replay: {identity['command']} --out {folder}")
    started = time.time()
    run_cli(DEMO_CONFIG, folder, overrides)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True).stdout.strip()
    recorded = {**identity, "commit": commit or "unknown", "recorded_at": datetime.datetime.now().isoformat(timespec="seconds"),
                "record_s": round(time.time() - started, 1), "load_average": [round(x, 2) for x in os.getloadavg()]}
    marker.write_text(json.dumps(recorded, indent=1))
    return folder, recorded
