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

# (BT, BV, num_warps, num_stages) in order of preference; the first entry is the default (and the one the CPU
# interpreter runs). Order from the H100 sweep (benchmarks/results/chunk_sweep_h100.json, bf16, K = V = 128):
# fwd+bwd 2.42 ms for (64, 64, 4, 1), 2.48 for (64, 128, 8, 2), 2.53 for (64, 64, 4, 2), 3.36 for (64, 32, 4, 2)
_SPACE = (
    (64, 64, 4, 1),
    (64, 128, 8, 2),
    (64, 64, 4, 2),
    (64, 32, 4, 2),
    (32, 64, 4, 2),
    (32, 32, 4, 1),
)

# how many configurations one shape class tunes over: each costs a compile (1-3 s for bf16/fp16) on the first call
# (cold start target: 15 s for a fwd+bwd, which compiles up to 6 kernel variants); fp32 builds (ieee dots lowered to
# FMA loops) take 10-40 s each, so fp32 takes the first configuration that fits, untuned
MAX_TUNED = 2
MAX_TUNED_FP32 = 1

# per-block shared memory limits (bytes) of the targets we build for; the device query wins when a GPU is present
SHARED_LIMITS = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448, 100: 232_448, 120: 101_376}


def _parse_pinned(text: str) -> triton.Config:
    fields = {"BT": _SPACE[0][0], "BV": _SPACE[0][1], "num_warps": _SPACE[0][2], "num_stages": _SPACE[0][3]}
    for item in text.split(","):
        if not item.strip():
            continue
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in fields:
            raise ValueError(f"{ENV_CONFIG}: unknown key {key!r} in {text!r}; keys are {sorted(fields)}")
        fields[key] = int(value)
    return triton.Config(
        {"BT": fields["BT"], "BV": fields["BV"]}, num_warps=fields["num_warps"], num_stages=fields["num_stages"]
    )


def walk_autotune_configs(fixed_bt: bool = False) -> list[triton.Config]:
    """The autotune space (one pinned config when ``LIGHTNING_ATTENTION_KERNEL_CONFIG`` is set).

    ``fixed_bt``: the caller passes BT (the inter-only mode): configs carry BV, warps and stages only.
    """
    pinned = os.environ.get(ENV_CONFIG, "").strip()
    configs = [_parse_pinned(pinned)] if pinned else [
        triton.Config({"BT": bt, "BV": bv}, num_warps=w, num_stages=s) for bt, bv, w, s in _SPACE
    ]
    if not fixed_bt:
        return configs
    out, seen = [], set()
    for cfg in configs:
        key = (cfg.kwargs["BV"], cfg.num_warps, cfg.num_stages)
        if key not in seen:
            seen.add(key)
            out.append(triton.Config({"BV": key[0]}, num_warps=key[1], num_stages=key[2]))
    return out


def padded_dim(d: int) -> int:
    """The power-of-two tile width (>= 16, the smallest tensor-core tile) that covers a head dim of ``d``."""
    return max(16, triton.next_power_of_2(d))


def estimate_shared_bytes(BT: int, BK: int, BV: int, num_stages: int, elem_bytes: int) -> int:
    """An upper estimate of the shared memory of one walk program, fitted to the compiler's numbers on sm_90 (the
    arch that stages the most operands in shared memory; sm_80/120 builds of the same config use as much or less).

    q and k tiles [BT, BK] (halved without pipelining), per value column the fp32 state column used as an mma operand
    plus the v tile column (4·BK + elem·BT bytes, counted twice: layout conversions), and the [BT, BT] score tile.
    ``tests/ops/test_aot.py`` checks it against compiled kernels.
    """
    qk = 2 * BT * BK * elem_bytes
    if num_stages < 2:
        qk //= 2
    return qk + 2 * BV * (4 * BK + elem_bytes * BT) + elem_bytes * BT * BT


def shared_limit(cc: int | None = None) -> int | None:
    """Per-block shared memory of compute capability ``cc`` (major*10+minor), or of the current CUDA device."""
    if cc is not None:
        return SHARED_LIMITS.get(cc, min(SHARED_LIMITS.values()))
    import torch

    if not torch.cuda.is_available():
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(props, "shared_memory_per_block_optin", None) or SHARED_LIMITS.get(props.major * 10 + props.minor)


def select_configs(
    configs, DK: int, DV: int, elem_bytes: int, limit: int | None, max_configs: int = MAX_TUNED, fixed_bt: int = 0
) -> list[triton.Config]:
    """Clamp BV to the padded value dim, drop duplicates and what would not fit in ``limit`` bytes of shared memory,
    and keep the first ``max_configs`` (the order of the space is the order of preference).

    Never returns an empty list: if nothing fits the estimate, the smallest configuration is kept.
    """
    BK = padded_dim(DK)
    BVmax = padded_dim(DV)
    out, seen = [], set()
    for cfg in configs:
        BT = cfg.kwargs.get("BT", fixed_bt)
        BV = min(cfg.kwargs["BV"], BVmax)
        key = (BT, BV, cfg.num_warps, cfg.num_stages)
        if key in seen:
            continue
        seen.add(key)
        if limit is not None and estimate_shared_bytes(BT, BK, BV, cfg.num_stages, elem_bytes) > limit:
            continue
        meta = {"BV": BV} if fixed_bt else {"BT": BT, "BV": BV}
        out.append(triton.Config(meta, num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    out = out[:max_configs]
    if not out:
        smallest = min(
            configs,
            key=lambda c: estimate_shared_bytes(c.kwargs.get("BT", fixed_bt), BK, c.kwargs["BV"], 1, elem_bytes),
        )
        meta = {"BV": min(smallest.kwargs["BV"], BVmax)}
        if not fixed_bt:
            meta["BT"] = smallest.kwargs["BT"]
        out.append(triton.Config(meta, num_warps=smallest.num_warps, num_stages=1))
    return out


def walk_prune_configs(configs, named_args, **kwargs):
    """``early_config_prune`` hook of the walk kernel: :func:`select_configs` for the device the call runs on."""
    DK = kwargs.get("DK", named_args.get("DK"))
    DV = kwargs.get("DV", named_args.get("DV"))
    fixed_bt = 0 if "BT" in configs[0].kwargs else kwargs.get("BT", named_args.get("BT"))
    q = named_args["q"]
    limit = shared_limit() if getattr(q, "is_cuda", False) else None
    max_configs = MAX_TUNED_FP32 if q.element_size() >= 4 else MAX_TUNED
    return select_configs(configs, DK, DV, q.element_size(), limit, max_configs=max_configs, fixed_bt=fixed_bt)
