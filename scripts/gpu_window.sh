#!/usr/bin/env bash
# The GPU window: every GPU figure this project needs, in one command of at most ~9 minutes,
# ready before the machine is.
#
#   scripts/gpu_wheels.sh                        # here, once (PyPI): .whl/ with what the GPU image lacks
#   scripts/gpu_window.sh                        # there, first thing: cuda, Qwen2.5-0.5B shape, bf16
#   scripts/gpu_window.sh --device cpu           # anywhere: the same stages at the tiny shape (CI runs it)
#   scripts/gpu_window.sh [--shape qwen2.5-1.5b] [--dtype bfloat16|float32] [--vllm]
#
# Writes into $OUT (a new temp folder when $OUT is unset), as each stage ends:
#   results.txt     every `RESULT <name> <value>` line (also printed);
#   window.log      everything every stage printed, with a header per stage;
#   nvidia_smi.csv  GPU utilisation and memory every 0.5 s while the stages run (cuda).
# Each stage runs under its own `timeout`; a stage that fails or times out is said so
# (`RESULT window_stage_<name>_ok 0`) and the window goes on, keeping every earlier figure.
#
# Nothing touches the network (HF_HUB_OFFLINE=1, pip --no-index): the wheels in .whl/, if any,
# are installed into a temp folder (--no-deps) that goes first on PYTHONPATH; the checkout itself
# is on PYTHONPATH, so no editable install is needed.
#
# Stages (the model is one randomly initialised --shape, built once on the device, rl_core/models/model_shapes.py):
#   preflight     nvidia-smi, a device matmul, `import rl_core.inference.server, rl_core.trainer.loop, deepspeed`:
#                 what is missing, named in one line
#   engine        bench/engine_throughput.py: the reference engine's decode tokens/s against HF
#                 `generate` on the same prompts
#   weight_update bench/weight_update.py --handoff same-device: the in-flight update pause against a
#                 bare device copy of the same bytes
#   runs          bench/real_size.py --modes async,sync: a short async run and the same run synchronous
#                 through the product's launcher (`python -m rl_core run`), step time and GPU utilisation
#   deepspeed     bench/trainer_step.py --backend deepspeed: a ZeRO-2 trainer step
#   vllm          (only with --vllm and where `import vllm` works) the async run served by vLLM with a
#                 DeepSpeed ZeRO-3 trainer (what scripts/gpu_smoke.sh ran before the window replaced it)
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DEVICE=cuda
SHAPE=""
DTYPE=""
WITH_VLLM=0
usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE="${2:?--device needs a value}"; shift 2 ;;
    --shape) SHAPE="${2:?--shape needs a value}"; shift 2 ;;
    --dtype) DTYPE="${2:?--dtype needs a value}"; shift 2 ;;
    --vllm) WITH_VLLM=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu_window: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
case "$DEVICE" in
  cuda*) ON_GPU=1; SHAPE="${SHAPE:-qwen2.5-0.5b}"; DTYPE="${DTYPE:-bfloat16}" ;;
  cpu) ON_GPU=0; SHAPE="${SHAPE:-tiny}"; DTYPE="${DTYPE:-float32}" ;;
  *) echo "gpu_window: --device must be cuda[:N] or cpu, got $DEVICE" >&2; exit 2 ;;
esac

OUT="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/inflight-gpu-window.XXXXXX")}"
mkdir -p "$OUT"
LOG="$OUT/window.log"
RESULTS="$OUT/results.txt"
: > "$LOG"
: > "$RESULTS"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/inflight-window-work.XXXXXX")"
WINDOW_STARTED=$(date +%s)
SAMPLER_PID=""
cleanup() {
  [ -n "$SAMPLER_PID" ] && kill "$SAMPLER_PID" 2>/dev/null
  rm -rf "$WORK"
}
trap cleanup EXIT

say() { echo "gpu_window: $*" | tee -a "$LOG"; }
result() { echo "RESULT $1 $2" | tee -a "$RESULTS" "$LOG"; }

if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
else PY="$(command -v python3)"; fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1 DS_BUILD_OPS=0
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$HOME/.cache/inflight/torch_extensions}"
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PY_VERSION="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if compgen -G "$ROOT/.whl/*.whl" > /dev/null && [ "$PY_VERSION" != 3.12 ]; then
  echo "gpu_window: .whl/ is for Python 3.12 (scripts/gpu_wheels.sh); $PY is $PY_VERSION: not installed" | tee -a "$LOG"
elif compgen -G "$ROOT/.whl/*.whl" > /dev/null; then
  SITE="$WORK/site"
  if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$ROOT"/.whl/*.whl >> "$LOG" 2>&1; then
    PYTHONPATH="$SITE:$PYTHONPATH"
    say "installed $(ls "$ROOT"/.whl/*.whl | wc -l) wheels from .whl/ into $SITE"
  else
    say "installing .whl/ failed (see $LOG); going on with what $PY has"
  fi
fi
export PYTHONPATH
say "device $DEVICE, shape $SHAPE, dtype $DTYPE, python $PY, results in $OUT"

# --- preflight: everything missing, in one line ---------------------------------------
PREFLIGHT_STARTED=$(date +%s)
MISSING=()
if [ "$ON_GPU" = 1 ]; then
  if command -v nvidia-smi > /dev/null 2>&1; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >> "$LOG" 2>&1 || MISSING+=("!a GPU nvidia-smi can see")
  else
    MISSING+=("!nvidia-smi")
  fi
fi
PREFLIGHT_OUT="$WORK/preflight.txt"
timeout 300 "$PY" - "$DEVICE" "$DTYPE" > "$PREFLIGHT_OUT" 2>> "$LOG" <<'PY'
import sys
import time

device_name, dtype_name = sys.argv[1], sys.argv[2]
missing = []  # "!" first: nothing can run without it
try:
    import torch
except Exception as exc:  # noqa: BLE001 - report, do not crash: the line says what is missing
    print(f"MISSING !torch ({exc})")
    raise SystemExit(0)
print(f"INFO torch {torch.__version__}, python {sys.version.split()[0]}")
device = torch.device(device_name)
try:
    dtype = getattr(torch, dtype_name)
    size = 4096 if device.type == "cuda" else 512
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    reference = (a.double() @ b.double())
    for _ in range(2):
        product = a @ b
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        print(f"INFO device {torch.cuda.get_device_name(device)}, capability {torch.cuda.get_device_capability(device)}")
    error = float((product.double() - reference).norm() / reference.norm())
    if not error < 2e-2:
        missing.append(f"!a correct {device_name} matmul (relative error {error:.2e})")
    repeats = 20 if device.type == "cuda" else 3
    started = time.perf_counter()
    for _ in range(repeats):
        product = a @ b
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    print(f"RESULT preflight_matmul_tflops {2 * size ** 3 * repeats / (time.perf_counter() - started) / 1e12:.3f}")
except Exception as exc:  # noqa: BLE001
    missing.append(f"!a {device_name} {dtype_name} matmul ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})")
for module in ("transformers", "rl_core.inference.server", "rl_core.trainer.loop", "rl_core.launch.launcher", "deepspeed"):
    try:
        __import__(module)
    except Exception as exc:  # noqa: BLE001
        fatal = "!" if module.startswith("rl_core") else ""
        missing.append(f"{fatal}{module} ({type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''})")
if device.type == "cuda":
    # Masked grouped-query attention must run a fused kernel, not the math one (attention_kernels.py).
    try:
        from torch.profiler import ProfilerActivity, profile

        from rl_core.kernels.attention import masked_gqa_sdpa

        query = torch.randn(4, 14, 64, 64, device=device, dtype=dtype)
        key = torch.randn(4, 2, 256, 64, device=device, dtype=dtype)
        mask = torch.rand(4, 1, 64, 256, device=device) > 0.2
        with profile(activities=[ProfilerActivity.CPU]) as trace:
            masked_gqa_sdpa(None, query, key, key, mask)
        names = {event.name for event in trace.events()}
        print(f"RESULT preflight_masked_gqa_math_kernel {int(any('math' in name for name in names))}")
    except Exception as exc:  # noqa: BLE001
        missing.append(f"masked GQA attention ({type(exc).__name__}: {exc})")
for item in missing:
    print(f"MISSING {item}")
PY
preflight_rc=$?
cat "$PREFLIGHT_OUT" >> "$LOG"
grep '^INFO ' "$PREFLIGHT_OUT" | sed 's/^INFO /gpu_window: /'
grep '^RESULT ' "$PREFLIGHT_OUT" | while read -r _ name value; do result "$name" "$value"; done
while IFS= read -r line; do MISSING+=("${line#MISSING }"); done < <(grep '^MISSING ' "$PREFLIGHT_OUT")
[ "$preflight_rc" -eq 0 ] || MISSING+=("!a preflight that finishes (exit $preflight_rc)")
if [ "${#MISSING[@]}" -gt 0 ]; then
  say "preflight: missing: $(printf '%s; ' "${MISSING[@]#!}" | sed 's/; $//')"
else
  say "preflight: nothing missing ($(( $(date +%s) - PREFLIGHT_STARTED )) s)"
fi
# Without a device, torch or rl_core's own imports ("!" above) nothing below can run.
for item in "${MISSING[@]}"; do
  case "$item" in
    '!'*) say "cannot run the stages without: ${item#!}"; exit 2 ;;
  esac
done

# --- the GPU sampler: utilisation and memory every 0.5 s -----------------------------
if [ "$ON_GPU" = 1 ]; then
  nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,noheader,nounits -lms 500 \
    > "$OUT/nvidia_smi.csv" 2>> "$LOG" &
  SAMPLER_PID=$!
fi

# Mean GPU utilisation (percent) between two epoch times, from nvidia_smi.csv.
gpu_util_between() {
  "$PY" - "$OUT/nvidia_smi.csv" "$1" "$2" <<'PY'
import sys
from datetime import datetime

path, start, end = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
values = []
for line in open(path, errors="replace"):
    fields = [field.strip() for field in line.split(",")]
    try:
        at = datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
        value = float(fields[2])
    except (ValueError, IndexError):
        continue
    if start <= at <= end:
        values.append(value)
print(f"{sum(values) / len(values):.1f}" if values else "nan")
PY
}

# run_stage NAME LIMIT_S COMMAND...: the command under `timeout`, its output into window.log,
# its RESULT lines into results.txt as soon as it ends, and whether it succeeded.
FAILED=()
run_stage() {
  local name="$1" limit="$2"
  shift 2
  local stage_log="$WORK/stage_$name.log" started ended rc
  say "stage $name (at most ${limit} s): $*"
  echo "----- stage $name -----" >> "$LOG"
  started=$(date +%s.%N)
  timeout --kill-after=15 "$limit" "$@" 2>&1 | tee "$stage_log" >> "$LOG"
  rc=${PIPESTATUS[0]}
  ended=$(date +%s.%N)
  grep '^RESULT ' "$stage_log" | while read -r _ metric value; do result "$metric" "$value"; done
  if [ "$ON_GPU" = 1 ] && [ -s "$OUT/nvidia_smi.csv" ]; then
    result "${name}_gpu_util" "$(gpu_util_between "$started" "$ended")"
  fi
  local seconds
  seconds=$(echo "$ended - $started" | bc)
  result "window_stage_${name}_s" "$(printf '%.1f' "$seconds")"
  if [ "$rc" -eq 0 ]; then
    result "window_stage_${name}_ok" 1
    say "stage $name: done in $(printf '%.0f' "$seconds") s"
  else
    result "window_stage_${name}_ok" 0
    FAILED+=("$name")
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      say "stage $name: TIMED OUT after ${limit} s (its figures so far are kept); last lines:"
    else
      say "stage $name: FAILED (exit $rc); last lines:"
    fi
    tail -n 15 "$stage_log" | sed 's/^/    /' | tee -a "$LOG"
  fi
}

# --- the model, once, on the device --------------------------------------------------
# Limits: on a GPU they add up to ~9 minutes (each stage well inside its own on an H100); on a
# CPU they only stop a hung stage (two shared cores can be several times slower than idle ones).
if [ "$ON_GPU" = 1 ]; then BUILD_LIMIT=90; else BUILD_LIMIT=400; fi
MODEL="$WORK/model-$SHAPE"
run_stage build_model "$BUILD_LIMIT" "$PY" -m rl_core build-model --shape "$SHAPE" --device "$DEVICE" --dtype "$DTYPE" "$MODEL"
if [ ! -f "$MODEL/config.json" ]; then
  say "no model: nothing else can run"
  exit 1
fi
SHAPE_ARGS=(--device "$DEVICE" --dtype "$DTYPE" --model "$MODEL")

# Stage sizes: real on a GPU, the smallest real ones on a CPU.
if [ "$ON_GPU" = 1 ]; then
  ENGINE_ARGS=(--prompts 32 --repeats 2); ENGINE_LIMIT=100
  RUN_ARGS=(--steps 4 --samples-per-step 16 --group-size 4 --max-new-tokens 128 --micro-batch-tokens 4096); RUNS_LIMIT=200
  STEP_ARGS=(--samples 16 --prompt-tokens 128 --completion-tokens 256 --steps 3); STEP_LIMIT=90
  UPDATE_LIMIT=90
else
  ENGINE_ARGS=(--prompts 8 --repeats 1 --max-budget 32); ENGINE_LIMIT=600
  RUN_ARGS=(--steps 2 --samples-per-step 4 --group-size 2 --max-new-tokens 8 --bare-rounds 1); RUNS_LIMIT=900
  STEP_ARGS=(--samples 4 --prompt-tokens 16 --completion-tokens 16 --steps 1); STEP_LIMIT=600
  UPDATE_LIMIT=600
fi

run_stage engine "$ENGINE_LIMIT" "$PY" bench/engine_throughput.py "${SHAPE_ARGS[@]}" "${ENGINE_ARGS[@]}"

# weight_update.py (the same-device handoff's bench) builds its own model; it is given this
# window's shape where it knows it, else its ~125M default.
if [ "$ON_GPU" = 1 ]; then
  UPDATE_SHAPE="$SHAPE"
  "$PY" bench/weight_update.py --help 2>/dev/null | grep -q -- "$SHAPE" || UPDATE_SHAPE=125m
  run_stage weight_update "$UPDATE_LIMIT" "$PY" bench/weight_update.py --handoff same-device --shape "$UPDATE_SHAPE" \
    --device "$DEVICE" --dtype "$DTYPE" --updates 3
else
  run_stage weight_update "$UPDATE_LIMIT" "$PY" bench/weight_update.py --handoff same-device --device "$DEVICE" --smoke
fi

run_stage runs "$RUNS_LIMIT" "$PY" bench/real_size.py "${SHAPE_ARGS[@]}" "${RUN_ARGS[@]}" --modes async,sync

# A JIT build killed mid-way (a stage cut by its timeout) leaves torch's lock behind and every
# later build waits on it forever; a real build takes ~80 s, so a lock this old is such a leftover.
find "$TORCH_EXTENSIONS_DIR" -maxdepth 2 -name lock -type f -mmin +15 -delete 2>/dev/null
run_stage deepspeed "$STEP_LIMIT" "$PY" bench/trainer_step.py "${SHAPE_ARGS[@]}" "${STEP_ARGS[@]}" --backend deepspeed --zero-stage 2

if [ "$WITH_VLLM" = 1 ]; then
  if "$PY" -c "import vllm" > /dev/null 2>&1; then
    run_stage vllm "$RUNS_LIMIT" "$PY" bench/real_size.py "${SHAPE_ARGS[@]}" "${RUN_ARGS[@]}" --modes async --engine vllm \
      --backend deepspeed --zero-stage 3
  else
    say "vllm: not importable with $PY: skipped (the reference engine's figures above stand)"
  fi
fi

say "window took $(( $(date +%s) - WINDOW_STARTED )) s; $(grep -c '^RESULT ' "$RESULTS") RESULT lines in $RESULTS"
if [ "${#FAILED[@]}" -gt 0 ]; then
  say "failed stages: ${FAILED[*]}"
  exit 1
fi
exit 0
