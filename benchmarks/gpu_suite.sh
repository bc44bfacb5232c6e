#!/usr/bin/env bash
# The recorded GPU run, in stages that fit the device machine's 10-minute command limit:
#   bash benchmarks/gpu_suite.sh tests,kernels_a,decode          (first call)
#   bash benchmarks/gpu_suite.sh kernels_b,head_dims,recompute,hybrid,smem,model   (second call)
#   bash benchmarks/gpu_suite.sh sp,tables                       (on nvidia-h200-x2: issue 9, about 7.5 min at most)
# Stage `tables` (put it last) prints PERF.md's tables and the targets check of everything the call measured.
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
# compiled kernels survive between calls: carry .tcache_pack (ours) and/or .tcache_pack_fla (FLA's, for the
# baselines), git-ignored, each the split tar of a Triton cache (stage pack_cache; a call carries at most 64 MiB)
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/.tcache}"
mkdir -p "$TRITON_CACHE_DIR"
for pack in .tcache_pack .tcache_pack_fla; do
    if [ -d "$pack" ] && ls "$pack"/tcache.part-* >/dev/null 2>&1; then
        cat "$pack"/tcache.part-* | tar xzf - -C "$TRITON_CACHE_DIR" && echo "triton cache + $pack: $(du -sh "$TRITON_CACHE_DIR")"
    fi
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$res/machine.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$res/machine.txt"

# pinned configurations the head-dim sweeps try: (BT, BV, warps, stages) around a [K, BV] fp32 state of <= 64
# registers per thread (K = 256: BV = 32 with 4 warps or BV = 64 with 8) and the configurations tuned today
SWEEP_D256="BT=64,BV=64,num_warps=4,num_stages=1;BT=64,BV=64,num_warps=8,num_stages=1;BT=64,BV=64,num_warps=8,num_stages=2"
SWEEP_D256+=";BT=64,BV=32,num_warps=4,num_stages=1;BT=64,BV=32,num_warps=4,num_stages=2;BT=32,BV=64,num_warps=8,num_stages=1"
SWEEP_D256+=";BT=32,BV=32,num_warps=4,num_stages=1;BT=64,BV=128,num_warps=8,num_stages=1"
SWEEP_D256_BT128="BT=128,BV=64,num_warps=8,num_stages=1;BT=64,BV=64,num_warps=8,num_stages=2;BT=128,BV=64,num_warps=4,num_stages=1"
SWEEP_D64="BT=64,BV=64,num_warps=4,num_stages=1;BT=64,BV=64,num_warps=8,num_stages=1;BT=64,BV=32,num_warps=4,num_stages=1"
SWEEP_D64+=";BT=32,BV=64,num_warps=4,num_stages=1;BT=128,BV=64,num_warps=8,num_stages=1;BT=64,BV=64,num_warps=4,num_stages=2"

UNCHAIN_D128="BT=64,BV=64,num_warps=4,num_stages=3;BT=64,BV=64,num_warps=4,num_stages=2;BT=64,BV=64,num_warps=8,num_stages=2"
UNCHAIN_D128+=";BT=64,BV=64,num_warps=8,num_stages=3;BT=64,BV=128,num_warps=8,num_stages=2;BT=128,BV=64,num_warps=8,num_stages=2"
UNCHAIN_D128_OLD="BT=64,BV=64,num_warps=4,num_stages=3;BT=64,BV=64,num_warps=4,num_stages=2;BT=64,BV=128,num_warps=8,num_stages=2"
UNCHAIN_D128_LONG="BT=64,BV=64,num_warps=4,num_stages=3;BT=64,BV=64,num_warps=8,num_stages=3;BT=64,BV=128,num_warps=8,num_stages=2"
UNCHAIN_D128_LONG_OLD="BT=64,BV=64,num_warps=4,num_stages=3"
UNCHAIN_D256="BT=64,BV=64,num_warps=8,num_stages=2;BT=64,BV=64,num_warps=4,num_stages=1"
UNCHAIN_D256_OLD="BT=64,BV=64,num_warps=8,num_stages=2"
UNCHAIN_D64="BT=64,BV=64,num_warps=4,num_stages=2;BT=64,BV=64,num_warps=4,num_stages=3;BT=64,BV=64,num_warps=8,num_stages=2"
UNCHAIN_D64_OLD="BT=64,BV=64,num_warps=4,num_stages=2"
TMA_VERIFY_D128="BT=64,BV=64,num_warps=4,num_stages=3;BT=64,BV=64,num_warps=4,num_stages=2;BT=64,BV=128,num_warps=8,num_stages=2"
TMA_STAGES_D128="BT=64,BV=64,num_warps=4,num_stages=2;BT=64,BV=64,num_warps=4,num_stages=3;BT=64,BV=64,num_warps=4,num_stages=4"
TMA_HOST_SHAPES="2x32768,1x65536,8x8192,32x2048,16x4096x256"
UNCHAIN_VERIFY_D128="BT=64,BV=64,num_warps=8,num_stages=2;BT=64,BV=64,num_warps=8,num_stages=3;BT=64,BV=128,num_warps=8,num_stages=2"

run() {  # run NAME SECONDS COMMAND...
    local name=$1 secs=$2; shift 2
    local t0=$SECONDS
    timeout -k 15 "$secs" "$@" >"$res/$name.log" 2>&1  # -k: SIGKILL whatever ignores the SIGTERM
    local rc=$?
    echo "stage $name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$res/summary.log"
    tail -n 25 "$res/$name.log"
    # pack after every stage: what finished comes back even if the call hits its time limit
    tar czf "$out/results.tgz" -C "$res" . && cp "$res/summary.log" "$out/summary.log"
}

for stage in ${stages//,/ }; do
    case $stage in
        # the GPU suite and the CPU suite's chunk and library tests compiled on the GPU: pytest-xdist workers (in the
        # machine's image) share the GPU and compile side by side (one process took > 130 s for 5 of 70 tests)
        tests) run tests "${TESTS_S:-250}" python3 -m pytest -q -m gpu -p no:cacheprovider -n 6 --durations=15 \
                   tests/ops tests/distributed ;;
        tests_decode) run tests_decode 120 python3 -m pytest -q -p no:cacheprovider tests/ops/test_decode_gpu.py \
                          tests/ops/test_decode_launch.py ;;
        tests_short) run tests_short 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_decode_gpu.py \
                         tests/ops/test_recompute.py ;;
        kernels_a3) run kernels_a3 200 python3 -m lightning_attention.bench kernels --grid a --seqlens 2048,8192,32768 \
                        --out "$res/kernels_a3" ;;
        kernels_b128k) run kernels_b128k 150 python3 -m lightning_attention.bench kernels --grid b --seqlens 131072 \
                           --ours chunk --baselines fla --out "$res/kernels_b128k" ;;
        # the PyTorch path (a reference, 1.2 s per fwd+bwd at 32K) stays out of the recorded grids
        kernels_a) run kernels_a 330 python3 -m lightning_attention.bench kernels --grid a --ours chunk,recompute \
                       --out "$res/kernels" ;;
        # the segmented part of grid (a) with FLA, and grid (b) ours only (FLA's grid (b) compile alone takes ~3 min)
        kernels_a_long) run kernels_a_long 300 python3 -m lightning_attention.bench kernels --grid a --ours chunk \
                            --baselines fla --seqlens 16384,32768,65536 --out "$res/kernels_a_long" ;;
        # (with CUDA-graph replays beside the plain calls: at batch 1 and 32K the fwd+bwd waits on the host)
        kernels_b_ours) run kernels_b_ours 150 python3 -m lightning_attention.bench kernels --grid b --ours chunk \
                            --baselines none --cuda-graphs --out "$res/kernels_b_ours" ;;
        kernels_b) run kernels_b 200 python3 -m lightning_attention.bench kernels --grid b --ours chunk,recompute \
                       --out "$res/kernels_b" ;;
        head_dims) run head_dims 270 python3 -m lightning_attention.bench kernels --grid a --head-dims 64,256 \
                       --ours chunk --baselines fla --out "$res/head_dims" ;;
        kernels_h200_fla) run kernels_h200_fla 240 python3 -m lightning_attention.bench kernels --grid a --ours chunk \
                              --baselines fla --seqlens 2048,8192,32768 --out "$res/kernels_h200_fla" ;;
        kernels_h200) run kernels_h200 200 python3 -m lightning_attention.bench kernels --grid a --ours chunk \
                          --baselines fla,sdpa --seqlens 2048,8192,32768 --out "$res/kernels_h200" ;;
        host_profile) run host_profile 60 python3 benchmarks/host_profile.py --shape 32x2048 --calls 100 \
                          --out "$res/host_profile.txt" ;;
        inter_debug) run inter_debug 150 python3 benchmarks/inter_debug.py ;;
        inter_debug_dims) run inter_debug_dims 300 python3 benchmarks/inter_debug.py --head-dims ;;
        inter_debug_stages) run inter_debug_stages 100 python3 benchmarks/inter_debug.py --stages ;;
        # three pipeline stages at K = 128 and 64 (configs.PREFERRED_BY_BK), with the compiled shared memory
        sweep_stages) run sweep_d128 90 python3 benchmarks/chunk_sweep.py --D 128 --B 4 --T 16384 --inter input \
                          --configs "BT=64,BV=64,num_warps=4,num_stages=1;BT=64,BV=64,num_warps=4,num_stages=3;BT=64,BV=64,num_warps=4,num_stages=4" \
                          --out "$res/chunk_sweep_d128.json"
                      run sweep_d64_stages 60 python3 benchmarks/chunk_sweep.py --D 64 --B 4 --T 16384 --inter input \
                          --configs "BT=64,BV=64,num_warps=4,num_stages=2;BT=64,BV=64,num_warps=4,num_stages=3" \
                          --out "$res/chunk_sweep_d64_stages.json" ;;
        # the whole grid (a) with FLA only (official and SDPA: session 3, h100-2026-11-22k)
        kernels_a_fla) run kernels_a_fla "${KERNELS_A_FLA_S:-280}" python3 -m lightning_attention.bench kernels --grid a \
                           --ours chunk --baselines fla --out "$res/kernels_a_fla" ;;
        host) run host 60 python3 benchmarks/host_overhead.py --out "$res/host_overhead.json" ;;
        # the same through Triton's normal launch path (kernels/launch.py off): the direct launch's gain
        host_normal) run host_normal 60 env LIGHTNING_ATTENTION_DIRECT_LAUNCH=0 python3 benchmarks/host_overhead.py \
                         --out "$res/host_overhead_normal.json" ;;
        decode) run decode 150 python3 -m lightning_attention.bench decode --out "$res/decode" ;;
        recompute) run recompute 120 python3 benchmarks/recompute_timing.py --out "$res/recompute_timing.json" ;;
        hybrid) run hybrid 90 python3 -m lightning_attention.bench hybrid --out "$res/hybrid" ;;
        smem) run smem 120 python3 benchmarks/recompute_smem_table.py --dims all --jobs 16 \
                  --markdown-out "$res/recompute_smem_triton-3.6.0.md" ;;
        sp) # 2 GPUs, NCCL; NVLink multicast stays off (only filled in when unset, never switched on)
            export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}" TORCH_SYMM_MEM_DISABLE_MULTICAST="${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}" \
                   NVSHMEM_DISABLE_NVLS="${NVSHMEM_DISABLE_NVLS:-1}"
            sp_run="python3 -m torch.distributed.run --standalone --nproc_per_node 2"
            run sp_check 160 $sp_run benchmarks/sp_check_gpu.py --out "$res/sp"
            run sp_scaling 260 $sp_run benchmarks/sp_scaling.py --budget-s 220 --trial-cap-s 40 --timeout-min 4 \
                --out "$res/sp" ;;
        # Nsight Compute over one call per shape (benchmarks/ncu_profile.py; NCU_SHAPES overrides the shapes): the
        # details page (speed of light, memory, warp stalls, occupancy) and per-SASS-line stall samples as text, the
        # report itself (gzipped) beside results.tgz when it fits the 16 MiB a returned file may have
        ncu) ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -n 1)
             run ncu 420 "$ncu_bin" --profile-from-start off --clock-control none --set full --import-source no -f \
                 -o /tmp/ncu_walk python3 benchmarks/ncu_profile.py \
                 --shapes "${NCU_SHAPES:-2x32768:fwd,8x8192:fwd,16x4096x256:fwd_bwd}"
             run ncu_details 120 "$ncu_bin" --import /tmp/ncu_walk.ncu-rep --page details --print-units base
             run ncu_raw 120 "$ncu_bin" --import /tmp/ncu_walk.ncu-rep --page raw --csv
             run ncu_sass 200 "$ncu_bin" --import /tmp/ncu_walk.ncu-rep --page source --print-source sass --csv
             gzip -c /tmp/ncu_walk.ncu-rep >"$out/ncu_walk.ncu-rep.gz" ;;
        # tensor descriptors in the walk (session 7): each pass timed with them (default), without them
        # (LIGHTNING_ATTENTION_TMA=0) and for an older package in .old/ (see unchain_probe), then the default
        # configurations checked against float64 with descriptors, unsegmented and in segments of 256
        tma_probe) shapes="${TMA_SHAPES:-2x32768,8x8192,16x4096x256}"
                   run tma_passes_new 200 python3 benchmarks/chunk_passes.py --shapes "$shapes" --out "$res/tma_passes_new.json"
                   run tma_passes_ptr 200 env LIGHTNING_ATTENTION_TMA=0 python3 benchmarks/chunk_passes.py --shapes "$shapes" \
                       --out "$res/tma_passes_ptr.json"
                   run tma_passes_old 120 env PYTHONPATH="$PWD/.old:$PYTHONPATH" python3 benchmarks/chunk_passes.py \
                       --shapes "$shapes" --out "$res/tma_passes_old.json"
                   run tma_verify_d128 120 python3 benchmarks/inter_debug.py --pins 128 "$TMA_VERIFY_D128"
                   run tma_verify_d256 60 python3 benchmarks/inter_debug.py --pins 256 "BT=64,BV=64,num_warps=8,num_stages=2" ;;
        # pipeline depth with tensor descriptors at K = 128 (no registers for addresses: four stages compile without
        # spills, 180 KB): pinned sweeps at one program per SM (2 x 32K, 1 x 64K) and at 2 rounds (8 x 8K), fwd and
        # fwd+bwd through the op for this package and .old/, four stages checked against float64
        tma_stages) for shape in "2 32768" "8 8192" "1 65536"; do
                        set -- $shape
                        run "tma_sweep_d128_$2" 110 python3 benchmarks/chunk_sweep.py --D 128 --B "$1" --T "$2" --inter input \
                            --configs "$TMA_STAGES_D128" --out "$res/tma_sweep_d128_$2.json"
                    done
                    run tma_host_new 150 python3 benchmarks/host_overhead.py --shapes "$TMA_HOST_SHAPES" --out "$res/tma_host_new.json"
                    run tma_host_old 90 env PYTHONPATH="$PWD/.old:$PYTHONPATH" python3 benchmarks/host_overhead.py \
                        --shapes "$TMA_HOST_SHAPES" --out "$res/tma_host_old.json"
                    run tma_verify_s4 60 python3 benchmarks/inter_debug.py --pins 128 "BT=64,BV=64,num_warps=4,num_stages=4" ;;
        # grid (b)'s shortest point (batch 1 at 32K): device time (graph replay) against host time, and where the host
        # time of one fwd+bwd goes
        host_b32k) run host_b32k 90 python3 benchmarks/host_overhead.py --shapes 1x32768,2x32768 --out "$res/host_b32k.json"
                   run host_profile_b32k 60 python3 benchmarks/host_profile.py --shape 1x32768 --calls 100 \
                       --out "$res/host_profile_b32k.txt" ;;
        # the same at K = 64 (two programs per SM up to four stages there: 57 / 82 / 107 KB), and K = 256's two tuned
        # configurations with descriptors
        tma_stages_d64) for shape in "8 8192" "4 16384" "1 65536"; do
                            set -- $shape
                            run "tma_sweep_d64_$2" 100 python3 benchmarks/chunk_sweep.py --D 64 --B "$1" --T "$2" --inter input \
                                --configs "$TMA_STAGES_D128" --out "$res/tma_sweep_d64_$2.json"
                        done
                        run tma_sweep_d256_4096 100 python3 benchmarks/chunk_sweep.py --D 256 --B 16 --T 4096 --inter input \
                            --configs "BT=64,BV=64,num_warps=8,num_stages=2;BT=64,BV=64,num_warps=4,num_stages=1" \
                            --out "$res/tma_sweep_d256_4096.json"
                        run tma_verify_d64_s4 60 python3 benchmarks/inter_debug.py --pins 64 "BT=64,BV=64,num_warps=4,num_stages=4" ;;
        # 32-wide value tiles with 4 warps at K = 256 through descriptors (three stages fit: 225 KB, no spills in a local
        # build), admitted for the probe only (PROBE_WALK_MIN_TILE; configs.WALK_MIN_TILE keeps them out: with pointers
        # they faulted in session 4): checked against float64 first, then timed beside the tuned configuration
        narrow_probe) NARROW_D256="BT=64,BV=32,num_warps=4,num_stages=3;BT=64,BV=32,num_warps=4,num_stages=2"
                      run narrow_verify_d256 150 env PROBE_WALK_MIN_TILE=32 python3 benchmarks/inter_debug.py --pins 256 \
                          "$NARROW_D256"
                      run narrow_sweep_d256 150 env PROBE_WALK_MIN_TILE=32 python3 benchmarks/chunk_sweep.py --D 256 --B 16 \
                          --T 4096 --inter input --configs "$NARROW_D256;BT=64,BV=64,num_warps=8,num_stages=2" \
                          --out "$res/narrow_sweep_d256.json" ;;
        # K = 64 with descriptors, A/B in one call: this package against a variant in .old/ (four stages first, so the
        # plan counts one program per SM and does not segment 8 x 8K)
        d64_ab) run d64_ab_new 150 python3 -m lightning_attention.bench kernels --grid a --head-dims 64 --ours chunk \
                    --baselines fla --out "$res/d64_ab_new"
                run d64_ab_alt 150 env PYTHONPATH="$PWD/.old:$PYTHONPATH" python3 -P -m lightning_attention.bench kernels \
                    --grid a --head-dims 64 --ours chunk --baselines fla --out "$res/d64_ab_alt" ;;
        # this package against the one in .old/ as host, plain and CUDA-graph time (host_overhead.py; replays are what
        # the host cannot move): K = 64 (d64_ab_graph, session 7), and two host-bound K = 128 shapes too (host_ab,
        # session 8's launch replay). Files: <stage>_new.json, <stage>_old.json (-z21/-z23: d64_graph_{new,alt})
        d64_ab_graph|host_ab) shapes="16x4096x64,8x8192x64,4x16384x64,2x32768x64,1x65536x64"
                      [ "$stage" = host_ab ] && shapes+=",1x32768,32x2048"
                      run "${stage}_new" 150 python3 benchmarks/host_overhead.py --shapes "$shapes" --out "$res/${stage}_new.json"
                      run "${stage}_old" 150 env PYTHONPATH="$PWD/.old:$PYTHONPATH" python3 benchmarks/host_overhead.py \
                          --shapes "$shapes" --out "$res/${stage}_old.json" ;;
        # K = V = 64 is host-bound (session 7): device and host time of four plans per shape (default; the fused dk/dv
        # walk; unsegmented; both), the fused walk checked against float64 on the GPU, and the host's timeline
        d64_plans) shapes="16x4096x64,8x8192x64,4x16384x64,2x32768x64,1x65536x64"
                   run d64_plan_default 120 python3 benchmarks/host_overhead.py --shapes "$shapes" --out "$res/d64_plan_default.json"
                   run d64_plan_dkdv 150 env LIGHTNING_ATTENTION_DKDV=1 python3 benchmarks/host_overhead.py --shapes "$shapes" \
                       --out "$res/d64_plan_dkdv.json"
                   run d64_plan_whole 120 env LIGHTNING_ATTENTION_SEGMENT_LEN=0 python3 benchmarks/host_overhead.py \
                       --shapes "$shapes" --out "$res/d64_plan_whole.json"
                   run d64_plan_whole_dkdv 120 env LIGHTNING_ATTENTION_SEGMENT_LEN=0 LIGHTNING_ATTENTION_DKDV=1 \
                       python3 benchmarks/host_overhead.py --shapes "$shapes" --out "$res/d64_plan_whole_dkdv.json"
                   run d64_dkdv_verify 150 python3 -m pytest -q -p no:cacheprovider -n 8 -k fused_dkdv tests/ops/test_chunk.py
                   run host_trace 150 python3 benchmarks/host_trace.py --shapes 8x8192x64,2x32768x64 --out "$res/host_trace" ;;
        # launch replay (session 8): its tests compiled on the GPU (its A/B: stage host_ab above)
        tests_replay) run tests_replay 150 python3 -m pytest -q -p no:cacheprovider tests/ops/test_replay.py \
                          tests/ops/test_tma.py ;;
        # the K = 64 plan per shape, kernel by kernel, with the configurations each launch key took: this package (plan
        # and replay as shipped, replay off, whole sequences, 4K segments) and the one in .old/
        d64_plan_probe) shapes="8x8192x64,4x16384x64,2x32768x64"
                        run probe_new 90 python3 benchmarks/chunk_profile.py --shapes "$shapes" --out "$res/probe_new.json"
                        run probe_noreplay 90 env LIGHTNING_ATTENTION_REPLAY=0 python3 benchmarks/chunk_profile.py \
                            --shapes "$shapes" --out "$res/probe_noreplay.json"
                        run probe_whole 90 env LIGHTNING_ATTENTION_SEGMENT_LEN=0 python3 benchmarks/chunk_profile.py \
                            --shapes "$shapes" --out "$res/probe_whole.json"
                        run probe_seg4k 90 env LIGHTNING_ATTENTION_SEGMENT_LEN=4096 python3 benchmarks/chunk_profile.py \
                            --shapes "$shapes" --out "$res/probe_seg4k.json"
                        run probe_old 90 env PYTHONPATH="$PWD/.old:$PYTHONPATH" python3 benchmarks/chunk_profile.py \
                            --shapes "$shapes" --out "$res/probe_old.json" ;;
        # short sequences pay each program's setup (descriptors, pipeline fill) over few chunks: K = 128 and 256 at 1K /
        # 2K with descriptors and with pointers (LIGHTNING_ATTENTION_TMA=0), and K = 256 at batch 1 (whole since
        # session 8: programs counted at the 32-wide tile) against the package in .old/ (two segments)
        short_t_probe) shapes="64x1024,32x2048,64x1024x256,32x2048x256,1x65536x256"
                       run short_tma 150 python3 benchmarks/host_overhead.py --shapes "$shapes" --out "$res/short_tma.json"
                       run short_ptr 150 env LIGHTNING_ATTENTION_TMA=0 python3 benchmarks/host_overhead.py --shapes "$shapes" \
                           --out "$res/short_ptr.json"
                       run d256_b1_old 90 env PYTHONPATH="$PWD/.old:$PYTHONPATH" python3 benchmarks/host_overhead.py \
                           --shapes 1x65536x256 --out "$res/d256_b1_old.json" ;;
        # K = 256, kernel by kernel (which pass takes the time, and the configuration each launch key took)
        d256_profile) run d256_profile 120 python3 benchmarks/chunk_profile.py --shapes 64x1024x256,16x4096x256,2x32768x256 \
                          --out "$res/d256_profile.json"
                      run d256_pins 150 python3 benchmarks/chunk_sweep.py --D 256 --B 16 --T 4096 --inter input \
                          --configs "BT=64,BV=32,num_warps=4,num_stages=3;BT=64,BV=64,num_warps=8,num_stages=2" \
                          --out "$res/d256_pins.json" ;;
        # K = 256 with 32-token chunks (q·kᵀ per token halves; the state update and q·S per token do not change): pinned
        # sweep at 16 × 4K with descriptors (PROBE_WALK_MIN_TILE=32 keeps the 32-wide tiles), then checked against float64
        d256_bt32) pins="BT=32,BV=32,num_warps=4,num_stages=3;BT=32,BV=32,num_warps=4,num_stages=4"
                   pins+=";BT=32,BV=64,num_warps=8,num_stages=3;BT=32,BV=64,num_warps=4,num_stages=3;BT=64,BV=32,num_warps=4,num_stages=3"
                   run d256_bt32_sweep 200 env PROBE_WALK_MIN_TILE=32 python3 benchmarks/chunk_sweep.py --D 256 --B 16 --T 4096 \
                       --inter input --configs "$pins" --out "$res/d256_bt32_sweep.json"
                   run d256_bt32_verify 200 env PROBE_WALK_MIN_TILE=32 python3 benchmarks/inter_debug.py --pins 256 "$pins" ;;
        # replay with bound launches against replay off and the package in .old/: kernels in launch order per shape
        bound_probe) shapes="8x8192x64,16x4096x256,1x65536x256"
                     run bound_on 120 python3 benchmarks/chunk_profile.py --shapes "$shapes" --out "$res/bound_on.json"
                     run bound_off 120 env LIGHTNING_ATTENTION_REPLAY=0 python3 benchmarks/chunk_profile.py --shapes "$shapes" \
                         --out "$res/bound_off.json" ;;
        # Triton's automatic warp specialisation of the walk's chunk loop (a producer warpgroup issues the TMA loads,
        # consumers compute; kernels/walk.py WARP_SPEC, pinned with warp_spec=1): timed beside the tuned tiles, then
        # checked against float64. Local sm_90 builds (triton 3.6): K = 256 with two stages (172 / 213 KB for 32- / 64-
        # wide tiles), K = 128 with four (197 KB); the pass fails at K = 128 with 2 or 3 stages, and on the H100 also
        # for the 32-wide K = 256 tile (-z34; slower where it compiled: NOTES-kernels.md, session 9)
        ws_probe) pins="BT=64,BV=32,num_warps=4,num_stages=2,warp_spec=1;BT=64,BV=64,num_warps=4,num_stages=2,warp_spec=1"
                  run ws_sweep_d256 240 env PROBE_WALK_MIN_TILE=32 python3 benchmarks/chunk_sweep.py --D 256 --B 16 --T 4096 \
                      --inter input --configs "$pins;BT=64,BV=32,num_warps=4,num_stages=3" --out "$res/ws_sweep_d256.json"
                  run ws_sweep_d256_1k 200 env PROBE_WALK_MIN_TILE=32 python3 benchmarks/chunk_sweep.py --D 256 --B 64 --T 1024 \
                      --inter input --configs "$pins;BT=64,BV=32,num_warps=4,num_stages=3" --out "$res/ws_sweep_d256_1k.json"
                  run ws_sweep_d128 150 python3 benchmarks/chunk_sweep.py --D 128 --B 8 --T 8192 --inter input \
                      --configs "BT=64,BV=64,num_warps=4,num_stages=4,warp_spec=1;BT=64,BV=64,num_warps=4,num_stages=4" \
                      --out "$res/ws_sweep_d128.json"
                  run ws_verify_d256 200 env PROBE_WALK_MIN_TILE=32 python3 benchmarks/inter_debug.py --pins 256 "$pins" ;;
        tables) run tables 60 python3 -m lightning_attention.bench.tables "$res" --out "$res/tables.md" ;;  # last: reads all
        model) run model 150 python3 -m lightning_attention.bench.model_timing --contexts 2048 8192 32768 65536 \
                   --loss-steps 0 ;;
        # issue 10: the model benchmark CLI (throughput per context, both archs, and short loss curves)
        bench_model) run bench_model 200 python3 -m lightning_attention.bench model --loss-steps 400 \
                         --out "$res/bench_model" ;;
        timing) run timing 260 python3 benchmarks/chunk_timing.py --long 131072,1048576 --out "$res/chunk_timing.json" ;;
        timing_twowalk) run timing_twowalk 90 env LIGHTNING_ATTENTION_DKDV=0 python3 benchmarks/chunk_timing.py \
                            --lengths 2048,32768 --long "" --out "$res/chunk_timing_twowalk.json" ;;
        profile) run profile 100 python3 benchmarks/chunk_profile.py --out "$res/chunk_profile.json" ;;
        # one process (no xdist): 130 s cut it after 11 tests once each walk tunes per WAVES class (h100-2026-11-22z3)
        tests_chunk) run tests_chunk 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_chunk_gpu.py ;;
        # (with the recompute backward's CPU cases: its narrow head dims; TESTS_CHUNK_CUDA_K: a pytest -k expression,
        # to run part of them)
        tests_chunk_cuda) run tests_chunk_cuda "${TESTS_CHUNK_CUDA_S:-280}" python3 -m pytest -q -p no:cacheprovider -n 10 \
                              --durations=15 ${TESTS_CHUNK_CUDA_K:+-k "$TESTS_CHUNK_CUDA_K"} tests/ops/test_chunk.py \
                              tests/ops/test_library.py tests/ops/test_recompute.py ;;
        # issue 4, small and large head dims: where a K = V = 64 segmented fwd+bwd spends its time (host split, kernels,
        # passes) and which pinned configurations run K = V = 256 (and 64) fastest
        diag_host) run diag_host 120 python3 benchmarks/host_overhead.py \
                       --shapes 16x4096x64,4x16384x64,2x32768x64,4x16384,1x32768 --out "$res/host_overhead.json" ;;
        host_profile_d64) run host_profile_d64 60 python3 benchmarks/host_profile.py --shape 4x16384x64 --calls 100 \
                              --out "$res/host_profile_d64.txt" ;;
        profile_d64) run profile_d64 90 python3 benchmarks/chunk_profile.py \
                         --shapes 16x4096x64,4x16384x64,2x32768x64,4x16384 --out "$res/chunk_profile.json" ;;
        passes_d64) run passes_d64 90 python3 benchmarks/chunk_passes.py --shapes 16x4096x64,4x16384x64,2x32768x64 \
                        --out "$res/chunk_passes_d64.json" ;;
        # grid (a) at 16K (B = 4): whole sequences vs 2 (the default) and 4 segments, and the pre-pass's two tuned
        # configurations pinned (BV = 128 with 8 warps, BV = 64 with 4; the pin applies to the walks too)
        seg_probe) for seg in 0 4096; do
                       run "seg_probe_$seg" 60 env LIGHTNING_ATTENTION_SEGMENT_LEN=$seg python3 benchmarks/host_overhead.py \
                           --shapes 4x16384 --out "$res/seg_probe_$seg.json"
                   done ;;
        passes_prepass) for pin in "BT=64,BV=128,num_warps=8,num_stages=3" "BT=64,BV=64,num_warps=4,num_stages=3"; do
                            run "passes_${pin//[=,]/_}" 60 env LIGHTNING_ATTENTION_KERNEL_CONFIG="$pin" \
                                python3 benchmarks/chunk_passes.py --shapes 4x16384 --out "$res/passes_${pin//[=,]/_}.json"
                        done ;;
        # K = 256 on 128-token chunks (8 warps: the 64-token walks run their 64-row products on both warpgroups), timed
        # and checked against float64 pinned
        sweep_d256_bt128) run sweep_d256_bt128 150 python3 benchmarks/chunk_sweep.py --D 256 --B 16 --T 4096 --inter input \
                              --configs "$SWEEP_D256_BT128" --out "$res/chunk_sweep_d256_bt128.json"
                          run verify_d256_bt128 150 python3 benchmarks/inter_debug.py --pins 256 "$SWEEP_D256_BT128" ;;
        # K = 128 with two pipeline stages (90 KB of shared memory: two programs per SM) against three (131 KB: one),
        # at the unsegmented 8K x 8 and the segmented 16K x 4, then checked against float64 pinned
        sweep_d128_s2) for shape in "8 8192" "4 16384"; do
                           set -- $shape
                           run "sweep_d128_s2_$2" 90 python3 benchmarks/chunk_sweep.py --D 128 --B "$1" --T "$2" --inter input \
                               --configs "BT=64,BV=64,num_warps=4,num_stages=2;BT=64,BV=64,num_warps=4,num_stages=3" \
                               --out "$res/chunk_sweep_d128_s2_$2.json"
                       done
                       run verify_d128_s2 90 python3 benchmarks/inter_debug.py --pins 128 "BT=64,BV=64,num_warps=4,num_stages=2" ;;
        # the segment plan with one walk program per SM (three stages, 131 KB): the default plan (2 programs per SM
        # assumed) against segments of 16K (16K x 4 whole, 32K x 2 in 2, 64K x 1 in 4), fwd and fwd+bwd
        seg_probe_occ) for seg in default 16384; do
                           run "seg_probe_occ_$seg" 90 env LIGHTNING_ATTENTION_SEGMENT_LEN="${seg/default/}" \
                               python3 benchmarks/host_overhead.py --shapes 4x16384,2x32768,1x65536 \
                               --out "$res/seg_probe_occ_$seg.json"
                       done ;;
        # the pre-pass on shorter pieces (more programs, a larger piece buffer): per pass at 32K x 2 and 64K x 1
        prepass_probe) for piece in 1024 512; do
                           run "passes_piece_$piece" 60 env LIGHTNING_ATTENTION_PREPASS_LEN=$piece python3 benchmarks/chunk_passes.py \
                               --shapes 2x32768,1x65536 --out "$res/chunk_passes_piece_$piece.json"
                       done ;;
        # the segmented part of grid (a) per pass: the pre-pass on pieces of the segments (chunk.prepass_split)
        passes_long) run passes_long 120 python3 benchmarks/chunk_passes.py --shapes 4x16384,2x32768,1x65536 \
                         --out "$res/chunk_passes_long.json" ;;
        # q·S apart from the walk's intra product (so that with 8 warps it is split over the two warpgroups by columns
        # instead of computed on both): pinned sweeps of this code against an older package in .old/ (git-ignored,
        # carried: `git archive <rev> lightning_attention | tar x -C .old`), then the 8-warp candidates checked against
        # float64. Recorded in h100-2026-11-22z5 with the apart form for every warp count, against 71c8e31.
        unchain_probe) for d_shape in "128 8 8192" "128 4 16384" "256 16 4096" "64 4 16384"; do
                           set -- $d_shape
                           case $1 in
                               128) new="$UNCHAIN_D128"; old="$UNCHAIN_D128_OLD" ;;
                               256) new="$UNCHAIN_D256"; old="$UNCHAIN_D256_OLD" ;;
                               64) new="$UNCHAIN_D64"; old="$UNCHAIN_D64_OLD" ;;
                           esac
                           [ "$1 $3" = "128 16384" ] && new="$UNCHAIN_D128_LONG" && old="$UNCHAIN_D128_LONG_OLD"
                           run "unchain_new_d$1_$3" 150 python3 benchmarks/chunk_sweep.py --D "$1" --B "$2" --T "$3" \
                               --inter input --configs "$new" --out "$res/unchain_new_d$1_$3.json"
                           run "unchain_old_d$1_$3" 100 env PYTHONPATH="$PWD/.old:$PYTHONPATH" python3 benchmarks/chunk_sweep.py \
                               --D "$1" --B "$2" --T "$3" --inter input --configs "$old" --out "$res/unchain_old_d$1_$3.json"
                       done
                       run verify_unchain_d128 120 python3 benchmarks/inter_debug.py --pins 128 "$UNCHAIN_VERIFY_D128"
                       run verify_unchain_d256 90 python3 benchmarks/inter_debug.py --pins 256 "BT=64,BV=64,num_warps=8,num_stages=2"
                       run verify_unchain_d64 60 python3 benchmarks/inter_debug.py --pins 64 "BT=64,BV=64,num_warps=8,num_stages=2" ;;
        # the recompute backward's dk and dv sweeps as one kernel function: its GPU tests, then its timing against the
        # package in .old/ (the commit before, carried) in the same call
        recompute_probe) run tests_recompute 200 python3 -m pytest -q -p no:cacheprovider -n 8 -rA tests/ops/test_recompute.py
                         run recompute_new 120 python3 benchmarks/recompute_timing.py --seqlens 2048,32768 --check \
                             --out "$res/recompute_timing_new.json"
                         run recompute_old 120 env PYTHONPATH="$PWD/.old:$PYTHONPATH" python3 benchmarks/recompute_timing.py \
                             --seqlens 2048,32768 --out "$res/recompute_timing_old.json" ;;
        sweep_d256) run sweep_d256 200 python3 benchmarks/chunk_sweep.py --D 256 --B 16 --T 4096 --inter input \
                        --configs "$SWEEP_D256" --out "$res/chunk_sweep_d256.json" ;;
        sweep_d64) run sweep_d64 120 python3 benchmarks/chunk_sweep.py --D 64 --B 4 --T 16384 --inter input \
                       --configs "$SWEEP_D64" --out "$res/chunk_sweep_d64.json" ;;
        passes) run passes 120 python3 benchmarks/chunk_passes.py --shapes 32x2048,4x16384,2x32768 \
                    --out "$res/chunk_passes.json" ;;
        # the compiled kernels, in parts under the 16 MiB per-file limit: put them in .tcache_pack/ and carry it (once
        # FLA's kernels are in, the whole no longer fits a call's 64 MiB: split FLA's entries into .tcache_pack_fla/)
        pack_cache) tar czf - -C "$TRITON_CACHE_DIR" . | split -b 15m - "$out/tcache.part-" && ls -la "$out" ;;
        *) echo "unknown stage $stage" ;;
    esac
done
