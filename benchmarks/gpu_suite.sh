#!/usr/bin/env bash
# The GPU runs of this repository as named stages, each under its own time limit so that a call of the device
# machine (10 minutes at most) holds a few of them:
#
#   bash benchmarks/gpu_suite.sh STAGE[,STAGE...]          from the repository root; default: tests
#
# stage       what it runs                                                                    limit (s)
# tests       pytest -m gpu: every GPU-marked test but the configuration check (pytest-xdist   $TESTS_S or 560
#             workers when installed)
# configs     pytest -m gpu, the rest: every launch configuration the GPU can pick, each      $CONFIGS_S or 580
#             against float64 (tests/ops/test_configs_gpu.py; its units compile side by side)
# kernels_a   grid (a), K = V = 128, ours against FLA ($KERNELS_A_BASELINES: fla)            300
# kernels_b   grid (b) with CUDA-graph replays, ours alone; then T = 128K against FLA       150 + 150
# head_dims   grid (a) at K = V = 64 and 256 against FLA (FLA tunes both from an empty      560
#             cache in about 250 s)
# settled     grid (a) at K = V = 128 against FLA and at 256 ours alone, also as CUDA-graph   360 + 150
#             replays, each measurement after $SETTLE_S (default 1.5) s of the same call back to
#             back: the clock sustained work holds under the power cap, the state in which two
#             machines are compared (python -m lightning_attention.bench.agreement)
# varlen      65,536 tokens as 12 packed sequences of 1 to 16,384 tokens, K = V = 128, FLA   420
# decode      the decode step against FLA, per batch, and its memory over 1M tokens           150
# model       TNL against LLaMA: training tokens/s per context, 400-step loss curves          240
# serving     TNL (eager and CUDA-graph decode steps) against LLaMA through HF generate():    300
#             first token, decode tokens/s, memory, batch 1 and 64 x prompt 1K and 32K (out of
#             memory recorded as a result)
# hybrid      hybrid chunk attention against SDPA                                             90
# recompute   the recompute backward against the chunk backward on grid (a)                  120
# smem        shared memory of the recompute backward, compiled for every target             120
# host        host time per call against device and CUDA-graph time ($HOST_SHAPES)          120
# clocks      forward and fwd+bwd times beside the SM clock and the power cap, after idle and in   200
#             bursts ($CLOCKS_SHAPES; benchmarks/clocks.py)
# profile     one fwd+bwd kernel by kernel, with the plan and configurations ($PROFILE_SHAPES) 120
# placement   the forward's time per placement of its tensors, the same placements in 4 processes   240
#             ($PLACEMENT_SHAPES; $PLACEMENT_SHIFT=q,k,v moves those tensors one at a time instead;
#             benchmarks/placement.py)
# sweep       pinned configurations of one shape, checked against float64 ($SWEEP_SHAPE,
#             $SWEEP_CONFIGS: the autotuner's candidates by default)                        300
# cold_start  first call of each dtype x head dim x (forward, fwd+bwd), each in its own process
#             from an empty Triton cache, 4 at once                            $COLD_START_S or 420
# cold_start_one_by_one  the same with every kernel compiled at its first launch, one by one
#             (compile-ahead off: the A/B of compiling a call's kernels at once)  $COLD_START_S or 420
# cold_start_segmented  the segmented class (grid (b): bf16, K = 128, batch 1 x 32K), forward and
#             fwd+bwd, kernels compiled at once and one by one                               2 x 120
# ncu         Nsight Compute over one call per shape ($NCU_SHAPES), then its text pages and   420 + 500
#             where each kernel's warps wait and its shared memory conflicts (ncu_sass_summary.py)
# guard       this package against the one in .old/, alternating, 3 runs each ($GUARD_REPS,
#             $GUARD_OLD_COMMIT / $GUARD_NEW_COMMIT label the packages in guard.md)           560
# host_pair   host time per plain fwd+bwd of the package in .old/ against this one, their loops
#             interleaved in the same 3 processes ($HOST_PAIR_SHAPES)                         240
# sp          sequence parallelism on 2 GPUs: correctness at 256K and scaling                 160 + 260
# train_memory  peak memory per GPU and tokens/s of the 400m preset, DDP against FSDP2, with and
#             without activation checkpointing and per-block compile                         300
# train_memory_2gpu  the same on 2 GPUs under torchrun, eager, each strategy also with 2-way sequence
#             parallelism, then 3 profiled steps of each (GPU, NCCL and host time per rank)
#             ($TRAIN_MEMORY_2GPU_S or 300)
# sanitizer   the GPU reliability tests under compute-sanitizer's memcheck                    240
# model_quality  the model-quality protocol, resumed from $MQ_DIR (carried; default
#             runs/mq), the corpus in .corpus/ (carried)                                     580
# tune        the tuned table of this GPU's architecture (benchmarks/tune_table.py): written to     560
#             tuned_table.py and tune_table.json in the results (copy the module to
#             lightning_attention/ops/lightning/kernels/tuned_sm<NN>.py)
# tables      the markdown tables and targets of everything this call measured (put it last) 60
# pack_cache  the Triton cache split into $OUT/tcache.part-* (carry it back as .tcache_pack/)
#
# Baselines need their wheels in .whl/ (carried; benchmarks/gpu_setup.sh installs them). The guard needs the older
# package in .old/ (carried): mkdir -p .old && git archive <commit> lightning_attention | tar x -C .old. Compiled
# kernels survive between calls through .tcache_pack/ (and .tcache_pack_fla/ for FLA's), unpacked into
# TRITON_CACHE_DIR before the first stage. After every stage the logs and JSON so far are packed into
# $OUT/results.tgz and the stage lines into $OUT/summary.log: unpack them into benchmarks/results/<gpu>/
# (docs/performance.md, "Producing a run").
set -uo pipefail
stages="${1:-tests}"
out="${OUT:-/tmp/out}"
res=/tmp/gpu_results
mkdir -p "$res" "$out"
export PYTHONUNBUFFERED=1
eval "$(bash benchmarks/gpu_setup.sh . | tail -n 1)"
export PYTHONPATH="$PWD:$PYTHONPATH"  # the repository itself: no install step on the offline machine
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$PWD/.tcache}"
mkdir -p "$TRITON_CACHE_DIR"
for pack in .tcache_pack .tcache_pack_fla; do
    if ls "$pack"/tcache.part-* >/dev/null 2>&1; then
        cat "$pack"/tcache.part-* | tar xzf - -C "$TRITON_CACHE_DIR" && echo "triton cache + $pack: $(du -sh "$TRITON_CACHE_DIR")"
    fi
done
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$res/machine.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$res/machine.txt"

run() {  # run NAME SECONDS COMMAND...: one command under its limit, its output in NAME.log, everything packed
    local name=$1 secs=$2; shift 2
    local t0=$SECONDS
    timeout -k 15 "$secs" "$@" >"$res/$name.log" 2>&1  # -k: SIGKILL what ignores the SIGTERM
    local rc=$?
    echo "stage $name: rc=$rc in $((SECONDS - t0)) s" | tee -a "$res/summary.log"
    tail -n 25 "$res/$name.log"
    # packed after every stage: what finished comes back even when the call reaches its time limit
    tar czf "$out/results.tgz" -C "$res" . && cp "$res/summary.log" "$out/summary.log"
}

bench="python3 -m lightning_attention.bench"
# workers share the GPU and compile side by side; tests marked gpu_memory go one after another to one worker
xdist=$(python3 -c "import xdist" 2>/dev/null && echo "-n 6 --dist loadgroup")
for stage in ${stages//,/ }; do
    case $stage in
        tests) run tests "${TESTS_S:-560}" python3 -m pytest -v -m gpu -p no:cacheprovider $xdist --durations=15 \
                   --ignore=tests/ops/test_configs_gpu.py tests ;;
        configs) run configs "${CONFIGS_S:-580}" python3 -m pytest -v -m gpu -p no:cacheprovider \
                     tests/ops/test_configs_gpu.py ;;
        kernels_a) run kernels_a 300 $bench kernels --grid a --ours chunk --baselines "${KERNELS_A_BASELINES:-fla}" \
                       --out "$res/kernels_a" ;;
        # FLA's grid (b) takes minutes to compile and tune: it runs at 128K only, beside ours in the same process
        kernels_b) run kernels_b 150 $bench kernels --grid b --ours chunk --baselines none --cuda-graphs \
                       --out "$res/kernels_b"
                   run kernels_b_fla 150 $bench kernels --grid b --seqlens 131072 --ours chunk --baselines fla \
                       --out "$res/kernels_b_fla" ;;
        varlen) run varlen 420 $bench kernels --grid varlen --ours chunk --baselines fla --out "$res/varlen" ;;
        settled) run settled_k128 360 $bench kernels --grid a --ours chunk --baselines fla --cuda-graphs \
                     --settle-s "${SETTLE_S:-1.5}" --out "$res/settled_k128"
                 run settled_k256 150 $bench kernels --grid a --head-dims 256 --ours chunk --baselines none \
                     --cuda-graphs --settle-s "${SETTLE_S:-1.5}" --out "$res/settled_k256" ;;
        head_dims) run head_dims 560 $bench kernels --grid a --head-dims 64,256 --ours chunk --baselines fla \
                       --out "$res/head_dims" ;;
        decode) run decode 150 $bench decode --out "$res/decode" ;;
        model) run model 240 $bench model --loss-steps 400 --out "$res/model" ;;
        serving) run serving 300 $bench serving --out "$res/serving" ;;
        hybrid) run hybrid 90 $bench hybrid --out "$res/hybrid" ;;
        recompute) run recompute 120 python3 benchmarks/recompute_timing.py --out "$res/recompute_timing.json" ;;
        smem) version=$(python3 -c "import triton; print(triton.__version__)")
              run smem 120 python3 benchmarks/recompute_smem_table.py --dims all --jobs 16 \
                  --markdown-out "$res/recompute_smem_triton-$version.md" ;;
        host) run host 120 python3 benchmarks/host_overhead.py ${HOST_SHAPES:+--shapes "$HOST_SHAPES"} \
                  --out "$res/host_overhead.json" ;;
        placement) run placement 240 python3 benchmarks/placement.py \
                       ${PLACEMENT_SHAPES:+--shapes "$PLACEMENT_SHAPES"} ${PLACEMENT_SHIFT:+--shift "$PLACEMENT_SHIFT"} \
                       --out "$res/placement.json" ;;
        clocks) run clocks 200 python3 benchmarks/clocks.py ${CLOCKS_SHAPES:+--shapes "$CLOCKS_SHAPES"} --fwd-bwd \
                    --out "$res/clocks.json" ;;
        profile) run profile 120 python3 benchmarks/chunk_profile.py ${PROFILE_SHAPES:+--shapes "$PROFILE_SHAPES"} \
                     --out "$res/chunk_profile.json" ;;
        sweep) run sweep 300 python3 benchmarks/chunk_sweep.py --shape "${SWEEP_SHAPE:-4x16384x64}" \
                   ${SWEEP_CONFIGS:+--configs "$SWEEP_CONFIGS"} --check --out "$res/chunk_sweep.json" ;;
        # every cell sets its own empty TRITON_CACHE_DIR: the cache unpacked above serves none of them; the cells write
        # their JSON and table as they finish, and a cell past 240 s is recorded as timed out within the limit
        cold_start) run cold_start "${COLD_START_S:-420}" python3 benchmarks/cold_start.py --parallel 4 --timeout-s 240 \
                        --out "$res/cold_start" ;;
        cold_start_one_by_one) run cold_start_one_by_one "${COLD_START_S:-420}" python3 benchmarks/cold_start.py \
                        --parallel 4 --timeout-s 240 --compile-ahead off --out "$res/cold_start_one_by_one" ;;
        cold_start_segmented)
            for ahead in on off; do
                run "cold_start_segmented_$ahead" 120 python3 benchmarks/cold_start.py --shape 1x32768x16 \
                    --dtypes bfloat16 --head-dims 128 --parallel 2 --timeout-s 100 --compile-ahead "$ahead" \
                    --out "$res/cold_start_segmented/compile_ahead_$ahead"
            done ;;
        # the report (gzipped) comes back beside results.tgz when it fits the 16 MiB a returned file may have
        ncu) ncu_bin=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | tail -n 1)
             run ncu 420 "$ncu_bin" --profile-from-start off --clock-control none --set full --import-source no -f \
                 -o /tmp/ncu_walk python3 benchmarks/ncu_profile.py \
                 --shapes "${NCU_SHAPES:-2x32768:fwd,8x8192:fwd,16x4096x256:fwd_bwd}"
             run ncu_details 120 "$ncu_bin" --import /tmp/ncu_walk.ncu-rep --page details --print-units base
             run ncu_raw 120 "$ncu_bin" --import /tmp/ncu_walk.ncu-rep --page raw --csv
             run ncu_sass 200 "$ncu_bin" --import /tmp/ncu_walk.ncu-rep --page source --print-source sass --csv
             run ncu_sass_summary 60 python3 benchmarks/ncu_sass_summary.py "$res/ncu_sass.log" --top 12
             gzip -c /tmp/ncu_walk.ncu-rep >"$out/ncu_walk.ncu-rep.gz" ;;
        # the budget leaves the call's setup and packing their time; a process it cannot fit is not started and the
        # report says INCOMPLETE
        host_pair) if [ ! -f .old/lightning_attention/__init__.py ]; then
                       echo "stage host_pair: no package in .old/ (git archive <commit> lightning_attention" \
                            "| tar x -C .old)" | tee -a "$res/summary.log"
                   else
                       run host_pair 240 python3 benchmarks/host_pair.py --old .old \
                           ${HOST_PAIR_SHAPES:+--shapes "$HOST_PAIR_SHAPES"} --out "$res/host_pair.json"
                   fi ;;
        guard) if [ ! -f .old/lightning_attention/__init__.py ]; then
                   echo "stage guard: no package in .old/ (git archive <commit> lightning_attention | tar x -C .old)" \
                       | tee -a "$res/summary.log"
                   continue
               fi
               run guard 560 python3 benchmarks/guard.py run --old .old --new . --reps "${GUARD_REPS:-3}" \
                   --budget-s 520 --timeout-s 300 ${GUARD_OLD_COMMIT:+--old-commit "$GUARD_OLD_COMMIT"} \
                   ${GUARD_NEW_COMMIT:+--new-commit "$GUARD_NEW_COMMIT"} --out "$res/guard" ;;
        sp) # NCCL on 2 GPUs; NVLink multicast stays off (only filled in when unset, never switched on)
            export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}" TORCH_SYMM_MEM_DISABLE_MULTICAST="${TORCH_SYMM_MEM_DISABLE_MULTICAST:-1}" \
                   NVSHMEM_DISABLE_NVLS="${NVSHMEM_DISABLE_NVLS:-1}"
            sp_run="python3 -m torch.distributed.run --standalone --nproc_per_node 2"
            run sp_check 160 $sp_run benchmarks/sp_check_gpu.py --out "$res/sp"
            run sp_scaling 260 $sp_run benchmarks/sp_scaling.py --budget-s 220 --trial-cap-s 40 --timeout-min 4 \
                --out "$res/sp" ;;
        train_memory) run train_memory 300 python3 benchmarks/train_memory.py --budget-s 250 \
                          --out "$res/train_memory" ;;
        train_memory_2gpu) export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
                           secs="${TRAIN_MEMORY_2GPU_S:-300}"
                           run train_memory_2gpu "$secs" python3 -m torch.distributed.run --standalone \
                               --nproc_per_node 2 benchmarks/train_memory.py --sequence-parallel 1,2 --compile off \
                               --profile-steps 3 --budget-s $((secs - 60)) --out "$res/train_memory_2gpu" ;;
        sanitizer) run sanitizer 240 compute-sanitizer --tool memcheck --error-exitcode 1 \
                       python3 -m pytest -q -m gpu -p no:cacheprovider tests/ops/test_reliability_gpu.py ;;
        model_quality) mq="${MQ_DIR:-runs/mq}"; mkdir -p "$mq"
                       run model_quality 580 python3 -m lightning_attention.bench model-quality --corpus .corpus \
                           --out "$mq" --resume --time-limit 540
                       tar czf "$out/mq.tgz" -C "$(dirname "$mq")" "$(basename "$mq")" ;;
        tune) run tune 560 python3 benchmarks/tune_table.py --out "$res/tuned_table.py" --json "$res/tune_table.json" ;;
        tables) run tables 60 python3 -m lightning_attention.bench.tables "$res" --out "$res/tables.md" ;;
        # split under the 16 MiB a returned file may have; a call carries at most 64 MiB: once FLA's kernels are in
        # the cache, move their entries into .tcache_pack_fla/, carried only by the calls that time FLA
        pack_cache) tar czf - -C "$TRITON_CACHE_DIR" . | split -b 15m - "$out/tcache.part-" && ls -la "$out" ;;
        *) echo "unknown stage $stage (the stages are listed at the top of benchmarks/gpu_suite.sh)" ;;
    esac
done
