"""The reference engine's imports: bench/vs_trl.py runs it inside TRL's own venv (`.venv-trl`: torch,
transformers, TRL and theirs), so the engine module must not reach the HTTP side of weight sync."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def test_the_reference_engine_imports_no_http_client() -> None:
    # The engine imported synchronize_device from weights.sync, which imports httpx: the TRL peer's
    # venv has no httpx, and vs_trl's smoke stopped at that import.
    code = "import json, sys; import rl_core.inference.engine; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = set(json.loads(result.stdout.strip().splitlines()[-1]))
    assert not {"httpx", "fastapi", "rl_core.weights.sync"} & loaded
