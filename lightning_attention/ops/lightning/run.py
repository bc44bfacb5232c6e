"""The pass order of the chunk forward and backward: a problem's launches, built once into a program and run per call.

Every pass is one run of the chunk walk (:mod:`~lightning_attention.ops.lightning.kernels.walk`), which keeps the
[K, BV] fp32 state of one (segment, head, V tile) on chip while it walks the segment's chunks:

- forward: ``o`` (and the final state) in one walk over q, k, v;
- backward: ``dq`` = the forward walk of (do, v, k) from h0ᵀ; ``dv``, ``dk`` = reverse walks of (k, q, do) and
  (v, do, q) through the reverse-time state G_t = λ G_{t+1} + scale·q_tᵀ do_t (G_{T-1} includes dht), or both
  from one fused reverse walk; ``dh0`` = λ·G_0. Derivation, FLOP and byte counts: docs/kernels.md, "The chunk walk".

When the plan cuts sequences into segments (:func:`~lightning_attention.ops.lightning.plan.plan_segments`), a pass
is three launches: the pre-pass computes every segment's local state from (k, v) in parallel, a short decayed scan
turns them into incoming states, and the walk then runs all segments in parallel. The forward's segment states
([segments, H, K, V] fp32, within 25% of one input) are returned for the backward's dq walk, whose incoming states
are their transposes; the reverse-time ones live for their pass only, their local states written by the dq walk itself
at head dims up to 64 (``plan.dq_reverse_states``: no pre-pass, the scan alone). Nothing per chunk is ever written to
memory.

:func:`forward_program` and :func:`backward_program` build a problem's launches once (cached per problem);
:func:`chunk_forward` and :func:`chunk_backward` run them on a call's tensors. A problem's first call compiles all of
its kernels at once, a forward that will be differentiated its backward's too
(:mod:`~lightning_attention.ops.lightning.compile_ahead`).
"""

import functools

import torch

from lightning_attention import settings
from lightning_attention.ops.lightning.compile_ahead import compile_together
from lightning_attention.ops.lightning.device import device_info
from lightning_attention.ops.lightning.launches import (
    ReverseStates,
    dkdv_launch,
    forget_autotuned,
    scan_local_states,
    segmented_states,
    walk_launch,
)
from lightning_attention.ops.lightning.naive import compute_dtype
from lightning_attention.ops.lightning.plan import (
    ChunkProblem,
    TensorSpec,
    dq_reverse_states,
    plan_segments,
    use_fused_dkdv,
)
from lightning_attention.ops.lightning.program import Program, ProgramBuilder

# The programs' inputs, in this order (the builder names them: the launch builders find cu_seqlens and the shared
# segment tables by name).
_FORWARD_INPUTS = ("q", "k", "v", "slope", "h0", "cu_seqlens")
_BACKWARD_INPUTS = ("q", "k", "v", "do", "dht", "slope", "h0", "cu_seqlens", "fwd_states")


def _builder(p: ChunkProblem, names: tuple[str, ...]) -> tuple[ProgramBuilder, dict]:
    """A builder whose inputs are ``names``, each with its spec from the problem (None where absent)."""
    B, T, H, K, V = p.shape
    specs = {
        "q": p.q, "k": p.k, "v": p.v, "do": p.do, "dht": p.dht, "h0": p.h0, "fwd_states": p.fwd_states,
        "slope": TensorSpec((H,), (1,), torch.float32) if p.has_slope else None,
        "cu_seqlens": TensorSpec((p.num_seqs + 1,), (1,), torch.int32) if p.varlen else None,
    }  # fmt: skip
    b = ProgramBuilder()
    b.refs = {name: b.input(specs[name]) for name in names}
    return b, b.refs


@functools.lru_cache(maxsize=512)
def forward_program(p: ChunkProblem) -> Program:
    """The forward's launches: (q, k, v, slope, h0, cu_seqlens) -> (o [B, T, H, V], final state [N, H, K, V] or
    None, segment states [NSEG, H, K, V] or None). T > 0."""
    B, T, H, K, V = p.shape
    N = p.num_seqs
    b, r = _builder(p, _FORWARD_INPUTS)
    q, k, v, slope, h0 = r["q"], r["k"], r["v"], r["slope"], r["h0"]
    o = b.alloc((B, T, H, V), p.dtype)
    ht = b.alloc((N, H, K, V), compute_dtype(p.dtype)) if p.final_state else None
    plan = plan_segments(p)
    states = None
    if plan.segmented:
        states = segmented_states(
            b, p, k, v, slope=slope, h0=h0, ht=ht, plan=plan, N=N, H=H, T=T, scale_upd=1.0, reverse=False
        )
    walk_launch(
        b, p, q, k, v, o, slope=slope, h0=h0, ht=ht, states=states, plan=plan, T=T, H=H, scale_intra=p.scale,
        scale_inter=p.scale, scale_upd=1.0, reverse=False, state_only=False, inter_chunk=p.inter_chunk,
    )  # fmt: skip
    return b.finish((o, ht, states))


@functools.lru_cache(maxsize=512)
def backward_program(p: ChunkProblem) -> Program:
    """The backward's launches: (q, k, v, do, dht, slope, h0, cu_seqlens, fwd_states) -> (dq, dk, dv in the input
    dtype, dh0 [N, H, K, V] or None). T > 0. With the forward's segment states the dq walk skips its pre-pass and
    scan (its incoming states Sᵀ are their transposes)."""
    B, T, H, K, V = p.shape
    N = p.num_seqs
    b, r = _builder(p, _BACKWARD_INPUTS)
    q, k, v, do, dht, slope, h0 = r["q"], r["k"], r["v"], r["do"], r["dht"], r["slope"], r["h0"]
    scale, inter_chunk = p.scale, p.inter_chunk
    dq = b.alloc((B, T, H, K), p.dtype)
    dk = b.alloc((B, T, H, K), p.dtype)
    dv = b.alloc((B, T, H, V), p.dtype)
    dh0 = b.alloc((N, H, K, V), compute_dtype(p.dtype)) if p.final_state else None
    plan = plan_segments(p)
    h0t = None if h0 is None else h0.transposed()

    # dq_t = scale · do_t S_tᵀ: the forward walk of (do, v, k) with state Sᵀ [V, K] from h0ᵀ
    states = None
    fwd_states = r["fwd_states"]
    if plan.segmented and fwd_states is not None and fwd_states.shape[0] == plan.total:
        states = fwd_states.transposed()
    elif plan.segmented:
        states = segmented_states(
            b, p, v, k, slope=slope, h0=h0t, ht=None, plan=plan, N=N, H=H, T=T, scale_upd=1.0, reverse=False
        )
    # reverse time: G_t = λ G_{t+1} + scale · q_tᵀ do_t, G_{T-1} = dht + scale · q_{T-1}ᵀ do_{T-1}
    # dv_t = k_t G_t (walk of (k, q, do)); dk_t = v_t G_tᵀ (walk of (v, do, q) with Gᵀ); dh0 = λ G_0.
    # Segmented, the local states of G come from the dq walk, which reads do already (plan.dq_reverse_states), or
    # from a pre-pass over (q, do)
    g_states = g_states_t = rev = None
    if plan.segmented and dq_reverse_states(p, plan):
        g_states = b.alloc((plan.total, H, K, V), compute_dtype(p.dtype))
        rev = ReverseStates(q, g_states.transposed(), scale, every_segment=dh0 is not None)
    walk_launch(
        b, p, do, v, k, dq, slope=slope, h0=h0t, ht=None, states=states, plan=plan, T=T, H=H,
        scale_intra=scale, scale_inter=scale, scale_upd=1.0, reverse=False, state_only=False, inter_chunk=inter_chunk,
        reverse_states=rev,
    )  # fmt: skip

    dht_t = None if dht is None else dht.transposed()
    if rev is not None:
        scan_local_states(b, g_states, slope=slope, h0=dht, ht=dh0, plan=plan, N=N, H=H, T=T, reverse=True)
    elif plan.segmented:
        g_states = segmented_states(
            b, p, q, do, slope=slope, h0=dht, ht=dh0, plan=plan, N=N, H=H, T=T, scale_upd=scale, reverse=True
        )
    if g_states is not None:
        g_states_t = g_states.transposed()
    if use_fused_dkdv(p, K, V, plan):
        dkdv_launch(
            b, p, q, k, v, do, dk, dv, slope=slope, dht=dht, dh0=dh0, g_states=g_states, plan=plan, T=T, H=H,
            scale=scale, inter_chunk=inter_chunk,
        )  # fmt: skip
    else:
        walk_launch(
            b, p, k, q, do, dv, slope=slope, h0=dht, ht=dh0, states=g_states, plan=plan, T=T, H=H,
            scale_intra=scale, scale_inter=1.0, scale_upd=scale, reverse=True, state_only=False,
            inter_chunk=inter_chunk,
        )  # fmt: skip
        walk_launch(
            b, p, v, do, q, dk, slope=slope, h0=dht_t, ht=None, states=g_states_t, plan=plan, T=T, H=H,
            scale_intra=scale, scale_inter=1.0, scale_upd=scale, reverse=True, state_only=False,
            inter_chunk=inter_chunk,
        )  # fmt: skip
    return b.finish((dq, dk, dv, dh0))


def _spec(x: torch.Tensor | None) -> tuple | None:
    """What a program depends on of a tensor, as a plain tuple (cheap to build, hash and compare on every call)."""
    return None if x is None else (x.shape, x.stride(), x.dtype, not x.data_ptr() & 15)


def _key(q, k, v, slope, h0, cu_seqlens, cu_seqlens_cpu, scale, final_state, inter_chunk, do=None, dht=None,
         fwd_states=None) -> tuple:  # fmt: skip
    """A call's program key: everything its :class:`ChunkProblem` holds, as one tuple. The settings object and the
    device index stand for themselves (the same objects call after call: compared by identity first)."""
    return (
        _spec(q), _spec(k), _spec(v), None if cu_seqlens is None else cu_seqlens.shape[0] - 1,
        None if cu_seqlens_cpu is None else tuple(cu_seqlens_cpu.tolist()), slope is not None, _spec(h0),
        final_state, scale, inter_chunk, q.get_device(), settings.current(), _spec(do), _spec(dht), _spec(fwd_states),
    )  # fmt: skip


def _expected_backward_key(forward_key: tuple, states: TensorSpec | None) -> tuple:
    """The program key of the backward that follows a forward of ``forward_key`` when the autograd Function runs the
    chunk backward in the input dtype: the same inputs, dh0 wanted where h0 was given, ``do`` contiguous like ``o``,
    ``dht`` a contiguous float32 state where the forward returned the final state (its gradient comes as None, and the
    guess misses, when the loss does not use it), and the forward's segment states ``states`` for fixed-length
    batches."""
    q, k, v, num_seqs, offsets, has_slope, h0, final_state, scale, inter_chunk, index, config, *_ = forward_key

    def contiguous(spec: TensorSpec) -> tuple:
        return spec.shape, spec.strides, spec.dtype, True

    B, T, H, K = q[0]
    V = v[0][-1]
    N = B if num_seqs is None else num_seqs
    do = contiguous(TensorSpec.contiguous((B, T, H, V), q[2]))
    dht = contiguous(TensorSpec.contiguous((N, H, K, V), torch.float32)) if final_state else None
    fwd_states = None if states is None or num_seqs is not None else contiguous(states)
    return (q, k, v, num_seqs, offsets, has_slope, h0, h0 is not None, scale, inter_chunk, index, config, do, dht,
            fwd_states)  # fmt: skip


def _problem(key: tuple) -> ChunkProblem:
    """The :class:`ChunkProblem` of a program key (:func:`_key`)."""
    q, k, v, num_seqs, offsets, has_slope, h0, final_state, scale, inter_chunk, index, config, do, dht, states = key

    def spec(s):
        return None if s is None else TensorSpec(tuple(s[0]), s[1], s[2], s[3])

    return ChunkProblem(
        q=spec(q), k=spec(k), v=spec(v), num_seqs=q[0][0] if num_seqs is None else num_seqs,
        varlen=num_seqs is not None, offsets=offsets, has_slope=has_slope, h0=spec(h0), final_state=final_state,
        scale=float(scale), inter_chunk=inter_chunk,
        device=device_info(torch.device("cuda", index) if index >= 0 else torch.device("cpu")), settings=config,
        do=spec(do), dht=spec(dht), fwd_states=spec(states),
    )  # fmt: skip


def problem_of(*args, **kwargs) -> ChunkProblem:
    """The :class:`ChunkProblem` of a call on these tensors (the arguments of :func:`_key`)."""
    return _problem(_key(*args, **kwargs))


@functools.lru_cache(maxsize=512)
def _forward_program(key: tuple) -> Program:
    return forward_program(_problem(key))


@functools.lru_cache(maxsize=512)
def _backward_program(key: tuple) -> Program:
    return backward_program(_problem(key))


# bumped by clear_programs: a PreparedBackward kept from before no longer matches (its program was planned by what
# the clearing replaced)
_generation = 0


def _run(program: Program, *inputs) -> tuple:
    """``program(*inputs)``, its kernels compiled together first when no forward has had them compiled (``inputs[0]``
    is q: the device)."""
    if not program.compiled_ahead:
        compile_together([program], inputs[0].device)
    return program(*inputs)


class PreparedBackward:
    """The chunk backward a forward expects to follow it (:func:`_expected_backward_key`): its program and the specs
    of ``do`` and ``dht`` it was built for. The autograd Function's backward runs it directly when its gradients have
    those specs, the settings are still the forward's and no :func:`clear_programs` came between, instead of planning
    the call again on the engine's thread (docs/kernels.md, "Host overhead")."""

    __slots__ = ("config", "dht", "do", "generation", "program")

    def __init__(self, key: tuple):
        self.program = _backward_program(key)
        self.config, self.do, self.dht = key[11], key[12], key[13]
        self.generation = _generation

    def matches(self, do: torch.Tensor, dht: torch.Tensor | None) -> bool:
        """Whether the program was built for these gradients (and the settings and programs in force)."""
        return (
            settings.current() is self.config and self.generation == _generation and _spec(do) == self.do
            and _spec(dht) == self.dht
        )  # fmt: skip

    def __call__(self, q, k, v, do, dht, slope, h0, cu_seqlens, fwd_states):
        """(dq, dk, dv, dh0 or None), as :func:`chunk_backward` returns them for the same call (when
        :meth:`matches`)."""
        return _run(self.program, q, k, v, do, dht, slope, h0, cu_seqlens, fwd_states)


@functools.lru_cache(maxsize=512)
def _prepared_backward(key: tuple) -> PreparedBackward:
    return PreparedBackward(_expected_backward_key(key, _forward_program(key).output_spec(2)))


def chunk_forward(q, k, v, slope, h0, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, inter_chunk=0,
                  prepare_backward=False):  # fmt: skip
    """(o [B, T, H, V] in q.dtype, final state [N, H, K, V] or None, segment states or None). Inputs validated.

    The segment states ([NSEG, H, K, V] fp32, the incoming state of every segment; None unless the plan is
    segmented) are what the backward's dq walk needs as its own incoming states, transposed. ``inter_chunk`` > 0:
    o without its intra-chunk term, chunks of that many tokens from each sequence start. ``prepare_backward``: the
    chunk backward of this call will follow (in the input dtype, given the segment states): its first call compiles
    the backward's kernels with the forward's."""
    return chunk_forward_prepared(
        q, k, v, slope, h0, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, inter_chunk, prepare_backward
    )[:3]


def chunk_forward_prepared(q, k, v, slope, h0, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, inter_chunk=0,
                           prepare_backward=False):  # fmt: skip
    """:func:`chunk_forward`'s outputs and, with ``prepare_backward``, the :class:`PreparedBackward` of the chunk
    backward expected to follow (None without it, or when there is no token)."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    if T == 0 or B * H == 0:  # no token: the final state is h0
        N = B if cu_seqlens is None else cu_seqlens.numel() - 1
        sdt = compute_dtype(q.dtype)
        o = q.new_empty(B, T, H, V)
        ht = None
        if output_final_state:
            ht = h0.to(sdt, copy=True) if h0 is not None else q.new_zeros(N, H, K, V, dtype=sdt)
        return o, ht, None, None
    key = _key(q, k, v, slope, h0, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, inter_chunk)
    program = _forward_program(key)
    prepared = _prepared_backward(key) if prepare_backward else None
    if not program.compiled_ahead:
        compile_together([program] if prepared is None else [program, prepared.program], q.device)
    return (*program(q, k, v, slope, h0, cu_seqlens), prepared)


def chunk_backward(
    q, k, v, do, dht, slope, h0, cu_seqlens, cu_seqlens_cpu, scale, need_dh0, inter_chunk=0, fwd_states=None
):
    """(dq, dk, dv, dh0) of the loss whose gradients w.r.t. o and the final state are ``do`` and ``dht`` (or None).

    dq, dk, dv in the input dtype; dh0 [N, H, K, V] fp32 (None unless ``need_dh0``). ``fwd_states``: the forward's
    segment states of the same call ([NSEG, H, K, V], from :func:`chunk_forward`) or None."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    if T == 0 or B * H == 0:  # no token: the final state is h0, so dh0 = dht
        N = B if cu_seqlens is None else cu_seqlens.numel() - 1
        sdt = compute_dtype(q.dtype)
        dh0 = None
        if need_dh0:
            dh0 = dht.to(sdt, copy=True) if dht is not None else q.new_zeros(N, H, K, V, dtype=sdt)
        return q.new_empty(q.shape), q.new_empty(q.shape), v.new_empty(v.shape), dh0
    key = _key(q, k, v, slope, h0, cu_seqlens, cu_seqlens_cpu, scale, need_dh0, inter_chunk, do, dht, fwd_states)
    return _run(_backward_program(key), q, k, v, do, dht, slope, h0, cu_seqlens, fwd_states)


def clear_programs() -> None:
    """Forgets every cached program, and the autotuned launches they planned (tests that replace a planning function,
    ``benchmarks/tune_table.py`` between its pinned candidates); a backward prepared before runs as planned anew."""
    global _generation
    _generation += 1
    for cached in (forward_program, backward_program, _forward_program, _backward_program, _prepared_backward):
        cached.cache_clear()
    forget_autotuned()
