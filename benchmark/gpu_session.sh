#!/usr/bin/env bash
# Prepared runs on a lent GPU machine, each within one device call's 10 minutes: unpack the kit that
# `python -m benchmark.device_kit pack` made here, then the steps named (default: the first three):
#
#   tests     the CUDA tests (tests/cuda)
#   passes    the model alone on the service's passes: fp32 and fp16, SDPA and eager attention, and
#             passes of unseen shapes with and without cuDNN attention (the fp16 slowdown's suspect)
#   scenario  the `gpu` benchmark scenario: the service against sentence-transformers on the device
#   sweep     the service at 1, 2, 4 and 8 workers, fp32 and fp16 (benchmark/gpu_sweep.py): goals 1, 2
#   precision the model's rows in fp16 and bf16 against fp32 on the GPU (benchmark/half_precision.py)
#
#   device run, carry [".device"], timeout_s 600:  bash benchmark/gpu_session.sh
#   and a second call:                             bash benchmark/gpu_session.sh sweep
#
# Everything it prints and writes lands in $OUT, at most six files (the device tool brings back
# eight). PYTHON names another interpreter (the GPU machines' python3 holds torch); a step that runs
# past its share of the time is stopped and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu-session}
KIT=${KIT:-.device}
STEPS=${*:-tests passes scenario}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$PYTHON" -m benchmark.device_kit unpack "$KIT" > "$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
export PYTHONPATH="$PWD/$KIT/site:$PWD"
MODEL="$PWD/$KIT/model"
{ nvidia-smi -L; "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda:', torch.cuda.is_available())"; } \
    >> "$OUT/setup.log" 2>&1
cat "$OUT/setup.log"
step() {  # step NAME SECONDS COMMAND...: its output to $OUT/NAME.log, its last lines here
    local name=$1 seconds=$2
    shift 2
    echo "== $name (up to ${seconds}s)"
    timeout "$seconds" "$@" > "$OUT/$name.log" 2>&1
    echo "   exit $?"
    tail -n 6 "$OUT/$name.log"
}
for name in $STEPS; do
    case $name in
        tests) step cuda-tests 170 "$PYTHON" -m pytest -q -p no:cacheprovider -m cuda tests/cuda ;;
        passes) DEVICE=cuda step cuda-passes 140 "$PYTHON" -m benchmark.cuda_passes "$MODEL" ;;
        scenario) step gpu-scenario 240 "$PYTHON" -m benchmark.run --only gpu --repeats 1 --model "$MODEL" \
                      --out "$OUT/gpu" ;;
        sweep) step gpu-sweep 540 "$PYTHON" -m benchmark.gpu_sweep "$MODEL" --out "$OUT/gpu-sweep.json" ;;
        precision) DEVICE=cuda step half-precision 60 "$PYTHON" -m benchmark.half_precision "$MODEL" ;;
        *) echo "unknown step $name (tests, passes, scenario, sweep, precision)"; exit 2 ;;
    esac
done
