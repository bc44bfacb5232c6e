"""Ahead-of-time GPU builds of the kernel configurations the plan can pick, for sm_80, sm_90 and sm_120.

The interpreter accepts things a GPU build rejects (dot tiles under 16, shared memory over the per-block limit, type
errors in code paths it never takes). ``tests/ops/aot_build.py`` compiles, in a subprocess with the interpreter off,
what ``kernels.configs.walk_candidates`` lets the plan pick on each architecture; every build's shared memory
(``metadata.shared``, the compiler's number) must be within the architecture's per-block limit and within the
estimate the dispatcher filtered with.

bf16 builds (bf16 inter product) and fp16 builds (tf32 inter product) differ in the inter-chunk product only; the
split precision's builds carry more live tiles (docs/design.md, "Precision"). fp32 builds run each product as three
tf32 products (``plan.FP32_PRECISION``), whose operand halves take shared memory of their own
(``configs.split_fp32_bytes``): CI builds the forward walk at K = 64, 128 and 256 on every target, the backward's
reverse walk, the pre-pass and the fused dk/dv walk; ``-m slow`` builds every head dim's candidates.
"""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from lightning_attention.ops.lightning.kernels import tuned, walk  # after the skip: it imports Triton

ROOT = Path(__file__).resolve().parents[2]
ARCHS = (80, 90, 120)
FULL_FORWARD = {}  # default flags: forward walk with h0 and final state (the largest live set)
REVERSE_SEGMENTED = {"REVERSE": True, "SEG_IN": True, "USE_H0": False, "STORE_HT": False}
PRE_PASS_VARLEN = {"STATE_ONLY": True, "USE_H0": False, "STORE_HT": False, "VARLEN": 2}
PRE_PASS = {"STATE_ONLY": True, "USE_H0": False, "STORE_HT": False}
# the backward's dq walk at K = 64 on segments, also writing the reverse local states (every segment's: dh0 wanted)
DQ_REVERSE_STATES = {"SEG_IN": True, "USE_H0": False, "STORE_HT": False, "REV_STATES": True, "REV_ALL": True}
# the split precision: scores, state and decayed values as two halves (more live tiles than the default)
SPLIT_FORWARD = {"SPLIT_OPERANDS": True}
# hybrid attention's default: chunks of 256 tokens, inter-only reverse walk, the values (V = 128) and the narrow
# normaliser call (V = 16) in both orientations
INTER_ONLY_256 = {"INTER_ONLY": True, "BT": 256, "REVERSE": True}
# the two-warpgroup walk (Gluon, sm_90 only), (K, V, flags): at K = 256 forward with h0 and final state, the reverse
# walk with dht and dh0, segments in both directions, no decay, and V = 64 (one pair of value tiles); at K = 128
# (64-wide value tiles) the forward, the backward's segmented reverse walk, and V = 256 (two pairs), and the forward
# and the segmented reverse walk under the split precision (the most shared memory of any build)
WALK_WS_BUILDS = [
    (256, 256, {}),
    (256, 256, {"REVERSE": True}),
    (256, 256, {"SEG_IN": True, "USE_H0": False, "STORE_HT": False}),
    (256, 256, {"SEG_IN": True, "USE_H0": False, "STORE_HT": False, "REVERSE": True}),
    (256, 256, {"HAS_DECAY": False}),
    (256, 64, {}),
    (128, 128, {}),
    (128, 128, {"SEG_IN": True, "USE_H0": False, "STORE_HT": False, "REVERSE": True}),
    (128, 256, {}),
    (128, 128, {"SPLIT": True}),
    (128, 128, {"SPLIT": True, "SEG_IN": True, "USE_H0": False, "STORE_HT": False, "REVERSE": True}),
]
# its pre-pass: forward, and reverse with the walk's first segment skipped; at K = 128 also split
STATE_WS_BUILDS = [
    (256, 256, {}),
    (256, 256, {"REVERSE": True, "SKIP_FINAL": True}),
    (128, 128, {}),
    (128, 128, {"SPLIT": True, "REVERSE": True, "SKIP_FINAL": True}),
]
# the fused dk/dv walk at K = V = 128: from dht storing dh0, in segments, without decay
DKDV_WS_BUILDS = [
    (128, 128, {}),
    (128, 128, {"SEG_IN": True, "USE_H0": False, "STORE_HT": False}),
    (128, 128, {"HAS_DECAY": False}),
]


# the tuned tables shipped without a GPU run (the selector's first candidates): every entry is built for its target
UNTIMED_TABLES = {cc: tuned.TABLES[cc] for cc in tuned.UNTIMED}
# the kernel flags a walk's table key holds (besides DK, DV, USE_TMA and WAVES)
_KEY_FLAGS = (
    "VARLEN", "REVERSE", "HAS_DECAY", "STATE_ONLY", "SEG_IN", "USE_H0", "INTER_ONLY", "SPLIT_OPERANDS", "REV_STATES",
)  # fmt: skip
_DTYPE_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


def untimed_entry_jobs() -> list[dict]:
    """One build job per (architecture, dtype, head dims, kernel flags) of the untimed tables' walk entries, each
    the selector's first candidate (the entry itself: tests/ops/test_tuned.py)."""
    jobs = {}
    for cc, table in UNTIMED_TABLES.items():
        for key in table:
            named = dict(zip(walk.AUTOTUNE_KEY, key[3:], strict=True))
            job = {"cc": cc, "dtype": _DTYPE_NAMES[key[1]], "DK": named["DK"], "DV": named["DV"],
                   "flags": {name: named[name] for name in _KEY_FLAGS}, "which": "first"}  # fmt: skip
            jobs[json.dumps(job, sort_keys=True)] = job
    return list(jobs.values())


def build(jobs: list[dict], timeout: int = 600) -> list[dict]:
    """Every job's builds (``tests/ops/aot_build.py``), the jobs dealt out to one subprocess per CPU core: a build runs
    on one core, and the CI set takes minutes from an empty Triton cache."""
    env = dict(os.environ, TRITON_INTERPRET="0")
    n = max(1, min(len(jobs), os.cpu_count() or 1))
    shares = [jobs[i::n] for i in range(n)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.ops.aot_build", json.dumps(share)],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        for share in shares
    ]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, f"AOT build failed:\n{err[-4000:]}"
            results += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    finally:
        for proc in procs:
            proc.kill()
    return results


def check(results: list[dict]) -> None:
    assert results, "nothing was built"
    for r in results:
        label = {k: r[k] for k in ("kernel", "cc", "dtype", "DK", "DV", "BT", "BV", "num_warps", "num_stages")
                 if k in r}
        assert r["shared"] <= r["limit"], f"{label}: {r['shared']} B of shared memory > limit {r['limit']}"
        if "estimate" in r:
            assert r["shared"] <= r["estimate"], f"{label}: {r['shared']} B > the dispatcher's estimate {r['estimate']}"


@pytest.fixture
def slow_requested(request):
    """The exhaustive builds take tens of minutes on a CI core: run them only with ``-m slow``."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("exhaustive AOT builds: run with -m slow")


@pytest.fixture(scope="module")
def ci_builds():
    """One subprocess for the CI set: every bf16 config the dispatcher can pick at K = V = 128 (the benchmark) and
    the preferred one at 256 (the largest tiles; all of them with ``-m slow``) on each target, the backward's reverse
    segmented walk and the varlen pre-pass, one fp32 build with odd head dims, and the scan kernel."""
    jobs = [{"cc": cc, "dtype": "bf16", "DK": 128, "DV": 128, "flags": FULL_FORWARD} for cc in ARCHS]
    jobs += [{"cc": cc, "dtype": "bf16", "DK": 256, "DV": 256, "flags": FULL_FORWARD, "which": "first"} for cc in ARCHS]
    jobs += [{"cc": cc, "dtype": "fp16", "DK": 128, "DV": 128, "flags": FULL_FORWARD} for cc in ARCHS]
    jobs += [{"cc": cc, "dtype": "bf16", "DK": 128, "DV": 128, "flags": REVERSE_SEGMENTED, "which": "first"}
             for cc in ARCHS]
    jobs += [{"cc": cc, "dtype": "fp16", "DK": 64, "DV": 64, "flags": PRE_PASS_VARLEN, "which": "first"}
             for cc in ARCHS]
    jobs += [{"cc": cc, "dtype": dt, "DK": 64, "DV": 64, "flags": flags} for cc in ARCHS for dt in ("bf16", "fp16")
             for flags in (DQ_REVERSE_STATES, {**DQ_REVERSE_STATES, "SPLIT_OPERANDS": True})]  # fmt: skip
    jobs += [{"cc": 90, "dtype": "fp32", "DK": 48, "DV": 40, "flags": {"VARLEN": 1}, "which": "last"}]
    jobs += [{"cc": cc, "dtype": "fp32", "DK": d, "DV": d, "flags": FULL_FORWARD}
             for cc in ARCHS for d in (64, 128, 256)]  # fmt: skip
    jobs += [{"cc": 90, "dtype": "fp32", "DK": d, "DV": d, "flags": flags}
             for d in (128, 256) for flags in (REVERSE_SEGMENTED, PRE_PASS)]  # fmt: skip
    jobs += [{"kernel": "dkdv", "cc": cc, "dtype": "fp32", "DK": 128, "DV": 128} for cc in ARCHS]
    jobs += [{"cc": cc, "dtype": "bf16", "DK": 128, "DV": 128, "flags": SPLIT_FORWARD} for cc in ARCHS]
    jobs += [{"cc": cc, "dtype": dt, "DK": d, "DV": d, "flags": SPLIT_FORWARD, "which": "first"}
             for cc in ARCHS for dt, d in (("bf16", 256), ("fp16", 128))]  # fmt: skip
    jobs += [{"cc": 90, "dtype": "bf16", "DK": d, "DV": d, "flags": flags, "pointers": True}
             for d, flags in ((128, FULL_FORWARD), (256, FULL_FORWARD), (256, PRE_PASS))]  # fmt: skip
    jobs += [{"kernel": "scan", "cc": cc} for cc in ARCHS]
    jobs += [{"kernel": "dkdv", "cc": cc, "dtype": dt, "DK": d, "DV": d} for cc in ARCHS for dt in ("bf16", "fp16")
             for d in (64, 128)]  # fmt: skip
    jobs += [{"cc": cc, "dtype": "bf16", "DK": dk, "DV": dv, "flags": INTER_ONLY_256}
             for cc in (80, 90) for dk, dv in ((128, 128), (16, 128))]  # fmt: skip
    jobs += [{"kernel": "walk_ws", "cc": 90, "DK": dk, "DV": dv, "flags": flags} for dk, dv, flags in WALK_WS_BUILDS]
    jobs += [{"kernel": "state_ws", "cc": 90, "DK": dk, "DV": dv, "flags": flags}
             for dk, dv, flags in STATE_WS_BUILDS]  # fmt: skip
    jobs += [{"kernel": "dkdv_ws", "cc": 90, "DK": dk, "DV": dv, "flags": flags} for dk, dv, flags in DKDV_WS_BUILDS]
    jobs += untimed_entry_jobs()
    return build(jobs)


@pytest.mark.parametrize("cc", sorted(UNTIMED_TABLES))
def test_untimed_table_entries_compile(ci_builds, cc):
    """Every walk entry of a tuned table shipped without a GPU run was built for its target with its key's kernel
    flags, as that configuration, within the shared-memory limit and the dispatcher's estimate."""
    assert UNTIMED_TABLES[cc]
    for key, entry in UNTIMED_TABLES[cc].items():
        assert key[0] == "walk", key
        named = dict(zip(walk.AUTOTUNE_KEY, key[3:], strict=True))
        built = [r for r in ci_builds if r.get("kernel") == "walk" and r["cc"] == cc
                 and r["dtype"] == _DTYPE_NAMES[key[1]] and (r["DK"], r["DV"]) == (named["DK"], named["DV"])
                 and all(r["flags"].get(name) == named[name] for name in _KEY_FLAGS)]  # fmt: skip
        assert built, key
        assert all((r["BT"], r["BV"], r["num_warps"], r["num_stages"]) == entry for r in built), (key, built)
        check(built)


def test_two_warpgroup_walk_compiles_for_sm90(ci_builds):
    """Gluon has no interpreter: on CPU the two-warpgroup walk, pre-pass and fused dk/dv walk are only built, in the
    variants the dispatcher launches, within the H100's shared memory, with two consumer warpgroups and the producer
    warp (12)."""
    pytest.importorskip("triton.experimental.gluon")
    builds = [r for r in ci_builds if r["kernel"] in ("walk_ws", "state_ws", "dkdv_ws")]
    assert len(builds) == len(WALK_WS_BUILDS) + len(STATE_WS_BUILDS) + len(DKDV_WS_BUILDS)
    check(builds)
    assert all(r["num_warps"] == 12 for r in builds), builds


def test_two_warpgroup_walk_only_on_the_triton_versions_it_was_checked_with():
    """Gluon is experimental: the dispatcher runs the two-warpgroup walk with Triton 3.6 (the GPU runs) to 3.8 (CI's
    builds) only, and the Triton walk with any other version."""
    from lightning_attention.ops.lightning.kernels.walk_ws import triton_version_supported

    assert [triton_version_supported(v) for v in ("3.5.1", "3.6.0", "3.7.1", "3.8.0", "3.8.0+git1a2b", "3.9.0")] == [
        False, True, True, True, True, False,
    ]  # fmt: skip


@pytest.mark.parametrize("cc", ARCHS)
@pytest.mark.parametrize("dtype, d", [("bf16", 128), ("bf16", 256), ("fp16", 128)])
def test_half_precision_configs_fit(ci_builds, cc, dtype, d):
    check([r for r in ci_builds if r["kernel"] == "walk" and r["cc"] == cc and r["dtype"] == dtype
           and r["DK"] == d and not r["flags"]])  # fmt: skip


@pytest.mark.parametrize("cc", ARCHS)
def test_split_precision_configs_fit(ci_builds, cc):
    """The split precision's walks (bf16 with the state split too, fp16 with it in tf32) within the limit and the
    estimate the plan filtered with (its state operand counted at 4 bytes, as the tf32 product's)."""
    builds = [r for r in ci_builds if r["kernel"] == "walk" and r["cc"] == cc and r["flags"] == SPLIT_FORWARD]
    assert {(r["dtype"], r["DK"]) for r in builds} == {("bf16", 128), ("bf16", 256), ("fp16", 128)}
    check(builds)


def test_walks_without_descriptors_fit_on_sm90(ci_builds):
    """On sm_90 a walk runs without tensor descriptors where its inputs miss their alignment or the ``tma`` setting is
    off: the forward walk at K = 128 and 256 and the pre-pass at K = 256 built so, within the limit and estimate."""
    builds = [r for r in ci_builds if r.get("pointers")]
    assert {(r["DK"], r["flags"].get("STATE_ONLY", False)) for r in builds} == {(128, False), (256, False), (256, True)}
    check(builds)


# compiled shared memory of sm_90 walks without descriptors at K = V = 256 (bf16 forward with h0 and final state;
# the same with Triton 3.6 on an H100 and 3.8 here): what a pin may ask for, beyond the dispatcher's candidates
POINTER_WALKS_SM90_K256 = {
    (64, 64, 4, 1): 106_496,
    (64, 64, 4, 2): 172_032,
    (64, 64, 8, 2): 172_032,
    (64, 32, 8, 2): 151_552,
    (64, 32, 4, 3): 221_184,
    (64, 64, 4, 3): 245_760,
    (64, 64, 4, 4): 319_488,
}


def test_pointer_walk_estimate_covers_pinned_configurations_at_k256():
    """The estimate bounds every compiled size above, so a pin over the limit is never taken as given: (64, 64, 4, 3)
    once passed the estimate (229,376 B) and failed to compile on the H100 (245,760 B > 232,448)."""
    from lightning_attention.ops.lightning.device import SHARED_PER_BLOCK
    from lightning_attention.ops.lightning.kernels.configs import estimate_shared_bytes, walk_candidates

    for (BT, BV, _, stages), compiled in POINTER_WALKS_SM90_K256.items():
        assert estimate_shared_bytes(BT, 256, BV, stages, 2, state_bytes=2) >= compiled, (BT, BV, stages)
    pinned = walk_candidates(256, 256, 2, SHARED_PER_BLOCK[90], state_only=False, tma=False, state_bytes=2,
                             pin=(64, 64, 4, 3))  # fmt: skip
    assert _shapes(pinned) == [(64, 64, 4, 1)]  # the smallest, unpipelined, instead


def test_occupancy_estimate_covers_the_compiled_forward_walks(ci_builds):
    """The segment plan's occupancy (configs.walk_programs_per_sm) never counts more resident programs than fit: the
    compiled shared memory of the 16-bit forward walks on sm_90 is within configs.estimate_resident_shared_bytes."""
    builds = [
        r for r in ci_builds if r["kernel"] == "walk" and r["cc"] == 90 and r["dtype"] != "fp32" and not r["flags"]
    ]
    assert builds
    for r in builds:
        assert r["shared"] <= r["resident"], r


def _first(d, state_bytes=2, **kw):
    """The first candidate of the main walk at K = V = d on an H100 with descriptors (bf16)."""
    from lightning_attention.ops.lightning.device import SHARED_PER_BLOCK
    from lightning_attention.ops.lightning.kernels.configs import walk_candidates

    return walk_candidates(d, d, 2, SHARED_PER_BLOCK[90], state_only=False, tma=True, state_bytes=state_bytes, **kw)[0]


def test_walk_programs_per_sm_on_an_h100():
    """Programs per SM of the main walk's first candidate (bf16, sm_90: 233,472 B of shared memory per SM),
    with tensor descriptors as an H100 launches them: two stages at K = 128 hold 98 KB (two programs; four stages
    would hold 180 KB, one program), K = 64 is bound by registers (two 4-warp programs of 255 registers), K = 256 runs
    one program."""
    from lightning_attention.ops.lightning.device import SHARED_PER_SM
    from lightning_attention.ops.lightning.kernels.configs import walk_programs_per_sm

    def per_sm(d):
        return walk_programs_per_sm(_first(d), d, 2, SHARED_PER_SM[90], tma=True)

    assert (per_sm(64), per_sm(128), per_sm(256)) == (2, 2, 1)
    four_stages = walk_programs_per_sm(_first(128, pin=(64, 64, 4, 4)), 128, 2, SHARED_PER_SM[90], tma=True)
    assert four_stages == 1


def test_walk_first_config_tile_width_on_an_h100():
    """The value tile the segment plan counts programs with (bf16, sm_90, descriptors): 64 wide at K = 64 and 128;
    at K = 256 the 32-wide 4-warp tile where the state operand is bf16, 64 wide (8 warps) where it is fp32 (fp16)."""

    def tile(d, state_bytes):
        cfg = _first(d, state_bytes)
        return cfg.kwargs["BV"], cfg.num_warps

    assert [tile(64, 2), tile(128, 2), tile(256, 2), tile(256, 4)] == [(64, 4), (64, 4), (32, 4), (64, 8)]


@pytest.mark.parametrize("cc", ARCHS)
def test_backward_and_prepass_variants_compile(ci_builds, cc):
    check([r for r in ci_builds
           if r["kernel"] == "walk" and r["cc"] == cc and r["flags"] in (REVERSE_SEGMENTED, PRE_PASS_VARLEN)])


@pytest.mark.parametrize("cc", ARCHS)
def test_dq_walk_with_reverse_states_fits(ci_builds, cc):
    """The K = 64 dq walk that also computes the reverse local states (an x tile per stage and a second state), 16-bit,
    default and split precision: every configuration the dispatcher can pick, within the limit and the estimate."""
    builds = [r for r in ci_builds if r["kernel"] == "walk" and r["cc"] == cc and r["flags"].get("REV_STATES")]
    assert len({(r["dtype"], r["flags"].get("SPLIT_OPERANDS", False)) for r in builds}) == 4, builds
    check(builds)


@pytest.mark.parametrize("cc", ARCHS)
def test_fp32_walks_fit(ci_builds, cc):
    """fp32 walks (three tf32 products per product) within the limit and the estimate: the forward at K = 64, 128
    and 256, odd head dims with packed sequences, and on sm_90 the reverse segmented walk and the pre-pass."""
    builds = [r for r in ci_builds if r["kernel"] == "walk" and r["dtype"] == "fp32" and r["cc"] == cc]
    assert {r["DK"] for r in builds if not r["flags"]} == {64, 128, 256}
    check(builds)


@pytest.mark.parametrize("cc", ARCHS)
def test_scan_compiles(ci_builds, cc):
    check([r for r in ci_builds if r["kernel"] == "scan" and r["cc"] == cc])


@pytest.mark.slow
@pytest.mark.parametrize("cc", ARCHS)
def test_bf16_k256_configs_fit_all(cc, slow_requested):
    check(build([{"cc": cc, "dtype": "bf16", "DK": 256, "DV": 256}], timeout=3600))


@pytest.mark.slow
@pytest.mark.parametrize("cc", ARCHS)
def test_fp32_configs_fit_all(cc, slow_requested):
    check(build([{"cc": cc, "dtype": "fp32", "DK": d, "DV": d} for d in (64, 128, 256)], timeout=3600))


@pytest.mark.parametrize("cc", ARCHS)
def test_fused_dkdv_walk_configs_fit(ci_builds, cc):
    """Every configuration of the fused dk/dv walk the launcher can pick fits; bf16 at K = V = 128 uses it on every
    target (fp16 and fp32, whose G operand is fp32, may fall back to the two walks where shared memory is small). At
    K = V = 64 the 16-bit builds on sm_90 move their tiles by descriptors, as the plan runs them by default (sm_120's
    shared memory holds no such configuration: it keeps the two walks)."""
    builds = [r for r in ci_builds if r["kernel"] == "dkdv" and r["cc"] == cc]
    assert any(r["dtype"] == "bf16" for r in builds)
    descriptors = {(r["dtype"], r["DK"]) for r in builds if r["tma"]}
    assert descriptors == ({("bf16", 64), ("fp16", 64)} if cc == 90 else set()), descriptors
    check(builds)


@pytest.mark.parametrize("cc", (80, 90))
def test_inter_only_chunks_of_256_fit(ci_builds, cc):
    """The hybrid attention's default chunk of 256 tokens in the inter-only walk fits where the launcher uses it;
    under ~100 KB of shared memory (sm_86/89/120) the launcher sends it to the PyTorch path instead."""
    check([r for r in ci_builds if r["kernel"] == "walk" and r["cc"] == cc and r["flags"] == INTER_ONLY_256])


def test_inter_only_fit_rule():
    from lightning_attention.ops.lightning.device import SHARED_PER_BLOCK as SHARED_LIMITS
    from lightning_attention.ops.lightning.kernels.configs import inter_only_fits

    for cc in (80, 90):
        assert (inter_only_fits(256, 128, 128, 2, SHARED_LIMITS[cc])
                and inter_only_fits(256, 128, 16, 2, SHARED_LIMITS[cc]))
    # V = 129 pads to 256: the dq and dk walks (DK = 256) do not fit chunk tiles of 256 tokens (PyTorch path)
    assert not inter_only_fits(256, 128, 129, 2, SHARED_LIMITS[90])
    assert not inter_only_fits(256, 128, 128, 2, SHARED_LIMITS[120])
    assert inter_only_fits(64, 128, 128, 2, SHARED_LIMITS[120])


def test_inter_only_mode_runs_one_configuration():
    """The inter-only mode is not autotuned (autotuning it faulted on an H100, see configs._FIXED_BT_CONFIG): one
    configuration, passed explicitly, in the shape class that was right on an H100: tiles of >= 128 tokens, at least
    32 wide in K and V (a 16-wide head dim is a masked half tile), 8 warps."""
    from lightning_attention.ops.lightning import run
    from lightning_attention.ops.lightning.device import H100
    from lightning_attention.ops.lightning.kernels.configs import inter_only_block_k, inter_only_config, inter_only_tile
    from tests.ops.test_plan import problem

    (walk,) = run.forward_program(problem(B=2, T=4096, inter_chunk=64, device=H100, segment_len=0)).launches
    assert not hasattr(walk.launcher.kernel, "configs")  # the plain kernel, its configuration passed explicitly
    assert (walk.constexprs["BT"], walk.constexprs["num_warps"]) == (128, 8)
    cases = (  # (chunk size, DK, DV) -> (BT, BV, num_warps, num_stages)
        ((64, 128, 16), (128, 32, 8, 1)),
        ((64, 16, 128), (128, 32, 8, 1)),
        ((256, 128, 16), (256, 32, 8, 1)),
        ((32, 128, 32), (128, 32, 8, 1)),
        ((64, 128, 128), (128, 32, 8, 1)),
        ((128, 128, 129), (128, 32, 8, 1)),
        ((256, 128, 128), (256, 32, 8, 1)),
    )
    for (chunk, dk, dv), expected in cases:
        cfg = inter_only_config(inter_only_tile(chunk), dk, dv)
        got = (cfg.kwargs["BT"], cfg.kwargs["BV"], cfg.num_warps, cfg.num_stages)
        assert got == expected, (chunk, dk, dv)
        assert cfg.kwargs["BK"] == inter_only_block_k(dk) == max(32, dk)


def test_walk_tiles_are_at_least_64_wide_where_they_fit():
    """Tiles narrower than 64 faulted or computed wrong values on an H100 (configs.WALK_MIN_TILE): on sm_90 no
    selection has one, for any head dims, 16-bit or fp32 inputs (whose operand halves take more shared memory), with
    or without descriptors; elsewhere one appears only where nothing wider fits, and with 8 warps."""
    from lightning_attention.ops.lightning.device import SHARED_PER_BLOCK
    from lightning_attention.ops.lightning.kernels.configs import WALK_MIN_TILE, walk_candidates, walk_tile

    dims = ((128, 16), (16, 128), (16, 16), (64, 32), (32, 64), (32, 32), (128, 32), (48, 40), (256, 256), (256, 32))
    loads = ((2, False), (4, False), (4, True))  # (bytes per input element, descriptors)
    for cc, limit in SHARED_PER_BLOCK.items():
        for (dk, dv), (elem_bytes, tma), state_only in itertools.product(dims, loads, (False, True)):
            assert walk_tile(dk) >= WALK_MIN_TILE
            cfgs = walk_candidates(dk, dv, elem_bytes, limit, state_only=state_only, tma=tma, state_bytes=4)
            narrow = [c for c in cfgs if c.kwargs["BV"] < WALK_MIN_TILE]
            label = (cc, dk, dv, elem_bytes, tma, state_only, cfgs)
            assert cfgs and all(c.num_warps == 8 for c in narrow), label
            if cc == 90:
                assert not narrow, label
    wide = walk_candidates(128, 128, 2, SHARED_PER_BLOCK[90], state_only=False, tma=False, state_bytes=4)
    assert any(c.num_warps == 4 for c in wide)  # the mainstream configurations keep their 4 warps


def _shapes(cfgs):
    return [(c.kwargs["BT"], c.kwargs["BV"], c.num_warps, c.num_stages) for c in cfgs]


def test_narrow_tile_admitted_only_with_descriptors_where_it_fits():
    """configs.TMA_NARROW_TILES: the 32-wide 4-warp tile at K = 256 only with descriptors, and only where its shared
    memory fits (bf16 inputs; fp16's state operand is fp32 and takes 16 KB more than the 227 KB an H100 block has)."""
    from lightning_attention.ops.lightning.device import SHARED_PER_BLOCK
    from lightning_attention.ops.lightning.kernels.configs import TMA_NARROW_TILES, walk_candidates

    def shapes(tma, state_bytes=4):
        return _shapes(walk_candidates(256, 256, 2, SHARED_PER_BLOCK[90], state_only=False, tma=tma,
                                       state_bytes=state_bytes))  # fmt: skip

    narrow = TMA_NARROW_TILES[256][0]
    assert shapes(tma=True, state_bytes=2)[0] == narrow
    assert narrow not in shapes(tma=True, state_bytes=4)  # fp16 / fp32 state operand: does not fit
    assert narrow not in shapes(tma=False)  # through pointers this tile faulted on an H100


def test_pinned_configuration_goes_through_the_selector():
    """A pin replaces the space but is clamped and checked like a tuned configuration: BV clamped to the value tile,
    a narrow tile re-warped to 8 warps (the rule it would otherwise break), the pre-pass pinned too."""
    from lightning_attention.ops.lightning.device import SHARED_PER_BLOCK
    from lightning_attention.ops.lightning.kernels.configs import walk_candidates

    def pinned(pin, dv=40, **kw):
        return _shapes(walk_candidates(128, dv, 2, SHARED_PER_BLOCK[90], tma=True, state_bytes=2, pin=pin, **kw))

    assert pinned((64, 128, 4, 4), state_only=False) == [(64, 64, 4, 4)]  # V = 40: one 64-wide tile
    assert pinned((64, 128, 4, 4), state_only=True) == [(64, 64, 4, 4)]
    assert pinned((64, 32, 4, 1), dv=128, state_only=False) == [(64, 32, 8, 1)]


def test_head_dim_preferences_come_first_where_they_fit():
    """configs.PREFERRED_BY_BK (PREFERRED_BY_BK_TMA with tensor descriptors) leads the main walk's candidates on sm_90
    (measured and checked there), narrow heads take the preferences of their 64-wide tile, and the pre-pass keeps its
    own space, without preference."""
    from lightning_attention.ops.lightning.device import SHARED_PER_BLOCK
    from lightning_attention.ops.lightning.kernels.configs import (
        _STATE_SPACE,
        PREFERRED_BY_BK,
        PREFERRED_BY_BK_TMA,
        walk_candidates,
    )

    limit = SHARED_PER_BLOCK[90]
    for tma, table in ((False, PREFERRED_BY_BK), (True, PREFERRED_BY_BK_TMA)):
        for bk, preferred in table.items():  # bf16 inputs: the state is the inter product's bf16 operand
            got = _shapes(walk_candidates(bk, bk, 2, limit, state_only=False, tma=tma, state_bytes=2))
            assert got == list(preferred), (bk, tma, got)
    assert _shapes(walk_candidates(32, 48, 2, limit, state_only=False, tma=False, state_bytes=4)) == list(
        PREFERRED_BY_BK[64]
    )
    # no limit known (the interpreter): the order alone decides
    assert _shapes(walk_candidates(64, 64, 2, None, state_only=False, tma=False, state_bytes=2)) == list(
        PREFERRED_BY_BK[64]
    )
    # the pre-pass's space in its order, the 32-wide tile (descriptors only) left out, BV clamped to the 64-wide tile
    assert _STATE_SPACE[:3] == ((64, 32, 4, 3), (64, 128, 8, 3), (64, 64, 4, 3))
    assert _shapes(walk_candidates(64, 64, 2, None, state_only=True, tma=False, state_bytes=2)) == [
        (64, 64, 8, 3), (64, 64, 4, 3)
    ]
