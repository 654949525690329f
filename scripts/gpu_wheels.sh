#!/usr/bin/env bash
# The wheels rl_core needs on the GPU machine, made here, into the git-ignored .whl/:
#
#   scripts/gpu_wheels.sh            # then carry .whl with the tree; scripts/gpu_window.sh installs it
#
# The GPU machine (see scripts/gpu_window.sh) has Python 3.12 with torch + CUDA, transformers
# and a long list of common packages, and no network. This downloads, for CPython 3.12 on
# manylinux x86-64, every package the window's stages import that the machine's image lacks: the
# dependency closure of rl_core's runtime needs (server, trainer, actor, launcher, rewards), read
# from this checkout's venv metadata at the versions this checkout is tested with, minus what the
# image has (DEVICE_HAS below, its package list as read on 2026-11-17) and never torch, nvidia-*,
# triton or transformers (the image's CUDA builds must stay). No Django, Celery or Ray: a run on
# one machine imports none of them. DeepSpeed has no wheel on PyPI: it is built here from its
# sdist with DS_BUILD_OPS=0 (pure Python; its ops JIT-compile on first use, and the trainer uses
# none that need it). typing-extensions is carried although the image has one: pydantic pins a
# newer one than an image may hold.
#
# Prints each wheel, their total size, and the tree + .whl size against the 64 MiB the GPU
# machine's call carries. Needs the checkout's venv (make venv) and PyPI.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
DEST="$ROOT/.whl"
LIMIT_BYTES=$((64 * 1024 * 1024))
cd "$ROOT"
[ -x "$PY" ] || { echo "gpu_wheels: $PY not found (make venv first)" >&2; exit 2; }

# Names, closure and versions from the venv's metadata (markers evaluated for CPython 3.12 on Linux).
mapfile -t PINS < <("$PY" - <<'PY'
import importlib.metadata as md
import re

from packaging.markers import default_environment
from packaging.requirements import Requirement

ROOTS = ["pydantic", "pyyaml", "math-verify", "fastapi", "uvicorn", "uvloop", "httptools", "httpx",
         "prometheus-client", "psutil", "setproctitle", "tqdm", "safetensors", "nvidia-ml-py", "deepspeed", "orjson"]
# The GPU image's packages (KINDS.md, 'Python packages already there'); normalised names.
DEVICE_HAS = set("""absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers
flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize
hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib
kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py
markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind
narwhals networkx ninja numba numba-cuda numpy numpyro nvidia-ml-py onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp""".split())
ALWAYS = {"typing-extensions"}
NEVER = re.compile(r"^(torch|transformers|triton|nvidia-.*|django.*|celery|ray)$")


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


environment = {**default_environment(), "python_version": "3.12", "python_full_version": "3.12.3",
               "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}
seen, order, queue = set(), [], [norm(name) for name in ROOTS] + sorted(ALWAYS)
while queue:
    name = queue.pop(0)
    if name in seen or NEVER.match(name):
        continue
    seen.add(name)
    try:
        distribution = md.distribution(name)
    except md.PackageNotFoundError:
        raise SystemExit(f"gpu_wheels: {name} is not installed in the venv (make venv)")
    if name not in DEVICE_HAS or name in ALWAYS:
        order.append(f"{name}=={distribution.version}")
    for text in distribution.requires or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate(environment):
            queue.append(norm(requirement.name))
print("\n".join(order))
PY
)

rm -rf "$DEST"
mkdir -p "$DEST"
PLATFORMS=()
for tag in manylinux_2_39 manylinux_2_35 manylinux_2_34 manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  PLATFORMS+=(--platform "${tag}_x86_64")
done
for pin in "${PINS[@]}"; do
  if [ "${pin%%==*}" = deepspeed ]; then
    # No wheel on PyPI: the sdist, built here with this venv's torch (setup.py imports it).
    scratch="$(mktemp -d)"
    "$PY" -m pip download -q --no-deps --no-binary=:all: -d "$scratch" "$pin"
    DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$DEST" "$scratch"/deepspeed-*.tar.gz
    rm -rf "$scratch"
  else
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 --abi abi3 --abi none \
      "${PLATFORMS[@]}" -d "$DEST" "$pin"
  fi
done

echo "gpu_wheels: ${#PINS[@]} wheels in .whl/ (Python 3.12, manylinux x86-64):"
ls -1 "$DEST" | sed 's/^/  /'
whl_bytes=$(du -cb "$DEST"/*.whl | tail -n 1 | cut -f1)
# What a GPU-machine call carries: tracked and untracked-not-ignored files, plus .whl.
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
total=$((whl_bytes + tree_bytes))
printf 'gpu_wheels: wheels %.1f MiB; tree %.1f MiB; tree + wheels %.1f MiB of the 64 MiB a call carries\n' \
  "$(echo "$whl_bytes / 1048576" | bc -l)" "$(echo "$tree_bytes / 1048576" | bc -l)" "$(echo "$total / 1048576" | bc -l)"
[ "$total" -le "$LIMIT_BYTES" ] || { echo "gpu_wheels: over the 64 MiB limit" >&2; exit 1; }
