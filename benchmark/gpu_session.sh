#!/usr/bin/env bash
# Prepared runs on a lent GPU machine, within one device call's 10 minutes: unpack the kit that
# `python -m benchmark.device_kit pack` made here, then the steps named (default: tests sweep,
# which fit one call; a session has 15 minutes of device time, the machine's start included):
#
#   tests     the CUDA tests (tests/cuda; 12 of them took 222 s on an H200, 13 now)
#   model     the model alone (benchmark/cuda_passes.py): passes of shapes it has not met, SDPA with
#             and without cuDNN (the fp16 slowdown's suspect) and eager; one short text per pass
#             (the model's share of batch-1 latency)
#   sweep     the service, with CUDA graphs (the default), at 8 workers in fp16 and fp32 and at 2
#             and 4 in fp16, each tokenizing on its default share of the cores (1, 4 and 2 threads),
#             and at 8 in fp16 with jobs of 32 texts (a request of 256 then reaches all 8 workers, not
#             4) and tokenizing on 2 threads each, beside sentence-transformers in fp16 in process,
#             under the issue's loads (benchmark/gpu_sweep.py): goals 1, 2 and 4, most telling first
#   passes    the model alone on the service's passes, warmed up: fp32 and fp16, SDPA and eager
#   precision the model's rows in fp16 and bf16 against fp32 on the GPU (benchmark/half_precision.py)
#   pipeline  what one hop between two processes costs there (benchmark/hops.py), then the server's own
#             ceiling on the zero backend, on the host's 16 cores, clients in 8 processes, with its
#             processes where the OS likes (the default) and kept on CPUs of their own (--pin-cpus)
#   profile   where the workers' CPU goes in the 32-client cell (32 texts a request), at 8 workers
#             and at 2, and for one-text requests one at a time (benchmark/cpu_split.py --py-spy: CPU
#             per request by stage and thread, the part of it in Python and where that goes): goal 2's
#             open question, why 8 workers spend 2.4x the CPU per request that 2 do
#   graphs    CUDA graphs (on by default): their CUDA tests, the backend with and without them
#             (benchmark/cuda_passes.py), and the service at 8 workers in fp16 with and without them, and
#             holding 2 bulk jobs a lane instead of the default 3 on cuda, and with its processes kept on
#             CPUs of their own (--pin-cpus), 8 in fp32 with them, beside sentence-transformers in fp16
#
#   device run, carry [".device"], timeout_s 600:  bash benchmark/gpu_session.sh
#   a second call, if device time is left:         bash benchmark/gpu_session.sh profile
#
# Everything it prints and writes lands in $OUT, a file or two a step (the device tool brings back
# eight: tests, sweep and profile make seven). PYTHON names another interpreter (the GPU machines'
# python3 holds torch); a step that runs past its share of the time is stopped and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
OUT=${OUT:-/tmp/gpu-session}
KIT=${KIT:-.device}
STEPS=${*:-tests sweep}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
"$PYTHON" -m benchmark.device_kit unpack "$KIT" > "$OUT/setup.log" 2>&1 || { cat "$OUT/setup.log"; exit 1; }
export PYTHONPATH="$PWD/$KIT/site:$PWD" PATH="$PWD/$KIT/site/bin:$PATH"
MODEL="$PWD/$KIT/model"
{ nvidia-smi -L; "$PYTHON" -c "import torch; print('torch', torch.__version__, 'cuda:', torch.cuda.is_available())"
  echo "cpus: $(nproc)"; grep -m3 -E "model name|siblings|cpu cores" /proc/cpuinfo; } \
    >> "$OUT/setup.log" 2>&1  # siblings twice cpu cores: two hardware threads a core, sharing it
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
        tests) step cuda-tests 280 "$PYTHON" -m pytest -v -p no:cacheprovider -m cuda tests/cuda ;;
        model) DEVICE=cuda step model-alone 100 "$PYTHON" -m benchmark.cuda_passes "$MODEL" --count 1024 \
                   --only unseen single ;;
        passes) DEVICE=cuda step cuda-passes 150 "$PYTHON" -m benchmark.cuda_passes "$MODEL" --only warmed ;;
        sweep) step gpu-sweep 310 "$PYTHON" -m benchmark.gpu_sweep "$MODEL" --baselines fp16 --services \
                   8:fp16 2:fp16 8:fp32 4:fp16 8:fp16:rows32 8:fp16:tok2 --out "$OUT/gpu-sweep.json" ;;
        profile) for cell in "8 32 32" "2 32 32" "8 1 1"; do
                     set -- $cell
                     step "profile-$1w-$2x$3" 110 "$PYTHON" -m benchmark.cpu_split --py-spy --model "$MODEL" \
                         --clients "$2" --batch "$3" --loaders "$(( $2 < 8 ? $2 : 8 ))" --warmup 4 --seconds 8 \
                         -- --device cuda --fp16 --num-worker "$1"
                 done ;;
        precision) DEVICE=cuda step half-precision 60 "$PYTHON" -m benchmark.half_precision "$MODEL" ;;
        graphs) step graph-tests 120 "$PYTHON" -m pytest -v -p no:cacheprovider -m cuda tests/cuda -k "graphs or memory"
                DEVICE=cuda step graph-passes 60 "$PYTHON" -m benchmark.cuda_passes "$MODEL" --count 1024 --only graphs
                step graph-sweep 250 "$PYTHON" -m benchmark.gpu_sweep "$MODEL" --baselines fp16 --services \
                    8:fp16 8:fp16:eager 8:fp16:prefetch2 8:fp16:pinned 8:fp32 --out "$OUT/graph-sweep.json" ;;
        pipeline) step pipeline 120 "$PYTHON" -m benchmark.pipeline --model "$MODEL" --seconds 5 --repeats 1 \
                      --loaders 8 --out "$OUT/pipeline.json"
                  step pipeline-pinned 120 "$PYTHON" -m benchmark.pipeline --model "$MODEL" --seconds 5 \
                      --repeats 1 --loaders 8 --out "$OUT/pipeline-pinned.json" -- --pin-cpus ;;
        *) echo "unknown step $name (tests, model, sweep, passes, precision, pipeline, profile, graphs)"; exit 2 ;;
    esac
done
