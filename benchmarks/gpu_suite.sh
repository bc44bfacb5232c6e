#!/usr/bin/env bash
# The recorded GPU run, in stages that fit the device machine's 10-minute command limit:
#   bash benchmarks/gpu_suite.sh tests,kernels_a,decode          (first call)
#   bash benchmarks/gpu_suite.sh kernels_b,head_dims,recompute,hybrid,smem,model   (second call)
# Needs the baseline wheels in .whl/ (carried; see benchmarks/gpu_setup.sh). Everything lands in $OUT/results.tgz
# (JSON, PNG, logs) plus $OUT/summary.log; unpack it into benchmarks/results/ on the workstation.
set -uo pipefail
stages="${1:-tests,kernels_a,decode}"
out="${OUT:-/tmp/out}"
res=/tmp/gpu_results
mkdir -p "$res" "$out"
export PYTHONUNBUFFERED=1
eval "$(bash benchmarks/gpu_setup.sh . | tail -n 1)"
export PYTHONPATH="$PWD:$PYTHONPATH"  # the repo itself, no install step on the offline machine
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$res/machine.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$res/machine.txt"

run() {  # run NAME SECONDS COMMAND...
    local name=$1 secs=$2; shift 2
    local t0=$SECONDS
    timeout "$secs" "$@" >"$res/$name.log" 2>&1
    local rc=$?
    echo "stage $name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$res/summary.log"
    tail -n 25 "$res/$name.log"
    # pack after every stage: what finished comes back even if the call hits its time limit
    tar czf "$out/results.tgz" -C "$res" . && cp "$res/summary.log" "$out/summary.log"
}

for stage in ${stages//,/ }; do
    case $stage in
        tests) run tests 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops tests/distributed ;;
        tests_short) run tests_short 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_decode_gpu.py \
                         tests/ops/test_recompute.py ;;
        kernels_a3) run kernels_a3 200 python3 -m lightning_attention.bench kernels --grid a --seqlens 2048,8192,32768 \
                        --out "$res/kernels_a3" ;;
        kernels_b128k) run kernels_b128k 90 python3 -m lightning_attention.bench kernels --grid b --seqlens 131072 \
                           --out "$res/kernels_b128k" ;;
        kernels_a) run kernels_a 290 python3 -m lightning_attention.bench kernels --grid a --out "$res/kernels" ;;
        kernels_b) run kernels_b 200 python3 -m lightning_attention.bench kernels --grid b --out "$res/kernels_b" ;;
        head_dims) run head_dims 200 python3 -m lightning_attention.bench kernels --grid a --head-dims 64,256 \
                       --ours chunk --out "$res/head_dims" ;;
        decode) run decode 150 python3 -m lightning_attention.bench decode --out "$res/decode" ;;
        recompute) run recompute 120 python3 benchmarks/recompute_timing.py --out "$res/recompute_timing.json" ;;
        hybrid) run hybrid 120 python3 -m lightning_attention.bench hybrid --out "$res/hybrid" ;;
        smem) run smem 120 python3 benchmarks/recompute_smem_table.py --dims all --jobs 16 \
                  --markdown-out "$res/recompute_smem_triton-3.6.0.md" ;;
        model) run model 150 python3 -m lightning_attention.bench.model_timing --contexts 2048 8192 32768 65536 \
                   --loss-steps 0 ;;
        *) echo "unknown stage $stage" ;;
    esac
done
