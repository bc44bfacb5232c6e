"""Launch configurations of the chunk kernels: the tuning spaces, their shared-memory estimates and the one selector.

A walk's configuration is (BT tokens per chunk, BV value columns per program, warps, pipeline stages). For a launch
the plan asks :func:`walk_candidates` once: the space filtered by what fits the device's shared memory, best first,
at most :data:`MAX_TUNED` long. The autotuner times those candidates on the first call of a shape class (its key
holds the head dims and the kernel flags, never T, B or N; results are cached on disk), a pinned configuration or a
float32 launch takes the first. Why each space and preference is what it is: docs/kernels.md, "Tile and stage
choices" and "Tiles that were wrong".

Shared memory per block differs by architecture (101,376 B on sm_86/89/120, 166,912 B on sm_80, 232,448 B on sm_90):
``tests/ops/test_aot.py`` compiles every configuration the selector can pick for sm_80, sm_90 and sm_120 ahead of
time and checks the compiler's own number against the limit, so the estimates here must stay conservative.
"""

import functools

import triton

# (BT, BV, num_warps, num_stages) in order of preference after PREFERRED_BY_BK; the first entry is the default for
# head dims without a preference. Tiles narrower than WALK_MIN_TILE only with 8 warps, where nothing wider fits.
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

# the main walk's first candidates by padded K (the rows of its [K, BV] fp32 state), measured on an H100
PREFERRED_BY_BK = {
    64: ((64, 64, 4, 2), (64, 64, 4, 3)),
    128: ((64, 64, 4, 3), (64, 64, 4, 2)),
    256: ((64, 64, 8, 2), (64, 64, 4, 1)),
}
# with tensor descriptors at K = 128, two stages (98,344 B of shared memory for bf16) let two programs share an SM,
# each hiding the other's serial chunk chain, and lead four stages at one program per SM; a 32-wide value tile
# computing the scores once per warpgroup leads at K = 256 (docs/kernels.md, "The tuned table")
PREFERRED_BY_BK_TMA = {
    **PREFERRED_BY_BK,
    128: ((64, 64, 4, 2), (64, 64, 4, 4)),
    256: ((64, 32, 4, 3), (64, 64, 8, 2)),
}

# the inter-only mode (fixed BT = the hybrid's chunk size): exactly the shape class that was right against float64 on
# an H100, not tuned: tiles of >= INTER_ONLY_MIN_BT tokens (shorter chunks are masked rows of one), K and V tiles at
# least INTER_ONLY_MIN_TILE wide, (BV, warps, stages) = _FIXED_BT_CONFIG (docs/kernels.md, "The inter-only mode")
INTER_ONLY_MIN_BT = 128
INTER_ONLY_MIN_TILE = 32
_FIXED_BT_CONFIG = (32, 8, 1)

# the main walk and the pre-pass run tiles at least this wide in K and in V (a narrower head dim is the masked part
# of one tile): narrower tiles faulted or computed wrong values on an H100 (docs/kernels.md, "Tiles that were wrong")
WALK_MIN_TILE = 64
# where nothing WALK_MIN_TILE wide fits the shared memory (K = 256 below sm_90): narrower tiles, with 8 warps only
NARROW_TILE_MIN_WARPS = 8
# narrow tiles admitted with tensor descriptors, by padded K: right against float64 on the H100
TMA_NARROW_TILES = {256: ((64, 32, 4, 3),)}

# the segment pre-pass (no q, no o: a decayed Kᵀ V reduction, bound by bandwidth on (k, v)): the whole value dim in
# one tile and pipelined loads; at K = 256 it is bound by compute and the 32-wide descriptor tile leads
_STATE_SPACE = (
    (64, 32, 4, 3),
    (64, 128, 8, 3),
    (64, 64, 4, 3),
    (64, 64, 4, 1),
)

# the fused dk/dv walk: (BT, num_warps, num_stages), BV = the padded value dim; registers decide (G alone is 64 per
# thread at 8 warps)
_DKDV_SPACE = (
    (64, 8, 1),
    (32, 8, 1),
    (32, 4, 1),
)
# with tensor descriptors, by padded head dim (K = V): pipelined loads, and at 64 G is 32 registers per thread at
# 4 warps; three stages beat two at every grid (a) shape on the H200 (docs/kernels.md, "The fused dk/dv walk")
_DKDV_SPACE_TMA = {64: ((64, 4, 3),)}
# the fused walk holds the whole [K, V] state: only when both padded head dims are at most this
DKDV_MAX_DIM = 128

# configurations one shape class tunes over: each costs a compile (1-3 s for bf16/fp16) on the first call; fp32
# takes the first configuration that fits (its builds, three tf32 products per product, take 1.4-5 s each on a CPU
# core; no GPU run has ranked its candidates)
MAX_TUNED = 2
MAX_TUNED_FP32 = 1

REGISTERS_PER_SM = 65_536
# the walks compile to the 255-register cap (ptxas on sm_90), allocated per thread in units of 8
WALK_REGISTERS_PER_THREAD = 256
# K tiles from which a pipelined walk without descriptors stages its v tile twice (docs/kernels.md, "Shared-memory
# estimates")
POINTER_WIDE_BK = 256
# shared memory the driver reserves per resident block
RESERVED_SHARED_PER_BLOCK = 1024
# mbarriers of the tensor-descriptor copies, with room: 40-80 B compiled (triton 3.6, sm_90)
TMA_BARRIER_BYTES = 128


def walk_config(meta: dict, num_warps: int, num_stages: int) -> triton.Config:
    """A walk configuration: ``meta`` (BT, BV and, for the inter-only mode, BK) plus the kernel's INTER_APART flag,
    which follows from the warps: with 8, q·S is added after the intra product instead of being its accumulator, so
    both warpgroups share it by columns (docs/kernels.md, "Tile and stage choices")."""
    return triton.Config({**meta, "INTER_APART": num_warps > 4}, num_warps=num_warps, num_stages=num_stages)


def _space(shapes) -> list[triton.Config]:
    return [walk_config({"BT": bt, "BV": bv}, w, s) for bt, bv, w, s in shapes]


# host-side integer helpers: triton.cdiv and triton.next_power_of_2 are ConstexprFunctions in Triton >= 3.5
# (~2 µs a call), and the plans call them often


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


# shared-memory estimates (docs/kernels.md, "Shared-memory estimates")


def tma_store_bytes(BT: int, BV: int, elem_bytes: int) -> int:
    """What tensor descriptors add to a walk program's shared memory: the [BT, BV] o tile staged for its store and
    the copies' barriers."""
    return BT * BV * elem_bytes + TMA_BARRIER_BYTES


def estimate_shared_bytes(
    BT: int, BK: int, BV: int, num_stages: int, elem_bytes: int, inter_only: bool = False, tma: bool = False,
    state_bytes: int = 4, state_only: bool = False, rev_states: bool = False,
) -> int:  # fmt: skip
    """An upper estimate of the shared memory of one walk program, fitted to the compiler's numbers on sm_90 (the
    arch that stages the most operands in shared memory; sm_80/120 builds of the same config use as much or less).

    q and k tiles [BT, BK] (halved without pipelining), per value column the fp32 state column used as an mma operand
    plus the v tile column (4·BK + elem·BT bytes, counted twice: layout conversions), and the [BT, BT] score tile.
    ``inter_only``: no score tile, but the compiler stages more of q, so half a [BT, BK] tile takes its place.
    ``tma``: tiles moved by tensor descriptors (:func:`tma_store_bytes` more, and at least :func:`tma_walk_bytes`
    with the state operand's ``state_bytes``; never in the inter-only mode). Without descriptors, a pipelined walk
    with K tiles of :data:`POINTER_WIDE_BK` or more stages the v tile twice per stage (sm_90: 245,760 B compiled at
    (BT, BV, stages) = (64, 64, 3), over the limit). ``state_only``: the segment pre-pass (no q, o or score tile:
    it compiles to at most 60% of the walk's estimate, which bounds it without that term).

    fp32 inputs (three tf32 products per product, ``plan.FP32_PRECISION``), with or without descriptors:
    :func:`tma_walk_bytes` plus :func:`split_fp32_bytes`, which every configuration of the space compiles within on
    sm_80, sm_90 and sm_120 at K = 64, 128 and 256 (the terms above, fitted to 16-bit builds, overstate these walks:
    at K = 256 on sm_90 they ruled out every 64-wide tile).

    ``rev_states``: the walk also reads an x tile [BT, BV] per chunk for the reverse local states (REV_STATES),
    through pointers: one more per stage.
    """
    x_tiles = max(1, num_stages) * BT * BV * elem_bytes if rev_states else 0
    if elem_bytes >= 4 and not inter_only:
        descriptor_tiles = tma_walk_bytes(BT, BK, BV, num_stages, elem_bytes, state_bytes)
        return descriptor_tiles + split_fp32_bytes(BT, BK, BV, elem_bytes) + x_tiles
    qk = 2 * BT * BK * elem_bytes
    if num_stages < 2:
        qk //= 2
    elif inter_only:  # chunk tiles of up to 256 tokens: every pipelined q, k, v tile per stage
        qk = num_stages * BT * (2 * BK + BV) * elem_bytes
    scores = elem_bytes * BT * (BK // 2 if inter_only else BT)
    estimate = qk + 2 * BV * (4 * BK + elem_bytes * BT) + scores
    if num_stages >= 2 and not inter_only:  # pipelined loads: a q, k and v tile per stage
        v_tiles = 2 if BK >= POINTER_WIDE_BK and not tma and not state_only else 1
        estimate = max(estimate, num_stages * BT * (2 * BK + v_tiles * BV) * elem_bytes + scores)
    if tma and not inter_only:
        estimate += tma_store_bytes(BT, BV, elem_bytes)
        estimate = max(estimate, tma_walk_bytes(BT, BK, BV, num_stages, elem_bytes, state_bytes))
    return estimate + x_tiles


def split_fp32_bytes(BT: int, BK: int, BV: int, elem_bytes: int) -> int:
    """What the operand halves of fp32 inputs' products add to a walk program's shared memory: where the value tile
    is not as wide as the chunk, the compiler stages the halves of the k tile and of the score tile apart, a [BT, BK]
    and two [BT, BT] fp32 tiles more at most; square tiles need nothing more (fitted with
    :func:`estimate_shared_bytes`)."""
    if elem_bytes < 4 or BV == BT:
        return 0
    return 4 * BT * (BK + 2 * BT)


def tma_walk_bytes(BT: int, BK: int, BV: int, num_stages: int, elem_bytes: int, state_bytes: int) -> int:
    """Shared memory of a walk program with tensor descriptors: the q, k, v tiles of every stage, the state as the
    inter product's operand (``state_bytes`` per element) and the barriers; the score tile and the staged o reuse
    that space. Equal to the compiled size of every bf16 walk built on sm_90 (triton 3.6; K = 64, 128, 256; 1 to 4
    stages; BV = 32 to 128)."""
    return max(1, num_stages) * BT * (2 * BK + BV) * elem_bytes + BK * BV * state_bytes + TMA_BARRIER_BYTES


def estimate_resident_shared_bytes(
    BT: int, BK: int, BV: int, num_stages: int, elem_bytes: int, tma: bool = False
) -> int:
    """Shared memory of one main-walk program as compiled for 16-bit inputs on sm_90, for the occupancy model (not
    for fitting: :func:`estimate_shared_bytes` is the upper bound over every precision): a q, k and v tile per
    pipeline stage (one without pipelining), the [BT, BT] score tile and the [BK, BV] state as the inter product's
    16-bit operand; ``tma``: plus :func:`tma_store_bytes`."""
    resident = max(1, num_stages) * BT * (2 * BK + BV) * elem_bytes + BT * BT * elem_bytes + BK * BV * 2
    return resident + (tma_store_bytes(BT, BV, elem_bytes) if tma else 0)


def estimate_dkdv_shared_bytes(BT: int, BK: int, BV: int, num_stages: int, elem_bytes: int, state_bytes: int,
                               tma: bool = False) -> int:  # fmt: skip
    """An upper estimate of the shared memory of one fused dk/dv program, fitted to the compiler's numbers on sm_90:
    the four [BT, BK|BV] input tiles (q, k, v, do; per pipeline stage), 1.5 copies of G as an mma operand
    (``state_bytes`` per element) and two [BT, BT] score tiles; ``tma``: plus the dk and dv tiles staged for their
    stores and the copies' barriers."""
    tiles = BT * (2 * BK + 2 * BV) * elem_bytes * max(1, num_stages)
    staged = tma_store_bytes(BT, BK, elem_bytes) + tma_store_bytes(BT, BV, elem_bytes) if tma else 0
    return tiles + 3 * BK * BV * state_bytes // 2 + 2 * elem_bytes * BT * BT + staged


def state_operand_bytes(inter_prec: str | None) -> int:
    """Bytes per element of the carried state (S in the walk, G in the dk/dv walk) as the inter product's operand:
    bf16 for bf16 inputs in ``input`` mode, else fp32."""
    return 2 if inter_prec == "input" else 4


# the selector


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
    prefer: bool = False, tma: bool = False, state_bytes: int = 4, state_only: bool = False, rev_states: bool = False,
) -> list[triton.Config]:  # fmt: skip
    """Clamp BV to the walk's value tile, drop duplicates and what would not fit in ``limit`` bytes of shared memory
    (None: no limit known), and keep the first ``max_configs`` (the order of the space is the order of preference;
    ``prefer``: the main walk's :data:`PREFERRED_BY_BK` first; ``tma``: the launch moves tiles by tensor
    descriptors, its state operand taking ``state_bytes`` per element; ``state_only``: for the pre-pass). Tiles
    narrower than WALK_MIN_TILE only where nothing wider fits, and then only with 8 warps, except those of
    :data:`TMA_NARROW_TILES` with descriptors.

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
        estimate = estimate_shared_bytes(BT, BK, BV, cfg.num_stages, elem_bytes, tma=tma, state_bytes=state_bytes,
                                         state_only=state_only, rev_states=rev_states)  # fmt: skip
        if limit is not None and estimate > limit:
            continue
        config = walk_config({"BT": BT, "BV": BV}, cfg.num_warps, cfg.num_stages)
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


@functools.lru_cache(maxsize=1024)
def walk_candidates(
    DK: int, DV: int, elem_bytes: int, limit: int | None, *, state_only: bool, tma: bool, state_bytes: int,
    pin: tuple[int, int, int, int] | None = None, rev_states: bool = False,
) -> tuple[triton.Config, ...]:  # fmt: skip
    """The configurations a walk launch may run, best first: the one selector, asked by the plan (the entry that
    holds fewest programs per SM sets the occupancy the segment plan counts with; the autotuner times them all).

    ``state_only``: the segment pre-pass (its own space, no head-dim preference). ``limit``: the device's shared
    memory per block. ``rev_states``: the walk also computes reverse local states (more shared memory). ``pin``:
    (BT, BV, num_warps, num_stages) to run instead of the space (still clamped and checked like a tuned one); float32
    inputs take only the first candidate (:data:`MAX_TUNED_FP32`).
    """
    shapes = (pin,) if pin is not None else _STATE_SPACE if state_only else _SPACE
    max_configs = MAX_TUNED_FP32 if elem_bytes >= 4 else MAX_TUNED
    return tuple(
        select_configs(
            _space(shapes), DK, DV, elem_bytes, limit, max_configs, prefer=not state_only and pin is None, tma=tma,
            state_bytes=state_bytes, state_only=state_only, rev_states=rev_states,
        )
    )  # fmt: skip


def walk_programs_per_sm(config: triton.Config, DK: int, elem_bytes: int, sm_shared: int, tma: bool) -> int:
    """How many programs of the walk configuration ``config`` one SM runs at once, bounded by shared memory
    (``sm_shared`` bytes per SM) and by registers. On an H100, bf16: K = 128 with three or four stages 1, with two
    or one 2 (by registers); K = 64 2; K = 256 1."""
    BT, BV = config.kwargs["BT"], config.kwargs["BV"]
    shared = estimate_resident_shared_bytes(BT, walk_tile(DK), BV, config.num_stages, elem_bytes, tma)
    by_shared = sm_shared // (shared + RESERVED_SHARED_PER_BLOCK)
    by_registers = REGISTERS_PER_SM // (config.num_warps * 32 * WALK_REGISTERS_PER_THREAD)
    return max(1, min(by_shared, by_registers))


# the fused dk/dv walk


def use_dkdv_walk(DK: int, DV: int, elem_bytes: int, state_bytes: int, limit: int | None) -> bool:
    """Whether the fused dk/dv walk applies: its state tile covers the whole [K, V] (padded dims <= 128) and at
    least one configuration fits the per-block shared memory ``limit`` (None: no limit known, e.g. the CPU)."""
    BK, BV = padded_dim(DK), padded_dim(DV)
    if BK > DKDV_MAX_DIM or BV > DKDV_MAX_DIM:
        return False
    if limit is None:
        return True
    return any(estimate_dkdv_shared_bytes(bt, BK, BV, s, elem_bytes, state_bytes) <= limit for bt, _, s in _DKDV_SPACE)


def dkdv_descriptor_space(DK: int, DV: int, elem_bytes: int, state_bytes: int, limit: int | None) -> tuple:
    """The fused dk/dv walk's (BT, num_warps, num_stages) with tensor descriptors that fit ``limit``: measured only for
    K = V (padded) = 64; empty elsewhere, where the walk keeps :data:`_DKDV_SPACE`."""
    BK, BV = padded_dim(DK), padded_dim(DV)
    space = _DKDV_SPACE_TMA.get(BK, ()) if BK == BV else ()
    return tuple(
        c for c in space if limit is None or estimate_dkdv_shared_bytes(c[0], BK, BV, c[2], elem_bytes, state_bytes,
                                                                         True) <= limit
    )  # fmt: skip


@functools.lru_cache(maxsize=256)
def dkdv_candidates(
    DK: int, DV: int, elem_bytes: int, state_bytes: int, limit: int | None, fixed_bt: int = 0,
    pin: tuple[int, int, int, int] | None = None, tma: bool = False,
) -> tuple[triton.Config, ...]:  # fmt: skip
    """The fused dk/dv walk's configurations, best first (BT, warps, stages; BT left out when the caller fixes it,
    ``fixed_bt``): what fits ``limit``, or the smallest as the last resort; never empty. ``tma``: the launch moves
    its tiles by tensor descriptors."""
    BK, BV = padded_dim(DK), padded_dim(DV)
    if pin is not None:
        space = ((pin[0], pin[2], pin[3]),)
    else:
        space = (tma and dkdv_descriptor_space(DK, DV, elem_bytes, state_bytes, limit)) or _DKDV_SPACE
    configs, seen = [], set()
    for bt, w, s in space:
        key = (w, s) if fixed_bt else (bt, w, s)
        if key not in seen:
            seen.add(key)
            configs.append(triton.Config({} if fixed_bt else {"BT": bt}, num_warps=w, num_stages=s))

    def shared(cfg):
        return estimate_dkdv_shared_bytes(cfg.kwargs.get("BT", fixed_bt), BK, BV, cfg.num_stages, elem_bytes,
                                          state_bytes, tma)  # fmt: skip

    fits = [cfg for cfg in configs if limit is None or shared(cfg) <= limit]
    max_configs = MAX_TUNED_FP32 if elem_bytes >= 4 else MAX_TUNED
    return tuple((fits or [min(configs, key=shared)])[:max_configs])


# the inter-only mode


def inter_only_block_k(DK: int) -> int:
    """The K tile of the inter-only walk: the padded head dim, at least INTER_ONLY_MIN_TILE."""
    return max(INTER_ONLY_MIN_TILE, padded_dim(DK))


def inter_only_tile(chunk_size: int) -> int:
    """Tokens per tile of the inter-only walk for chunks of ``chunk_size`` tokens."""
    return max(INTER_ONLY_MIN_BT, next_power_of_2(chunk_size))


def inter_only_config(BT: int, DK: int, DV: int, pin: tuple[int, int, int, int] | None = None) -> triton.Config:
    """The one configuration (BT, BK, BV, num_warps, num_stages) of the inter-only walk on tiles of ``BT`` tokens,
    passed to the plain kernel explicitly (not tuned). K and V tiles are at least INTER_ONLY_MIN_TILE wide. A
    ``pin`` (BT, BV, num_warps, num_stages) is taken as given (BV clamped to the padded value dim) without the
    minimum width: it is for probing. Whether the tiles fit the GPU is the caller's check (:func:`inter_only_fits`)."""
    if pin is not None:
        BV, warps, stages = min(pin[1], padded_dim(DV)), pin[2], pin[3]
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
