#!/usr/bin/env bash
# One prepared run on a lent GPU machine, inside one device call's 10 minutes: unpack the kit that
# `python -m benchmark.device_kit pack` made here, then the CUDA tests, the model alone on the
# service's passes (fp32 and fp16, SDPA and eager attention), and the `gpu` benchmark scenario.
# Everything it prints and writes lands in $OUT, six files (the device tool brings back eight):
#
#   device run, carry [".device"], timeout_s 600:  bash benchmark/gpu_session.sh
#
# PYTHON names another interpreter (the GPU machines' python3 holds torch); a step that runs past
# its share of the time is stopped and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu-session}
KIT=${KIT:-.device}
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
step cuda-tests 180 "$PYTHON" -m pytest -q -p no:cacheprovider -m cuda tests/cuda
DEVICE=cuda step cuda-passes 90 "$PYTHON" -m benchmark.cuda_passes "$MODEL"
step gpu-scenario 270 "$PYTHON" -m benchmark.run --only gpu --repeats 1 --model "$MODEL" --out "$OUT/gpu"
