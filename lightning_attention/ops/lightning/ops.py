"""The Triton path's entry points: :func:`lightning_attention.lightning_attn`'s ``torch.library`` operators and
autograd, and the decode step (:func:`~lightning_attention.ops.lightning.decode_triton.decode_step_triton`,
re-exported).

Three operators (:mod:`~lightning_attention.ops.lightning.library`): ``chunk_fwd`` and ``chunk_bwd`` run the chunk
programs (:mod:`~lightning_attention.ops.lightning.run`), ``recompute_bwd`` the SRAM-bounded backward
(:mod:`~lightning_attention.ops.lightning.recompute`). :class:`LightningAttnFunction` is the autograd Function above
them; :func:`chunk_lightning_attn_triton` and :func:`lightning_attn_inter_triton` are what the public functions call
after validating their inputs.
"""

import torch
from torch.autograd.function import once_differentiable

from lightning_attention import settings
from lightning_attention.backend import plain_eager
from lightning_attention.ops.lightning import naive
from lightning_attention.ops.lightning.decay_grad import slope_gradient
from lightning_attention.ops.lightning.decode_triton import decode_step_triton  # noqa: F401  (an entry point)
from lightning_attention.ops.lightning.naive import compute_dtype
from lightning_attention.ops.lightning.device import device_info
from lightning_attention.ops.lightning.interpreter import check_interpreter_dtype
from lightning_attention.ops.lightning.library import last_dim_contiguous, on_device_of, triton_op
from lightning_attention.ops.lightning.offsets import offsets_for
from lightning_attention.ops.lightning.plan import (
    MAX_HEAD_DIM,
    ChunkProblem,
    TensorSpec,
    plan_segments,
    use_recompute_backward,
)
from lightning_attention.ops.lightning.recompute import recompute_backward
from lightning_attention.ops.lightning.run import chunk_backward, chunk_forward_prepared


def _num_seqs(q: torch.Tensor, cu_seqlens: torch.Tensor | None) -> int:
    return q.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1


def _slope32(slope: torch.Tensor | None) -> torch.Tensor | None:
    return None if slope is None else slope.to(torch.float32).contiguous()


def _nothing(q: torch.Tensor) -> torch.Tensor:
    """The empty [0] tensor an operator returns for an output it does not produce (``new_empty``: no fill)."""
    return q.new_empty(0, dtype=compute_dtype(q.dtype))


# The operators' schemas (torch.library's syntax). The forward and the two backwards take the same inputs and
# options: they are declared once here, so the three operators cannot drift apart. (A Python int is a SymInt in
# torch.library's schemas.)

_INPUTS = "Tensor q, Tensor k, Tensor v"
_OPTIONS = "Tensor? slope, Tensor? initial_state, Tensor? cu_seqlens, Tensor? cu_seqlens_cpu, float scale"
_FORWARD_SCHEMA = (
    f"({_INPUTS}, {_OPTIONS}, bool output_final_state, SymInt inter_chunk=0, bool save_states=True,"
    " bool prepare_backward=False) -> (Tensor, Tensor, Tensor)"
)
_BACKWARD_SCHEMA = (
    f"({_INPUTS}, Tensor do, Tensor? dht, {_OPTIONS}, SymInt inter_chunk=0, Tensor? fwd_states=None)"
    " -> (Tensor, Tensor, Tensor, Tensor)"
)


# chunk_fwd


def _segment_count(q, v, inter_chunk: int) -> int:
    """How many segment states the forward of a fixed-length batch of these shapes returns (0: not segmented):
    the plan of the shapes, asked without tensors (sizes may be symbolic under torch.compile: they specialise)."""
    B, T, H, K = (int(d) for d in q.shape)
    spec = TensorSpec((B, T, H, K), (T * H * K, H * K, K, 1), q.dtype)
    v_spec = TensorSpec((B, T, H, int(v.shape[-1])), (0, 0, 0, 1), q.dtype)
    problem = ChunkProblem(
        q=spec, k=spec, v=v_spec, num_seqs=B, varlen=False, offsets=None, has_slope=False, h0=None,
        final_state=False, scale=1.0, inter_chunk=inter_chunk, device=device_info(q.device),
        settings=settings.current(),
    )  # fmt: skip
    plan = plan_segments(problem)
    return plan.total if plan.segmented else 0


def _chunk_fwd_fake(
    q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, inter_chunk=0,
    save_states=True, prepare_backward=False,
):  # fmt: skip
    B, T, H, K = q.shape
    V = v.shape[-1]
    o = q.new_empty(B, T, H, V)
    sdt = compute_dtype(q.dtype)
    ht = q.new_empty((_num_seqs(q, cu_seqlens), H, K, V) if output_final_state else (0,), dtype=sdt)
    segments = _segment_count(q, v, inter_chunk) if save_states and cu_seqlens is None and T > 0 else 0
    return o, ht, q.new_empty((segments, H, K, V) if segments else (0,), dtype=sdt)


def _chunk_fwd(q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, inter_chunk,
               save_states, prepare_backward):  # fmt: skip
    """:func:`chunk_fwd`'s three outputs and, with ``prepare_backward`` and ``save_states``, the
    :class:`~lightning_attention.ops.lightning.run.PreparedBackward` of the chunk backward expected to follow."""
    check_interpreter_dtype(q)
    o, ht, states, prepared = chunk_forward_prepared(
        last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v), _slope32(slope), initial_state,
        cu_seqlens, cu_seqlens_cpu, scale, output_final_state, inter_chunk, prepare_backward and save_states,
    )  # fmt: skip
    if states is None or cu_seqlens is not None or not save_states:
        states = _nothing(q)
    return o, _nothing(q) if ht is None else ht, states, prepared


@triton_op("chunk_fwd", fake=_chunk_fwd_fake, schema=_FORWARD_SCHEMA)
def chunk_fwd(q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, inter_chunk=0,
              save_states=True, prepare_backward=False):  # fmt: skip
    """Forward operator: (o [B, T, H, V], final_state [N, H, K, V] or an empty [0] tensor if not requested, segment
    states [NSEG, H, K, V] for the backward or an empty [0] tensor).

    Segment states are returned for fixed-length batches only, and only with ``save_states`` (their count is a
    function of the shapes and the GPU, which the fake computes; a varlen plan depends on the offsets' values).
    ``inter_chunk`` > 0: the inter-only mode (o without its intra-chunk term, chunks of that many tokens).
    ``prepare_backward``: ``chunk_bwd`` follows in the input dtype (a first call compiles its kernels with these). On
    CPU tensors (Triton's interpreter) a dtype the interpreter cannot compute raises NotImplementedError
    (:mod:`~lightning_attention.ops.lightning.interpreter`)."""
    return _chunk_fwd(
        q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, inter_chunk,
        save_states, prepare_backward,
    )[:3]  # fmt: skip


# chunk_bwd and recompute_bwd (one schema: the autograd Function picks either). Both return (dq, dk, dv, dh0) of
# the loss whose gradients w.r.t. o and the final state are ``do`` and ``dht``; dh0 is [N, H, K, V] when
# ``initial_state`` is given, else an empty [0]. ``fwd_states``: the forward operator's segment states (its third
# output; empty or None: recomputed).


def _backward_fake(q, k, v, do, dht, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, inter_chunk=0,
                   fwd_states=None):  # fmt: skip
    """dq, dk like q; dv like v; dh0 ``[N, H, K, V]`` in the state dtype when there is an initial state, else an
    empty ``[0]``."""
    B, T, H, K = q.shape
    V = v.shape[-1]
    shape = (_num_seqs(q, cu_seqlens), H, K, V) if initial_state is not None else (0,)
    return (q.new_empty(B, T, H, K), q.new_empty(B, T, H, K), q.new_empty(B, T, H, V),
            q.new_empty(shape, dtype=compute_dtype(q.dtype)))  # fmt: skip


@triton_op("chunk_bwd", fake=_backward_fake, schema=_BACKWARD_SCHEMA)
def chunk_bwd(q, k, v, do, dht, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, inter_chunk=0,
              fwd_states=None):  # fmt: skip
    """The chunk backward (:func:`~lightning_attention.ops.lightning.run.chunk_backward`)."""
    dq, dk, dv, dh0 = chunk_backward(
        last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v), last_dim_contiguous(do), dht,
        _slope32(slope), initial_state, cu_seqlens, cu_seqlens_cpu, scale, initial_state is not None, inter_chunk,
        fwd_states if fwd_states is not None and fwd_states.numel() else None,
    )  # fmt: skip
    return dq, dk, dv, _nothing(q) if dh0 is None else dh0


@triton_op("recompute_bwd", fake=_backward_fake, schema=_BACKWARD_SCHEMA)
def recompute_bwd(q, k, v, do, dht, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, inter_chunk=0,
                  fwd_states=None):  # fmt: skip
    """The recompute backward (:func:`~lightning_attention.ops.lightning.recompute.recompute_backward`;
    ``inter_chunk`` must be 0 and ``fwd_states`` is not used: it recomputes everything). Its kernels read the
    offsets of ``cu_seqlens_cpu`` when given, like the forward (ops/lightning/offsets.py)."""
    del inter_chunk, fwd_states  # the grid depends only on N; nothing saved is needed
    dq, dk, dv, dh0 = recompute_backward(
        last_dim_contiguous(q), last_dim_contiguous(k), last_dim_contiguous(v), last_dim_contiguous(do), dht,
        slope, scale=scale, initial_state=initial_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
    )  # fmt: skip
    return dq, dk, dv, _nothing(q) if dh0 is None else dh0


# autograd


def _float32_backward(ctx, q: torch.Tensor) -> bool:
    """A learned slope on 16-bit inputs: the backward runs in float32 then. The slope's gradient weighs every token's
    q·dq - k·dk by its position, so the 16-bit walks' rounding, multiplied by the length, would swamp it
    (decay_grad.py)."""
    return ctx.needs_input_grad[3] and q.element_size() < 4


def _recompute(backward: str, inter_chunk: int, q: torch.Tensor) -> bool:
    """Whether the backward is the recompute one (never in the inter-only mode)."""
    return not inter_chunk and use_recompute_backward(backward, device_info(q.device))


def _chunk_backward_follows(ctx, q: torch.Tensor, backward: str, inter_chunk: int) -> bool:
    """Whether :meth:`LightningAttnFunction.backward` will run ``chunk_bwd`` in the input dtype: some input needs a
    gradient, the recompute backward is not picked, and no learned slope sends it to float32."""
    return any(ctx.needs_input_grad[:5]) and not _float32_backward(ctx, q) and not _recompute(backward, inter_chunk, q)


class LightningAttnFunction(torch.autograd.Function):
    """Autograd over the operators. Saves the inputs and, for segmented plans, the forward's segment states (<= 25%
    of one input): the backward recomputes everything else, walk by walk. The slope's gradient, when it is wanted,
    comes from the other gradients (:mod:`~lightning_attention.ops.lightning.decay_grad`).

    In plain eager mode the forward calls the operator's implementation directly and keeps the backward program it
    prepares (:class:`~lightning_attention.ops.lightning.run.PreparedBackward`): the backward runs it without
    planning the call again when its gradients are the expected ones. No autocast decorators: the Function's own
    torch ops (dtype conversions, the slope's float64 sums) are none that autocast changes, and the kernels compute in
    the dtype of q, k, v as given."""

    @staticmethod
    def forward(
        ctx, q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, backward, inter_chunk
    ):
        # the segment states (<= 25% of one input, empty unless segmented) spare the dq walk its pre-pass; not under
        # torch.compile, where the fake would have to plan segments from symbolic sizes (one graph per length)
        save_states = not torch.compiler.is_compiling()
        prepare = save_states and _chunk_backward_follows(ctx, q, backward, inter_chunk)
        args = (q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, scale, output_final_state, inter_chunk,
                save_states, prepare)  # fmt: skip
        ctx.prepared = None
        if prepare and plain_eager():
            with on_device_of(q):  # what the operator's eager call does, keeping the prepared backward
                o, ht, seg_states, ctx.prepared = _chunk_fwd(*args)
        else:
            o, ht, seg_states = chunk_fwd(*args)
        ctx.save_for_backward(q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, seg_states)
        ctx.scale = scale
        ctx.output_final_state = output_final_state
        ctx.backward_mode = backward
        ctx.inter_chunk = inter_chunk
        ctx.mark_non_differentiable(*([] if output_final_state else [ht]))
        # an unused output's gradient comes as None, not as zeros the engine would allocate and fill (host time)
        ctx.set_materialize_grads(False)
        return o, ht

    @staticmethod
    @once_differentiable  # the kernels' gradients are not differentiable: differentiating them raises, not zeros
    def backward(ctx, do, dht):
        q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, seg_states = ctx.saved_tensors
        if not ctx.output_final_state:
            dht = None
        if do is None:
            do = torch.zeros(*q.shape[:-1], v.shape[-1], device=q.device, dtype=q.dtype)
        inputs = (q, k, v, do.to(q.dtype))
        prepared = ctx.prepared
        if prepared is not None and plain_eager() and prepared.matches(inputs[3], dht):
            with on_device_of(q):
                dq, dk, dv, dh0 = prepared(
                    *map(last_dim_contiguous, inputs[:3]), inputs[3], dht, _slope32(slope), initial_state, cu_seqlens,
                    seg_states if seg_states.numel() else None,
                )  # fmt: skip
        else:
            if _float32_backward(ctx, q):
                inputs, seg_states = tuple(x.float() for x in inputs), None
            bwd = recompute_bwd if _recompute(ctx.backward_mode, ctx.inter_chunk, q) else chunk_bwd
            dq, dk, dv, dh0 = bwd(
                *inputs, dht, slope, initial_state, cu_seqlens, cu_seqlens_cpu, ctx.scale, ctx.inter_chunk, seg_states
            )
            if initial_state is None:
                dh0 = None
        dslope = None
        if ctx.needs_input_grad[3]:
            offsets = cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens
            dslope = slope_gradient(*inputs[:2], dq, dk, initial_state, dh0, offsets)
            dslope, dq, dk, dv = dslope.to(slope.dtype), dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
        return dq, dk, dv, dslope, dh0, None, None, None, None, None, None


def _check_head_dims(q: torch.Tensor, v: torch.Tensor) -> None:
    K, V = q.shape[-1], v.shape[-1]
    if not (1 <= K <= MAX_HEAD_DIM and 1 <= V <= MAX_HEAD_DIM):
        raise ValueError(f"the Triton kernels support head dims K, V in 1..{MAX_HEAD_DIM}, got K={K}, V={V}")


def chunk_lightning_attn_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor | None,
    *,
    scale: float,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
    cu_seqlens_cpu: torch.Tensor | None,
    backward: str,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Triton Lightning Attention (called by :func:`lightning_attention.lightning_attn` after validation).

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; float16 / bfloat16 / float32 (float64 under the interpreter;
            on CUDA float64 runs the PyTorch chunked path). Strided views are used as they are (last stride 1).
        slope: ``[H]`` float32 or None; scale: output scale.
        initial_state: ``[N, H, K, V]`` float32 or None; output_final_state: return ``[N, H, K, V]`` float32.
        cu_seqlens: ``[N + 1]`` offsets (B == 1) or None; cu_seqlens_cpu: optional host copy (enables segments).
        backward: "auto" | "chunk" | "recompute".

    Returns:
        ``(o [B, T, H, V] in q.dtype, final_state or None)``; differentiable w.r.t. q, k, v, initial_state.
    """
    _check_head_dims(q, v)
    if q.dtype == torch.float64 and q.is_cuda:  # fp64 tensor-core dots do not exist: reference path
        o, ht = naive.chunk_lightning_attn(
            q, k, v, slope, scale=scale, initial_state=initial_state,
            cu_seqlens=offsets_for(cu_seqlens, cu_seqlens_cpu, q.device),
        )  # fmt: skip
        return o, (ht.clone() if ht is initial_state else ht) if output_final_state else None
    o, ht = LightningAttnFunction.apply(
        q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, float(scale), output_final_state, backward, 0
    )
    return o, (ht if output_final_state else None)


def lightning_attn_inter_triton(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor | None,
    *,
    chunk_size: int,
    scale: float = 1.0,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The inter-chunk term of Lightning Attention alone on the Triton path (called by
    :func:`lightning_attention.ops.lightning.inter.lightning_attn_inter` after validation).

    ``o_t = scale · λ^(t-c0+1) q_t S_{c0-1}`` where c0 is the first token of t's chunk of ``chunk_size`` tokens
    (chunks aligned to each sequence start); the final state is the full S_{T-1}. Differentiable w.r.t. q, k, v,
    initial_state (and through the final state).

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; fp16 / bf16 / fp32 (fp64 under the interpreter), same layouts,
            options and shapes as :func:`lightning_attention.lightning_attn`.
        chunk_size: a multiple of 16 in 16..256.

    Returns:
        ``(o_inter [B, T, H, V] in q.dtype, final_state [N, H, K, V] float32 or None)``.
    """
    if not isinstance(chunk_size, int) or chunk_size % 16 or not 16 <= chunk_size <= 256:
        raise ValueError(f"chunk_size must be a multiple of 16 in 16..256, got {chunk_size!r}")
    _check_head_dims(q, v)
    o, ht = LightningAttnFunction.apply(
        q, k, v, slope, initial_state, cu_seqlens, cu_seqlens_cpu, float(scale), output_final_state, "chunk",
        chunk_size,
    )  # fmt: skip
    return o, (ht if output_final_state else None)
