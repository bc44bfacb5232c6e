"""Launch configurations of the chunk walk kernel: a small autotune space, filtered per GPU.

The space is (BT, BV, num_warps, num_stages); the autotune key holds the head dims and the kernel flags, never T,
B or N, and results are cached on disk (``cache_results``), so a new shape class costs one short tuning run.

``LIGHTNING_ATTENTION_KERNEL_CONFIG`` pins one configuration (debugging, determinism across machines), e.g.
``LIGHTNING_ATTENTION_KERNEL_CONFIG="BT=64,BV=64,num_warps=4,num_stages=2"``; it must be set before the kernels are
imported. Missing keys take the defaults of the first configuration below.

Shared memory per block differs by architecture (101,376 B on sm_86/89/120, 166,912 B on sm_80, 232,448 B on
sm_90); :func:`walk_prune_configs` drops the configurations whose estimated shared memory exceeds the device's limit.
``tests/ops/test_aot.py`` compiles what survives the filter for sm_80, sm_90 and sm_120 ahead of time and checks the
compiler's own number against the limit, so the estimate must stay conservative.
"""

import os

import triton

ENV_CONFIG = "LIGHTNING_ATTENTION_KERNEL_CONFIG"

# (BT, BV, num_warps, num_stages) in order of preference, after PREFERRED_BY_BK (which leads for K = 64, 128, 256);
# the first entry is the default for other dims. Order from the H100 sweep (benchmarks/results/chunk_sweep_h100.json,
# bf16, K = V = 128): fwd+bwd 2.42 ms for (64, 64, 4, 1), 2.48 for (64, 128, 8, 2), 2.53 for (64, 64, 4, 2). Tiles
# narrower than 64 only with 8 warps (WALK_MIN_TILE), for where nothing wider fits.
_SPACE = (
    (64, 64, 4, 1),
    (64, 128, 8, 2),
    (64, 64, 4, 2),
    (32, 64, 4, 2),
    (64, 64, 8, 2),
    (64, 64, 8, 1),
    (64, 64, 4, 3),
    (64, 32, 8, 2),  # K = 256 on <= 166 KB of shared memory (sm_80)
    (32, 32, 8, 1),  # K = 256 on <= 101 KB (sm_86/89/120)
    (64, 64, 4, 4),  # K = 128 with tensor descriptors (PREFERRED_BY_BK_TMA); spills without them
    (64, 32, 4, 3),  # K = 256 with tensor descriptors only (TMA_NARROW_TILES)
)

# the main walk's first candidates by padded K (the rows of its [K, BV] fp32 state), ahead of the order above:
# H100, bf16, triton 3.6, pinned sweeps (benchmarks/results/h100-2026-11-22n/chunk_sweep_d*.json, -r), each checked
# against float64 (h100-2026-11-22o/inter_debug_dims.log, -r/inter_debug_stages.log). K = 64 (B = 4, T = 16K):
# fwd+bwd 0.98 ms with 3 stages, 1.04 with 2, 1.16 for (64, 64, 4, 1). K = 128 (B = 4, T = 16K): 2.37 ms with 3
# stages, 2.64 with 1, 3.21 with 4 (each walk pass 9-12% faster: the loads are pipelined); 3 against 2 stages
# (h100-2026-11-22v/chunk_sweep_d128_s2_*.json, 2 stages checked in verify_d128_s2.log): fwd 0.466 / 0.487 ms,
# fwd+bwd 1.96 / 1.90 at B = 8, T = 8K, so both are tuned, apart for grids that fit the GPU at one program per SM
# and larger ones (the WAVES key, kernels/walk.py), and each pass keeps its faster one. K = 256 (B = 16,
# T = 4K): 10.0 ms for (64, 64, 8, 2), 10.35 for (64, 64, 4, 1) (9.26 for (64, 32, 4, 1), which is wrong:
# WALK_MIN_TILE); 128-token chunks with 8 warps 9.82 ms fwd+bwd and 2.58 fwd against 10.01 / 2.50
# (h100-2026-11-22v/chunk_sweep_d256_bt128.json). Since q·S is computed apart from the intra product with 8 warps
# (walk_config), (64, 64, 8, 2) no longer spills: 8.14 ms fwd+bwd, 2.03 fwd ((64, 64, 4, 1): 10.27 / 2.86; -z5)
PREFERRED_BY_BK = {
    64: ((64, 64, 4, 2), (64, 64, 4, 3)),
    128: ((64, 64, 4, 3), (64, 64, 4, 2)),
    256: ((64, 64, 8, 2), (64, 64, 4, 1)),
}

# with tensor descriptors (ops/lightning/tma.py) the walk holds no addresses in registers: four stages at K = 128
# compile without spills (248 registers, 180,312 B; pointers: 255 + a 64-byte stack) and keep one more chunk of
# loads in flight. Pinned on the H100 (h100-2026-11-22z12/tma_sweep_d128_*.json), fwd / fwd+bwd ms with 2 / 3 / 4
# stages: 2 x 32K 0.616 / 0.529 / 0.491 and 2.05 / 1.85 / 1.73; 8 x 8K 0.430 / 0.412 / 0.382 and 2.68 / 1.64 /
# 1.54; 1 x 64K fwd 0.661 / 0.579 / 0.547. Four stages checked against float64 (-z12/tma_verify_s4.log).
# K = 256: a 32-wide value tile with 4 warps (one warpgroup computes A once; three stages fit, 225,360 B) against the
# 64-wide 8-warp tile, pinned at 16 x 4K: fwd 1.696 / 1.889 ms, fwd+bwd 7.12 / 7.48 (h100-2026-11-22z18)
# K = 64 keeps the pair (2, 3): four stages first (the plan then counts one program per SM and segments less) was
# faster as CUDA-graph replays in two calls (h100-2026-11-22z21, -z23; 8 x 8K fwd+bwd 0.92 -> 0.75 ms) but slower
# as plain calls, the benchmark's measure, at 4 of 5 shapes in both (benchmarks/NOTES-kernels.md, session 7)
PREFERRED_BY_BK_TMA = {
    **PREFERRED_BY_BK,
    128: ((64, 64, 4, 4), (64, 64, 4, 3)),
    256: ((64, 32, 4, 3), (64, 64, 8, 2)),
}

# the inter-only mode (fixed BT = the hybrid's chunk size): one configuration (BV, warps, stages), no tuning. On an
# H100 (triton 3.6) autotuning this mode over the walk's space faulted (illegal memory access) at value dims of
# 16 and 32 with chunks of 64/128 tokens and at chunks of 256, while every single pinned configuration tried ran:
# (32, 8, 1) at chunks of 256, (16, 4, 1) at 64 and 256 (benchmarks/results/h100-2026-11-22f, -g; cause not found).
# With this single configuration, chunks of 128 (V = 129) and 256 (V = 128) ran and V = 16 at chunks of 64 faulted
# (h100-2026-11-22h, -i): that run had BV = 32 with 8 warps at BT = 64, because an autotuner with one configuration
# never calls its pruning hook, so no rule applied then. Session 3 checked values against float64
# (benchmarks/inter_debug.py, h100-2026-11-22j, -k, -l): every inter-only case on a 64-token tile failed, whatever
# the warps (V = 16: wrong o and final state; V = 48, 128: illegal memory access), and every case on a 128- or
# 256-token tile with 32-wide (or wider) tiles and 8 warps was right (V = 32, 48, 128, 129); V = 16 with BV = 16 and
# 4 warps faulted at 128. The cause is not known (the same kernel without INTER_ONLY is right at 64 tokens). So the
# inter-only walk runs exactly the shape class that was right: tiles of >= INTER_ONLY_MIN_BT tokens (shorter chunks
# are masked rows of it: C <= BT is supported), tiles at least INTER_ONLY_MIN_TILE wide in K and V (a 16-wide head
# dim is a masked half tile), 8 warps, one stage (inter_only_config, passed explicitly).
INTER_ONLY_MIN_BT = 128
INTER_ONLY_MIN_TILE = 32
_FIXED_BT_CONFIG = (32, 8, 1)

# the main walk and the pre-pass run tiles at least WALK_MIN_TILE wide in K and in V (a narrower head dim is the
# masked part of one tile). H100, triton 3.6, every output and gradient against float64 (benchmarks/inter_debug.py,
# tests/ops/test_chunk_gpu.py): narrower tiles failed in most shapes tried. The full op at V = 16 without segments
# faulted with (BT, BV, warps, stages) = (64, 16, 4, 1) (h100-2026-11-22l). At K = V = 64, (64, 32, 4, 1) computed
# wrong values (o: rel. error 0.68, dq: 6.7) without a fault; (64, 32, 4, 1) faulted at K = V = 256, and the tuned
# defaults faulted at (K, V) = (64, 32) and (32, 64) (h100-2026-11-22o); with 8 warps, 32-wide tiles were right at
# K = 64 but faulted at (K, V) = (128, 32) (h100-2026-11-22p). 64- and 128-wide tiles were right at every K.
WALK_MIN_TILE = 64
# where nothing WALK_MIN_TILE wide fits the shared memory (K = 256 on sm_80/86/89/120, never tuned or run on them):
# narrower tiles, only with 8 warps (the combination that was right in more cases)
NARROW_TILE_MIN_WARPS = 8
# narrow tiles admitted with tensor descriptors, by padded K: right against float64 for every output and gradient,
# unsegmented and in segments, on the H100 (h100-2026-11-22z18; through pointers the same tile faulted)
TMA_NARROW_TILES = {256: ((64, 32, 4, 3),)}

# the segment pre-pass (STATE_ONLY: no q, no o; a decayed Kᵀ V reduction over the segment): bandwidth-bound on
# (k, v), so the whole value dim in one tile (k read once) and pipelined loads. At K = 256 its Kᵀ V (65 K
# multiply-adds per token and head) makes it compute-bound, and the 32-wide tile with descriptors (admitted there
# only: TMA_NARROW_TILES) leads: 1 × 64K in two segments, pinned on an H100, 291 µs against 370 for the tuned
# (64, 64, 4, 1) and 302 for (64, 64, 4, 3), right against float64 (h100-2026-11-22z42)
_STATE_SPACE = (
    (64, 32, 4, 3),
    (64, 128, 8, 3),
    (64, 64, 4, 3),
    (64, 64, 4, 1),
)

# the fused dk/dv walk (kernels/dkdv_walk.py): (BT, num_warps, num_stages), BV = the padded value dim. Registers
# decide (G alone is 64 per thread at 8 warps): ptxas on sm_90, bf16, K = V = 128 (tests/ops/aot_build.py): BT 64 /
# 8 warps 255 regs + 1.5 KB spills; BT 32 / 8 warps 255 + 0.3 KB; BT 64 / 4 warps 255 + 1.2 KB
_DKDV_SPACE = (
    (64, 8, 1),
    (32, 8, 1),
    (32, 4, 1),
)
# the fused walk holds the whole [K, V] state: only when both padded head dims are at most this
DKDV_MAX_DIM = 128

# how many configurations one shape class tunes over: each costs a compile (1-3 s for bf16/fp16) on the first call
# (cold start target: 15 s for a fwd+bwd, which compiles up to 6 kernel variants); fp32 builds (ieee dots lowered to
# FMA loops) take 10-40 s each, so fp32 takes the first configuration that fits, untuned
MAX_TUNED = 2
MAX_TUNED_FP32 = 1

# per-block shared memory limits (bytes) of the targets we build for; the device query wins when a GPU is present
SHARED_LIMITS = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448, 100: 232_448, 120: 101_376}
# per-SM shared memory (bytes) and registers, for the occupancy of the walk (the segment plan's slots); the device
# query wins when a GPU is present
SHARED_PER_SM = {80: 167_936, 86: 102_400, 89: 102_400, 90: 233_472, 100: 233_472, 120: 102_400}
REGISTERS_PER_SM = 65_536
# the walks compile to the 255-register cap (ptxas on sm_90), allocated per thread in units of 8
WALK_REGISTERS_PER_THREAD = 256
# shared memory the driver reserves per resident block
RESERVED_SHARED_PER_BLOCK = 1024


def walk_config(meta: dict, num_warps: int, num_stages: int) -> triton.Config:
    """A walk configuration: ``meta`` (BT, BV and, for the inter-only mode, BK) plus the kernel's INTER_APART flag,
    which follows from the warps: with 8, q·S goes apart from the intra product.

    Triton lays a product whose result feeds another product (q·S as the accumulator of (A ⊙ D)·V) with every warp
    along its rows; 64 rows fill one warpgroup, so with 8 warps both warpgroups computed the whole q·S. Added after
    the intra product instead, it is split between them by columns. K = 256, (64, 64, 8, 2) on an H100: fwd 2.52 ->
    2.03 ms, fwd+bwd 9.97 -> 8.14 (spills 24 -> 0 registers). With 4 warps both forms have the same layout and the
    accumulator form was 1-3% faster (K = 128, 64) (benchmarks/results/h100-2026-11-22z5).

    WARP_SPEC (off unless ``meta`` turns it on: a pin's ``warp_spec=1``) is always in the configuration: the direct
    launcher (kernels/launch.py) takes a launch only when every constexpr is passed or chosen, never defaulted."""
    return triton.Config(
        {"WARP_SPEC": False, **meta, "INTER_APART": num_warps > 4}, num_warps=num_warps, num_stages=num_stages
    )


# probe-only kernel flags a pin may set (``name=1``), by the walk kernel's constexpr they turn on
_PIN_FLAGS = {"warp_spec": "WARP_SPEC"}


def _parse_pinned(text: str) -> triton.Config:
    fields = {"BT": _SPACE[0][0], "BV": _SPACE[0][1], "num_warps": _SPACE[0][2], "num_stages": _SPACE[0][3]}
    fields.update(dict.fromkeys(_PIN_FLAGS, 0))
    for item in text.split(","):
        if not item.strip():
            continue
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in fields:
            raise ValueError(f"{ENV_CONFIG}: unknown key {key!r} in {text!r}; keys are {sorted(fields)}")
        fields[key] = int(value)
    meta = {"BT": fields["BT"], "BV": fields["BV"]}
    meta.update({flag: True for name, flag in _PIN_FLAGS.items() if fields[name]})
    return walk_config(meta, fields["num_warps"], fields["num_stages"])


def walk_autotune_configs(state_only: bool = False) -> list[triton.Config]:
    """The autotune space (one pinned config when ``LIGHTNING_ATTENTION_KERNEL_CONFIG`` is set).

    ``state_only``: the space of the segment pre-pass. (The inter-only walk is not autotuned: :func:`inter_only_config`.)
    """
    pinned = os.environ.get(ENV_CONFIG, "").strip()
    if pinned:
        return [_parse_pinned(pinned)]
    space = _STATE_SPACE if state_only else _SPACE
    return [walk_config({"BT": bt, "BV": bv}, w, s) for bt, bv, w, s in space]


def dkdv_autotune_configs(fixed_bt: bool = False) -> list[triton.Config]:
    """The fused dk/dv walk's space: BT, warps and stages (BV is the padded value dim, set by the launcher).

    A pinned ``LIGHTNING_ATTENTION_KERNEL_CONFIG`` gives its BT, warps and stages; ``fixed_bt`` drops BT.
    """
    pinned = os.environ.get(ENV_CONFIG, "").strip()
    if pinned:
        cfg = _parse_pinned(pinned)
        space = ((cfg.kwargs["BT"], cfg.num_warps, cfg.num_stages),)
    else:
        space = _DKDV_SPACE
    out, seen = [], set()
    for bt, w, s in space:
        key = (w, s) if fixed_bt else (bt, w, s)
        if key not in seen:
            seen.add(key)
            out.append(triton.Config({} if fixed_bt else {"BT": bt}, num_warps=w, num_stages=s))
    return out


# host-side integer helpers for the launch path: triton.cdiv and triton.next_power_of_2 are ConstexprFunctions in
# Triton >= 3.5 (~2 µs a call), and a segmented fwd+bwd called them ~25 times


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (1 for n <= 1)."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


def padded_dim(d: int) -> int:
    """The power-of-two tile width (>= 16, the smallest tensor-core tile) that covers a head dim of ``d``."""
    return max(16, next_power_of_2(d))


def walk_tile(d: int) -> int:
    """The walk's tile width for a head dim of ``d``: the power of two that covers it, at least WALK_MIN_TILE."""
    return max(WALK_MIN_TILE, next_power_of_2(d))


# mbarriers of the tensor-descriptor copies, with room: 40-80 B compiled (triton 3.6, sm_90)
TMA_BARRIER_BYTES = 128


def tma_store_bytes(BT: int, BV: int, elem_bytes: int) -> int:
    """What tensor descriptors add to a walk program's shared memory: the [BT, BV] o tile staged for its store, and
    the copies' barriers (sm_90, triton 3.6, bf16: +8,232 to 8,272 B at BT = BV = 64 with two or three stages,
    +16,424 at BV = 128; the pre-pass, which stores no o, +48)."""
    return BT * BV * elem_bytes + TMA_BARRIER_BYTES


def estimate_shared_bytes(
    BT: int, BK: int, BV: int, num_stages: int, elem_bytes: int, inter_only: bool = False, tma: bool = False,
    state_bytes: int = 4,
) -> int:  # fmt: skip
    """An upper estimate of the shared memory of one walk program, fitted to the compiler's numbers on sm_90 (the
    arch that stages the most operands in shared memory; sm_80/120 builds of the same config use as much or less).

    q and k tiles [BT, BK] (halved without pipelining), per value column the fp32 state column used as an mma operand
    plus the v tile column (4·BK + elem·BT bytes, counted twice: layout conversions), and the [BT, BT] score tile.
    ``inter_only``: no score tile, but the compiler stages more of q, so half a [BT, BK] tile takes its place
    (sm_90, BT = 256, K = 128: 139,264 B compiled at BV = 32, estimate 163,840; 147,456 at BV = 64, estimate
    229,376). ``tma``: tiles moved by tensor descriptors (:func:`tma_store_bytes` more, and at least
    :func:`tma_walk_bytes` with the state operand's ``state_bytes``; never in the inter-only mode).
    ``tests/ops/test_aot.py`` checks it against compiled kernels.
    """
    qk = 2 * BT * BK * elem_bytes
    if num_stages < 2:
        qk //= 2
    elif inter_only:  # chunk tiles of up to 256 tokens: every pipelined q, k, v tile per stage (278,528 B compiled
        qk = num_stages * BT * (2 * BK + BV) * elem_bytes  # at BT = 256, BV = 32, 2 stages; estimate 294,912)
    scores = elem_bytes * BT * (BK // 2 if inter_only else BT)
    estimate = qk + 2 * BV * (4 * BK + elem_bytes * BT) + scores
    if num_stages >= 2 and not inter_only:
        # pipelined loads: a q, k and v tile per stage (triton 3.6, sm_90, bf16, BT = BV = 64: 131,072 B compiled at
        # K = 128 with 3 stages, 172,032 with 4; 73,728 at K = 64 with 3; h100-2026-11-22r/chunk_sweep_d*.json)
        estimate = max(estimate, num_stages * BT * (2 * BK + BV) * elem_bytes + scores)
    if tma and not inter_only:
        estimate += tma_store_bytes(BT, BV, elem_bytes)
        estimate = max(estimate, tma_walk_bytes(BT, BK, BV, num_stages, elem_bytes, state_bytes))
    return estimate


def tma_walk_bytes(BT: int, BK: int, BV: int, num_stages: int, elem_bytes: int, state_bytes: int) -> int:
    """Shared memory of a walk program with tensor descriptors: the q, k, v tiles of every stage, the state as the
    inter product's operand (``state_bytes`` per element, :func:`dkdv_state_bytes`) and the barriers; the score tile
    and the staged o reuse that space. Equal to the compiled size of every bf16 walk built on sm_90 in session 7
    (triton 3.6; K = 64, 128, 256; 1 to 4 stages; BV = 32 to 128; benchmarks/NOTES-kernels.md)."""
    return max(1, num_stages) * BT * (2 * BK + BV) * elem_bytes + BK * BV * state_bytes + TMA_BARRIER_BYTES


def estimate_resident_shared_bytes(
    BT: int, BK: int, BV: int, num_stages: int, elem_bytes: int, tma: bool = False
) -> int:
    """Shared memory of one main-walk program as compiled for 16-bit inputs on sm_90, for the occupancy model (not
    for fitting: :func:`estimate_shared_bytes` is the upper bound over every precision).

    A q, k and v tile per pipeline stage (one without pipelining), the [BT, BT] score tile and the [BK, BV] state as
    the inter product's 16-bit operand. Compiled (triton 3.6 and 3.8, bf16, BT = BV = 64): K = 128 57,344 / 90,112 /
    131,072 B with 1 / 2 / 3 stages (this estimate: 65,536 / 106,496 / 147,456); K = 256, 2 stages 172,032 (188,416).
    ``tma``: plus :func:`tma_store_bytes` (K = 128: 98,344 / 139,344 B with 2 / 3 stages).
    """
    resident = max(1, num_stages) * BT * (2 * BK + BV) * elem_bytes + BT * BT * elem_bytes + BK * BV * 2
    return resident + (tma_store_bytes(BT, BV, elem_bytes) if tma else 0)


def walk_first_config(
    DK: int, DV: int, elem_bytes: int, block_limit: int, tma: bool = False, state_bytes: int = 4
) -> triton.Config:
    """The main walk's first configuration: the one the dispatcher tries first, under ``block_limit`` bytes of shared
    memory per block (``tma``, ``state_bytes``: as for :func:`select_configs`). On an H100 with descriptors: K = 64
    and 128 64-wide value tiles; K = 256 32-wide for bf16 (state operand in bf16), 64-wide with 8 warps otherwise."""
    return select_configs(
        walk_autotune_configs(), DK, DV, elem_bytes, block_limit, prefer=True, tma=tma, state_bytes=state_bytes
    )[0]


def walk_programs_per_sm(
    DK: int, DV: int, elem_bytes: int, block_limit: int, sm_shared: int, tma: bool = False, state_bytes: int = 4
) -> int:
    """How many programs of the main walk's first configuration (:func:`walk_first_config`) one SM runs at once:
    bounded by shared memory (``sm_shared`` bytes per SM) and by registers. On an H100, bf16: K = 128 with three or
    four stages 1 (131 / 180 KB each with pointers / descriptors), with two or one 2 (by registers); K = 64 2; K = 256
    1 (8 warps, or the 32-wide tile's three stages)."""
    cfg = walk_first_config(DK, DV, elem_bytes, block_limit, tma, state_bytes)
    BT, BV = cfg.kwargs["BT"], cfg.kwargs["BV"]
    shared = estimate_resident_shared_bytes(BT, walk_tile(DK), BV, cfg.num_stages, elem_bytes, tma)
    by_shared = sm_shared // (shared + RESERVED_SHARED_PER_BLOCK)
    by_registers = REGISTERS_PER_SM // (cfg.num_warps * 32 * WALK_REGISTERS_PER_THREAD)
    return max(1, min(by_shared, by_registers))


def estimate_dkdv_shared_bytes(BT: int, BK: int, BV: int, num_stages: int, elem_bytes: int, state_bytes: int) -> int:
    """An upper estimate of the shared memory of one fused dk/dv program, fitted to the compiler's numbers on sm_90
    (bf16, K = V = 128: 98,304 B at BT = 64, 73,728 at BT = 32; 131,072 at BT = 64 with an fp32 G operand): the
    four [BT, BK|BV] input tiles (q, k, v, do; per pipeline stage), 1.5 copies of G as an mma operand
    (``state_bytes`` per element: 2 when it is rounded to bf16, else 4) and two [BT, BT] score tiles."""
    tiles = BT * (2 * BK + 2 * BV) * elem_bytes * max(1, num_stages)
    return tiles + 3 * BK * BV * state_bytes // 2 + 2 * elem_bytes * BT * BT


def dkdv_state_bytes(inter_prec: str | None) -> int:
    """Bytes per element of the carried state (S in the walk, G in the dk/dv walk) as the inter product's operand: bf16
    for bf16 inputs in ``input`` mode, else fp32."""
    return 2 if inter_prec == "input" else 4


def use_dkdv_walk(DK: int, DV: int, elem_bytes: int, state_bytes: int, limit: int | None) -> bool:
    """Whether the fused dk/dv walk applies: its state tile covers the whole [K, V] (padded dims <= 128) and at
    least one configuration fits the per-block shared memory ``limit`` (None: no limit known, e.g. the CPU)."""
    BK, BV = padded_dim(DK), padded_dim(DV)
    if BK > DKDV_MAX_DIM or BV > DKDV_MAX_DIM:
        return False
    if limit is None:
        return True
    return any(estimate_dkdv_shared_bytes(bt, BK, BV, s, elem_bytes, state_bytes) <= limit for bt, _, s in _DKDV_SPACE)


def shared_limit(cc: int | None = None) -> int | None:
    """Per-block shared memory of compute capability ``cc`` (major*10+minor), or of the current CUDA device."""
    if cc is not None:
        return SHARED_LIMITS.get(cc, min(SHARED_LIMITS.values()))
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(props, "shared_memory_per_block_optin", None) or SHARED_LIMITS.get(props.major * 10 + props.minor)


def _preferred_first(configs, BK: int, tma: bool = False) -> list:
    """``configs`` with those of :data:`PREFERRED_BY_BK` (:data:`PREFERRED_BY_BK_TMA` for a launch with tensor
    descriptors) for this padded K moved to the front, in that order."""
    preferred = (PREFERRED_BY_BK_TMA if tma else PREFERRED_BY_BK).get(BK, ())
    rank = {p: i for i, p in enumerate(preferred)}

    def key(cfg):
        shape = (cfg.kwargs["BT"], cfg.kwargs["BV"], cfg.num_warps, cfg.num_stages)
        return rank.get(shape, len(preferred))

    return sorted(configs, key=key)  # stable: the rest keep the space's order


def select_configs(
    configs, DK: int, DV: int, elem_bytes: int, limit: int | None, max_configs: int = MAX_TUNED,
    prefer: bool = False, tma: bool = False, state_bytes: int = 4,
) -> list[triton.Config]:  # fmt: skip
    """Clamp BV to the walk's value tile, drop duplicates and what would not fit in ``limit`` bytes of shared memory,
    and keep the first ``max_configs`` (the order of the space is the order of preference; ``prefer``: the main
    walk's :data:`PREFERRED_BY_BK` first; ``tma``: the launch moves tiles by tensor descriptors, its state operand
    taking ``state_bytes`` per element). Tiles narrower than WALK_MIN_TILE only where nothing wider fits, and then
    only with 8 warps, except those of :data:`TMA_NARROW_TILES` with descriptors.

    Never returns an empty list: if nothing fits the estimate, the smallest configuration is kept.
    """
    BK = walk_tile(DK)
    BVmax = walk_tile(DV)
    if prefer:
        configs = _preferred_first(configs, BK, tma)
    wide, narrow, seen = [], [], set()
    for cfg in configs:
        BT, BV = cfg.kwargs["BT"], min(cfg.kwargs["BV"], BVmax)
        key = (BT, BV, cfg.num_warps, cfg.num_stages)
        if key in seen:
            continue
        seen.add(key)
        estimate = estimate_shared_bytes(BT, BK, BV, cfg.num_stages, elem_bytes, tma=tma, state_bytes=state_bytes)
        if limit is not None and estimate > limit:
            continue
        extra = {k: v for k, v in cfg.kwargs.items() if k not in ("BT", "BV", "INTER_APART")}  # a pin's WARP_SPEC
        config = walk_config({"BT": BT, "BV": BV, **extra}, cfg.num_warps, cfg.num_stages)
        if BV >= WALK_MIN_TILE or (tma and key in TMA_NARROW_TILES.get(BK, ())):
            wide.append(config)
        elif cfg.num_warps >= NARROW_TILE_MIN_WARPS:
            narrow.append(config)
    out = (wide or narrow)[:max_configs]
    if not out:
        smallest = min(
            configs, key=lambda c: estimate_shared_bytes(c.kwargs["BT"], BK, c.kwargs["BV"], 1, elem_bytes)
        )
        meta = {"BT": smallest.kwargs["BT"], "BV": min(smallest.kwargs["BV"], BVmax)}
        warps = smallest.num_warps if meta["BV"] >= WALK_MIN_TILE else max(smallest.num_warps, NARROW_TILE_MIN_WARPS)
        out.append(walk_config(meta, warps, 1))
    return out


def _prune_context(configs, named_args, kwargs) -> dict:
    """What an ``early_config_prune`` hook needs from a launch: head dims, the caller's BT (fixed-BT spaces), the
    input's element size, the device's shared-memory limit (None off CUDA) and how many configurations to keep."""

    def arg(name, default=None):
        return kwargs.get(name, named_args.get(name, default))

    q = named_args["q"]
    return {
        "DK": arg("DK"),
        "DV": arg("DV"),
        "fixed_bt": 0 if "BT" in configs[0].kwargs else arg("BT"),
        "elem_bytes": q.element_size(),
        "limit": shared_limit() if getattr(q, "is_cuda", False) else None,
        "max_configs": MAX_TUNED_FP32 if q.element_size() >= 4 else MAX_TUNED,
        "arg": arg,
    }


def walk_prune_configs(configs, named_args, **kwargs):
    """``early_config_prune`` hook of the walk kernel: :func:`select_configs` for the device the call runs on."""
    c = _prune_context(configs, named_args, kwargs)
    return select_configs(
        configs, c["DK"], c["DV"], c["elem_bytes"], c["limit"], max_configs=c["max_configs"],
        prefer=not c["arg"]("STATE_ONLY", False), tma=bool(c["arg"]("USE_TMA", False)),
        state_bytes=dkdv_state_bytes(c["arg"]("INTER_PREC")),
    )  # fmt: skip


def inter_only_block_k(DK: int) -> int:
    """The K tile of the inter-only walk: the padded head dim, at least INTER_ONLY_MIN_TILE (see _FIXED_BT_CONFIG)."""
    return max(INTER_ONLY_MIN_TILE, padded_dim(DK))


def inter_only_tile(chunk_size: int) -> int:
    """Tokens per tile of the inter-only walk for chunks of ``chunk_size`` tokens (see ``_FIXED_BT_CONFIG``)."""
    return max(INTER_ONLY_MIN_BT, next_power_of_2(chunk_size))


def inter_only_config(BT: int, DK: int, DV: int) -> triton.Config:
    """The one configuration (BT, BK, BV, num_warps, num_stages) of the inter-only walk on tiles of ``BT`` tokens.

    Passed to the plain kernel explicitly: ``triton.autotune`` with a single configuration skips its pruning hook,
    which left BV unclamped and the rules unapplied in session 2 (see ``_FIXED_BT_CONFIG``). K and V tiles are at
    least INTER_ONLY_MIN_TILE wide. A configuration pinned by ``LIGHTNING_ATTENTION_KERNEL_CONFIG`` is taken as given
    (BV clamped to the padded value dim), without the minimum width: it is for probing. Whether the tiles fit the
    GPU's shared memory is the dispatcher's check (:func:`inter_only_fits`)."""
    pinned = os.environ.get(ENV_CONFIG, "").strip()
    if pinned:
        cfg = _parse_pinned(pinned)
        BV, warps, stages = min(cfg.kwargs["BV"], padded_dim(DV)), cfg.num_warps, cfg.num_stages
    else:
        bv, warps, stages = _FIXED_BT_CONFIG
        BV = max(INTER_ONLY_MIN_TILE, min(bv, padded_dim(DV)))
    return walk_config({"BT": BT, "BK": inter_only_block_k(DK), "BV": BV}, warps, stages)


def inter_only_fits(chunk_size: int, DK: int, DV: int, elem_bytes: int, limit: int | None) -> bool:
    """Whether the inter-only walk with chunks of ``chunk_size`` tokens fits ``limit`` bytes of shared memory
    (None: no limit known). Chunks of 256 tokens fit on sm_90 and sm_80, not under ~100 KB."""
    if limit is None:
        return True
    BT = inter_only_tile(chunk_size)
    # both orientations run: the forward and dv walks have (DK, DV) = (K, V), the dq and dk walks (V, K); the
    # configuration that launches decides, unpipelined (one stage)
    return all(
        estimate_shared_bytes(BT, cfg.kwargs["BK"], cfg.kwargs["BV"], 1, elem_bytes, inter_only=True) <= limit
        for cfg in (inter_only_config(BT, DK, DV), inter_only_config(BT, DV, DK))
    )


def select_dkdv_configs(
    configs,
    DK: int,
    DV: int,
    elem_bytes: int,
    state_bytes: int,
    limit: int | None,
    max_configs: int = MAX_TUNED,
    fixed_bt: int = 0,
) -> list[triton.Config]:
    """:func:`select_configs` for the fused dk/dv walk (the launcher only picks it when something fits:
    :func:`use_dkdv_walk`); never empty (the smallest tiles as the last resort)."""
    BK, BV = padded_dim(DK), padded_dim(DV)

    def shared(cfg):
        return estimate_dkdv_shared_bytes(
            cfg.kwargs.get("BT", fixed_bt), BK, BV, cfg.num_stages, elem_bytes, state_bytes
        )

    fits = [cfg for cfg in configs if limit is None or shared(cfg) <= limit]
    return (fits or [min(configs, key=shared)])[:max_configs]


def dkdv_prune_configs(configs, named_args, **kwargs):
    """``early_config_prune`` hook of the fused dk/dv walk."""
    c = _prune_context(configs, named_args, kwargs)
    return select_dkdv_configs(
        configs, c["DK"], c["DV"], c["elem_bytes"], dkdv_state_bytes(c["arg"]("INTER_PREC")), c["limit"],
        max_configs=c["max_configs"], fixed_bt=c["fixed_bt"],
    )  # fmt: skip
