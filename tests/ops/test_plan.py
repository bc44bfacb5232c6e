"""The chunk plan as a value: its rules, and the launch programs it gives, without tensors or a GPU.

A problem names an H100 (``device.H100``) where the rules were measured, so these tests check what a GPU run would
launch — segments, pre-pass pieces, kernel variants, grids and every launch's constexprs — on any machine.
"""

import inspect

import pytest
import torch

from lightning_attention import settings
from lightning_attention.ops.lightning import plan, run
from lightning_attention.ops.lightning.device import H100, INTERPRETER, DeviceInfo
from lightning_attention.ops.lightning.kernels import walk_ws
from lightning_attention.ops.lightning.plan import ChunkProblem, TensorSpec


def problem(B=8, T=8192, H=16, K=128, V=128, dtype=torch.bfloat16, device=H100, *, varlen=False, offsets=None,
            final_state=False, h0=False, inter_chunk=0, backward=False, fwd_states=None,
            **changes) -> ChunkProblem:  # fmt: skip
    """The problem of a call on contiguous [B, T, H, K] tensors (a backward one with ``backward``); ``varlen``
    without ``offsets``: three packed sequences whose offsets stay on the device."""
    qk = TensorSpec.contiguous((B, T, H, K), dtype)
    vv = TensorSpec.contiguous((B, T, H, V), dtype)
    N = B if not (varlen or offsets) else 3 if offsets is None else len(offsets) - 1
    state = TensorSpec.contiguous((N, H, K, V), torch.float32)
    return ChunkProblem(
        q=qk, k=qk, v=vv, num_seqs=N, varlen=varlen or offsets is not None, offsets=offsets, has_slope=True,
        h0=state if h0 else None, final_state=final_state, scale=1.0, inter_chunk=inter_chunk, device=device,
        settings=settings.Settings(**changes), do=vv if backward else None,
        dht=state if backward and final_state else None,
        fwd_states=None if fwd_states is None else TensorSpec.contiguous((fwd_states, H, K, V), torch.float32),
    )  # fmt: skip


def kernels_of(program) -> list[str]:
    return [launch.launcher.name for launch in program.launches]


# the rules


@pytest.mark.parametrize(
    "length, programs, expected",
    [
        (2048, 1024, 0),  # grid (a) at 2K: 1024 programs already fill 264 slots
        (8192, 256, 0),  # one round of 256 programs either way: the pre-pass would only add work
        (16384, 128, 8192),  # 128 programs -> 256 programs of 8K
        (32768, 64, 8192),  # 64 -> 256
        (131072, 32, 16384),  # batch 1, 16 heads: 32 -> 256
        (1 << 20, 32, 131072),
        (4096, 32, 1024),  # short sequences: segments no shorter than the workspace bound
    ],
)
def test_segment_length_rule(length, programs, expected):
    """The segment plan on a 132-SM GPU (2 walk programs per SM), segments of at least 1,024 tokens (bf16, V = 128)."""
    assert plan.best_segment_len(length, programs, slots=264, min_len=1024) == expected


@pytest.mark.parametrize(
    "length, programs, expected",
    [
        (16384, 128, 0),  # B = 4: 128 programs fit 132 SMs at one program each: whole sequences, no pre-pass
        (32768, 64, 16384),  # B = 2: 2 segments of 16K (4 of 8K would run in 2 rounds: no faster, 3/4 pre-pass)
        (65536, 32, 16384),  # B = 1: 4 of 16K
        (8192, 256, 0),
        (65536, 128, 0),  # K = 256, bf16, B = 1: 16 heads x 8 value tiles of 32 fill 132 SMs in one round
    ],
)
def test_segment_length_rule_at_one_program_per_sm(length, programs, expected):
    """The plan on an H100 with the K = 128 walk's three-stage configuration (one program per SM, 132 slots): whole
    16K sequences ran faster than two segments each (docs/kernels.md, "The segment plan")."""
    assert plan.best_segment_len(length, programs, slots=132, min_len=1024) == expected


@pytest.mark.parametrize(
    "dims, programs, expected",
    [
        ((64, 64), 128, True),  # K = V = 64, 8 × 8K, 16 heads on 132 SMs: whole (256 segments ran 19% slower)
        ((64, 64), 64, False),  # 4 × 16K: 64 programs leave SMs idle, segments as the model says
        ((32, 64), 200, True),
        ((128, 128), 256, False),  # K = 128 is left to the model (not bound by bandwidth at one program per SM)
        ((64, 128), 1000, False),
    ],
)
def test_bandwidth_bound_walks_that_fill_every_sm_stay_whole(dims, programs, expected):
    assert plan.fills_every_sm_once(*dims, programs, sms=132) == expected


def test_waves_key_tells_grids_that_fit_one_program_per_sm():
    """The walk autotuner's WAVES key: 1 for a grid that fits a 132-SM GPU at one program per SM, 2 for a larger
    one; 1 on the interpreter."""
    p = problem()
    assert (plan.waves(p, 128), plan.waves(p, 132), plan.waves(p, 133)) == (1, 1, 2)
    assert plan.waves(problem(device=INTERPRETER), 10_000) == 1


def test_auto_backward_picks_recompute_below_128kb_of_shared_memory():
    """backward="auto": the recompute backward on GPUs with < 128 KB of shared memory per block (sm_86/89/120),
    the chunk backward on sm_80/sm_90 and on the interpreter; explicit choices are obeyed."""
    for cc, expected in ((86, True), (89, True), (120, True), (80, False), (90, False)):
        assert plan.use_recompute_backward("auto", DeviceInfo.of_capability(cc, sm_count=100)) is expected
    assert plan.use_recompute_backward("auto", INTERPRETER) is False
    assert plan.use_recompute_backward("recompute", INTERPRETER) is True
    assert plan.use_recompute_backward("chunk", DeviceInfo.of_capability(86, sm_count=100)) is False


def test_fused_dkdv_walk_by_default_at_k64_with_descriptors():
    """By default (``fused_dkdv`` None) dk and dv come from a fused walk where it was measured faster: 16-bit
    inputs, K = V = 64, descriptors on an sm_90 GPU, and bf16 at K = V = 128 where the walks run the two-warpgroup
    kernel; other heads, float32, the split precision, the inter-only mode,
    GPUs whose shared memory holds no descriptor configuration and pointer loads keep the two walks. The setting forces
    either way."""
    def fused(**kwargs):
        p = problem(**{"B": 8, "T": 8192, "K": 64, "V": 64, **kwargs}, backward=True)
        return plan.use_fused_dkdv(p, p.q.shape[-1], p.v.shape[-1])

    assert fused() and fused(dtype=torch.float16) and fused(T=32768, B=2)
    assert not fused(K=64, V=128) and not fused(dtype=torch.float32)
    # K = 128: the two-warpgroup fused walk where the walks run the two-warpgroup kernel (bf16), else the two walks
    assert fused(K=128, V=128) is plan._walk_ws_available()
    assert not fused(K=128, V=128, dtype=torch.float16) and not fused(K=128, V=128, gluon=False)
    assert not fused(K=128, V=128, precision="split") and not fused(K=128, V=128, fused_dkdv=False)
    assert not fused(precision="split") and not fused(inter_chunk=128) and not fused(tma=False)
    for cc, expected in ((80, False), (90, True), (120, False)):  # descriptors from sm_90; sm_120's 99 KB hold none
        assert fused(device=DeviceInfo.of_capability(cc, sm_count=100)) is expected
    assert not fused(fused_dkdv=False)
    assert fused(K=128, V=128, fused_dkdv=True) and fused(device=DeviceInfo.of_capability(80, sm_count=100),
                                                          fused_dkdv=True)  # fmt: skip
    launches = kernels_of(run.backward_program(problem(B=8, T=8192, K=64, V=64, backward=True)))
    assert "lightning_attn dk/dv walk" in launches, launches


# the plans of the benchmark grids on an H100


def test_slots_count_the_candidate_that_holds_fewest_programs_per_sm():
    """The Triton walk at K = 128 with descriptors offers two stages (two programs per SM) and four (one): the plan
    counts one, so that a segmented grid runs in one round whichever the table or the autotuner launches; pinned to
    two stages, two. K = 64's candidates both hold two."""
    triton_walk = dict(gluon=False)  # bf16 K = 128 runs the two-warpgroup walk by default
    assert plan.walk_slots(problem(**triton_walk), 128, 128) == (H100.sm_count, 64)
    pinned = dict(triton_walk, kernel_config=settings.KernelPin(64, 64, 4, 2))
    assert plan.walk_slots(problem(**pinned), 128, 128) == (2 * H100.sm_count, 64)
    assert plan.walk_slots(problem(K=64, V=64), 64, 64) == (2 * H100.sm_count, 64)
    # counted at two per SM, 4 x 16K would be cut in two segments per sequence (256 programs and a pre-pass)
    assert not plan.plan_segments(problem(B=4, T=16384, **triton_walk)).segmented
    assert plan.plan_segments(problem(B=4, T=16384, **pinned)).segmented


@pytest.mark.parametrize(
    "B, T, segments, gluon",
    [
        (64, 1024, 0, True), (8, 8192, 0, True), (4, 16384, 8, True), (2, 32768, 8, True), (1, 65536, 8, True),
        (64, 1024, 0, False), (8, 8192, 0, False), (4, 16384, 0, False), (2, 32768, 4, False), (1, 65536, 4, False),
    ],
)  # fmt: skip
def test_grid_a_plans_at_k128(B, T, segments, gluon):
    """K = V = 128, bf16, 65,536 tokens per call: batches that fill the H100 run whole sequences, smaller ones are cut
    into segments (whose count the forward operator's fake reports, so it is the same function). The two-warpgroup
    walk runs one program per head (both value tiles) and per SM, so it cuts from 4 × 16K down, into 8 segments of
    8K; the Triton walk (the gluon setting off) from 2 × 32K, into 4."""
    p = problem(B=B, T=T, gluon=gluon)
    segment_plan = plan.plan_segments(p)
    assert (segment_plan.total if segment_plan.segmented else 0) == segments
    names = kernels_of(run.forward_program(p))
    if segments:  # the pre-pass (a state-only walk), the scan, the walk
        assert len(names) == 3 and "scan" in names[1] and "walk" in names[2]
        assert "walk" in names[0] or "pre-pass" in names[0]
    else:
        assert len(names) == 1 and "walk" in names[0]
    two_warpgroups = {"lightning_attn walk (two warpgroups)", "lightning_attn segment pre-pass (two warpgroups)"}
    ws = walk_ws.lightning_walk_ws_kernel is not None and walk_ws.triton_version_supported()
    assert bool(set(names) & two_warpgroups) == (gluon and ws)


@pytest.mark.parametrize("K", [128, 256])
def test_bf16_runs_the_two_warpgroup_walk_on_an_h100(K):
    """K = V = 128 or 256, bf16, sm_90: the walks and pre-passes of the forward and backward are the Gluon kernels
    wherever the grid fills the GPU (at K = 128 dk and dv from one of them, the fused walk), at K = 128 under the split
    precision too; off sm_90, with the gluon setting off, in fp16, with the split precision at K = 256, at K = 64 or
    with a grid under half the SMs, the Triton walk."""
    if walk_ws.lightning_walk_ws_kernel is None or not walk_ws.triton_version_supported():
        pytest.skip("this Triton has no Gluon the two-warpgroup walk was checked with")
    ws = "lightning_attn walk (two warpgroups)"
    p = problem(B=16, T=4096, K=K, V=K)
    assert set(kernels_of(run.forward_program(p))) == {ws}
    backward = kernels_of(run.backward_program(problem(B=16, T=4096, K=K, V=K, backward=True)))
    if K == 128:  # dq, then dk and dv from the two-warpgroup fused walk
        assert backward == [ws, "lightning_attn dk/dv walk (two warpgroups)"]
    else:  # dq, dv, dk
        assert backward == [ws] * 3
    split = kernels_of(run.forward_program(problem(B=16, T=4096, K=K, V=K, precision="split")))
    assert (ws in split) == (K in walk_ws.WS_SPLIT_KEY_DIMS) and walk_ws.WS_SPLIT_KEY_DIMS == (128,)
    for other in (dict(gluon=False), dict(device=DeviceInfo.of_capability(80, sm_count=108)),
                  dict(dtype=torch.float16), dict(B=1, T=1024)):  # fmt: skip
        assert ws not in kernels_of(run.forward_program(problem(**{"B": 16, "T": 4096, "K": K, "V": K, **other})))
    assert ws not in kernels_of(run.forward_program(problem(B=16, T=4096, K=64, V=64)))
    assert walk_ws.value_tile(K, 2 * K) == walk_ws.value_tile(K, K) and walk_ws.value_tile(K, 48) is None


def test_backward_reuses_the_forward_segment_states():
    """With the forward's segment states the backward's dq walk needs no pre-pass and scan of its own."""
    p = problem(B=1, T=65536, final_state=True, h0=True)
    segments = plan.plan_segments(p).total
    with_states = kernels_of(run.backward_program(problem(B=1, T=65536, final_state=True, h0=True, backward=True,
                                                           fwd_states=segments)))  # fmt: skip
    without = kernels_of(run.backward_program(problem(B=1, T=65536, final_state=True, h0=True, backward=True)))
    assert len(without) - len(with_states) == 2
    assert without.count("lightning_attn segment scan") == 2 and with_states.count("lightning_attn segment scan") == 1


def _reverse_prepasses(program) -> list:
    """The reverse pre-passes of a program: state-only Triton walks and two-warpgroup pre-passes run backwards."""
    return [
        launch for launch in program.launches if launch.constexprs.get("REVERSE")
        and (launch.constexprs.get("STATE_ONLY") or "pre-pass" in launch.launcher.name)
    ]  # fmt: skip


@pytest.mark.parametrize("final_state", [False, True])
def test_k64_dq_walk_computes_the_reverse_local_states(final_state):
    """K = V = 64, 4 × 16K in segments: the backward is the dq walk (which also writes G's local states, every
    segment's where dh0 is wanted, else all but each sequence's first), the scan, the fused dk/dv walk: no reverse
    pre-pass. fp32 inputs and K = 128 (the Triton walk or two warpgroups) keep it."""
    segments = plan.plan_segments(problem(B=4, T=16384, K=64, V=64)).total
    p = problem(B=4, T=16384, K=64, V=64, backward=True, final_state=final_state, h0=final_state,
                fwd_states=segments)  # fmt: skip
    program = run.backward_program(p)
    assert plan.dq_reverse_states(p, plan.plan_segments(p)) and segments > 4
    dq, scan, dkdv = program.launches
    assert dq.constexprs["REV_STATES"] and dq.constexprs["REV_ALL"] is final_state and not dq.constexprs["REVERSE"]
    assert "scan" in scan.launcher.name and scan.constexprs["REVERSE"] and "dk/dv" in dkdv.launcher.name
    assert not _reverse_prepasses(program)
    # segmented in each (the Triton walk at K = 128 from 2 × 32K): the reverse pre-pass stays
    for other in (dict(dtype=torch.float32), dict(K=128, V=128), dict(K=128, V=128, gluon=False)):
        q = problem(**{"B": 2, "T": 32768, "K": 64, "V": 64, "backward": True, **other})
        assert plan.plan_segments(q).segmented, other
        assert len(_reverse_prepasses(run.backward_program(q))) == 1, other
        assert not any(launch.constexprs.get("REV_STATES") for launch in run.backward_program(q).launches), other
    whole = problem(B=8, T=8192, K=64, V=64)  # fills the GPU unsegmented: nothing to compute
    assert not plan.dq_reverse_states(whole, plan.plan_segments(whole))


def test_settings_are_part_of_the_problem():
    """A setting changes the problem, hence the cached program: forcing segments adds the pre-pass and the scan."""
    whole = run.forward_program(problem(B=8, T=8192))
    forced = run.forward_program(problem(B=8, T=8192, segment_len=2048))
    assert len(forced.launches) == len(whole.launches) + 2
    assert run.forward_program(problem(B=8, T=8192)) is whole  # cached


def test_varlen_segments_come_from_host_offsets_only():
    """Packed sequences are cut into segments only from host offsets (cu_seqlens_cpu): the device offsets alone never
    cost a device->host copy."""
    device_only = plan.plan_segments(problem(B=1, T=65536, varlen=True, final_state=True))
    assert device_only.varlen == 1 and not device_only.segmented
    cut = plan.plan_segments(problem(B=1, T=65536, offsets=(0, 1000, 65536), final_state=True))
    assert cut.varlen == 2 and cut.segmented
    rows = [cut.seg_table[i : i + 4] for i in range(0, len(cut.seg_table), 4)]
    # (sequence, first token, end token, flags: 1 = first segment of its sequence, 2 = last)
    assert rows == [(0, 0, 1000, 3), (1, 1000, 17384, 1), (1, 17384, 33768, 0), (1, 33768, 50152, 0),
                    (1, 50152, 65536, 2)]  # fmt: skip
    assert cut.seq_segs == (0, 1, 5)
    empty = plan.plan_segments(problem(B=1, T=65536, offsets=(0, 0, 65536), segment_len=16384))
    assert empty.seg_table[:4] == (0, 0, 0, 3)  # a zero-length sequence keeps one empty segment


PROGRAMS = [
    ("h100-k128-whole", dict(B=8, T=8192, gluon=False)),
    ("h100-k128-segments-h0", dict(B=1, T=65536, final_state=True, h0=True, gluon=False)),
    ("h100-k64-segments", dict(B=1, T=65536, K=64, V=64)),
    ("h100-k256-gluon", dict(B=16, T=4096, K=256, V=256)),
    ("h100-k128-gluon-segments", dict(B=2, T=32768)),
    ("h100-k256-fp16", dict(B=2, T=4096, K=256, V=256, dtype=torch.float16)),
    ("h100-fp32", dict(B=2, T=4096, K=64, V=64, dtype=torch.float32)),
    ("h100-fused-dkdv", dict(B=2, T=32768, fused_dkdv=True)),
    ("h100-pinned", dict(B=2, T=32768, kernel_config=settings.KernelPin(64, 64, 8, 2))),
    ("h100-inter-only", dict(B=2, T=4096, inter_chunk=128)),
    ("h100-varlen-cut", dict(B=1, T=65536, offsets=(0, 1000, 65536))),
    ("interpreter", dict(B=2, T=256, K=32, V=48, device=INTERPRETER, segment_len=64, prepass_len=32)),
]


@pytest.mark.parametrize("name, kwargs", PROGRAMS, ids=[n for n, _ in PROGRAMS])
def test_every_launch_names_all_its_constexprs(name, kwargs):
    """The direct launcher takes a compiled kernel only when every argument after the positional ones is passed or
    chosen by the autotuner; a defaulted one sends every launch through Triton's slower path, which only shows on a
    GPU as lost speed (once: K = 64's fwd+bwd doubled). Every launch of the forward and backward programs, against
    every configuration its autotuner may choose, the Gluon kernels included (built for an H100, not launched)."""
    seen = 0
    for p in (problem(**kwargs), problem(**kwargs, backward=True)):
        program = (run.backward_program if p.do is not None else run.forward_program)(p)
        for launch in program.launches:
            launcher = launch.launcher
            jit = launcher.jit
            names = getattr(jit, "arg_names", None) or list(inspect.signature(jit).parameters)
            names = names[len(launch.consts) :]
            assert names, launcher.name
            for config in getattr(launcher.kernel, "configs", None) or [None]:  # an Autotuner's candidates
                given = {**launch.constexprs, **(config.kwargs if config is not None else {})}
                missing = [n for n in names if n not in given]
                assert not missing, (launcher.name, missing)
            seen += 1
    assert seen >= 2
