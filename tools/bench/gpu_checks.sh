#!/usr/bin/env bash
# The issues' GPU checks as one command on a lent GPU machine (nothing here runs in CI).
#
#   bash tools/bench/gpu_checks.sh speed    # engine vs HF Trainer + PEFT: 1B full and LoRA, 8B QLoRA (bf16, 2,048 tokens)
#   bash tools/bench/gpu_checks.sh truth    # memory truth rows not yet measured on a GPU (tools/truth/cuda.py)
#   bash tools/bench/gpu_checks.sh open     # the H200's open rows again, with each SDPA call's backend and the
#                                           # ops live at the GPU's peak (tests/planning/memory/test_gpu_truth.py)
#
# Wheels the machine lacks travel in .whl/ (pydantic for aegis, bitsandbytes for QLoRA, the transformers and PEFT
# the truth table was traced with) and install to /tmp/site. Results go to $OUT (the device tool brings them back).
# SPEED_PRESETS / SPEED_SEQ shrink the speed run for a dry run on a CPU.
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu_checks}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:$PWD/sdk:$PWD
else
  export PYTHONPATH=$PWD/sdk:$PWD
fi
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm \
  --format=csv >"$OUT/nvidia_smi.csv"
what=${1:-speed}
if [ "$what" = speed ]; then
  read -r small big <<<"${SPEED_PRESETS:-llama-1b llama-8b}"
  seq=${SPEED_SEQ:-2048}
  timeout "${SPEED_TIMEOUT:-200}" python3 -m tools.bench.bench_vs_torch --preset "$small" --precision bf16 \
    --seq "$seq" --batch 4 --method full --method lora --torch-loop trainer --rounds 3 --per-round 3 \
    --json "$OUT/speed_small.json" 2>&1 | grep -v -i -E "warn|USDT" | tee "$OUT/speed_small.log"
  timeout "${SPEED_TIMEOUT:-200}" python3 -m tools.bench.bench_vs_torch --preset "$big" --precision bf16 \
    --seq "$seq" --batch 2 --method qlora --torch-loop trainer --rounds 3 --per-round 2 \
    --json "$OUT/speed_big.json" 2>&1 | grep -v -i -E "warn|USDT" | tee "$OUT/speed_big.log"
elif [ "$what" = open ]; then
  keys=$(python3 -c "import sys; sys.path.insert(0, 'tests/planning/memory'); import test_gpu_truth as t
print('\n'.join(sorted(t.H200_OPEN)))") || exit 1
  args=()
  while IFS= read -r k; do args+=(--key "$k"); done <<<"$keys"
  timeout "${TRUTH_TIMEOUT:-300}" python3 -m tools.truth.cuda --out "$OUT/gpu_truth_open.json" "${args[@]}" \
    --budget-s "${TRUTH_BUDGET:-240}" 2>&1 | grep -v -i -E "warn" | tail -c 20000 >"$OUT/open.log"
  python3 -m tools.truth.cuda --show "$OUT/gpu_truth_open.json" | tail -n 20
elif [ "$what" = truth ]; then
  timeout "${TRUTH_TIMEOUT:-220}" python3 -m tools.truth.cuda --out "$OUT/gpu_truth_new.json" \
    --resume tests/data/gpu_truth.json --budget-s "${TRUTH_BUDGET:-150}" ${TRUTH_MODELS:-} 2>&1 \
    | grep -v -i -E "warn" | tail -c 20000 >"$OUT/truth.log"
  python3 -m tools.truth.cuda --show "$OUT/gpu_truth_new.json" | tail -n 40
fi
