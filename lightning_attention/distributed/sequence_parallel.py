"""Sequence-parallel Lightning Attention (LASP-2 style) on ``torch.distributed``.

The P ranks of a process group each hold a contiguous slice of the same sequences, in rank order: rank r holds
``n_r`` tokens (any ``n_r >= 0``, unequal allowed). Per head, with λ = exp(-slope) and h0 the global initial state,
the recurrence S_t = λ S_{t-1} + k_tᵀ v_t, o_t = scale · q_t S_t splits at the rank boundaries:

    S_r      = Σ_{t in slice r} λ^(n_r - 1 - t) k_tᵀ v_t                   local state, from a zero state
    S_in(0)  = h0
    S_in(r+1) = λ^(n_r) S_in(r) + S_r                                      incoming state of rank r + 1
             = λ^(n_0+…+n_r) h0 + Σ_{j≤r} λ^(n_{j+1}+…+n_r) S_j
    o_r,t    = o_local,t + scale · λ^(t+1) q_t S_in(r)                       t = 0..n_r-1, local positions
    final    = S_in(P)

where ``(o_local, S_r) = lightning_attn(q_r, k_r, v_r, output_final_state=True)`` from a zero state: the output of
the recurrence restarted at S_in(r) is the zero-state output plus the decayed incoming state read by each query
(unrolled, o_t = scale · q_t (λ^(t+1) h0 + Σ_{s≤t} λ^(t-s) k_sᵀ v_s)).

Forward, on every rank: (0) the call header (:mod:`lightning_attention.distributed.call_header`): one all-gather of
a fixed-size header, so that ranks called with different shapes, dtypes, flags, scale or slope all raise the same
error instead of exchanging mismatched states (every call on CPU tensors or with ``LIGHTNING_ATTENTION_DEBUG=1``,
the first call of each signature on CUDA); (1) ``o_local`` and ``S_r`` with ONE call of the public op; (2) ONE
all-gather of every rank's ``S_r`` and ``n_r``; (3) the scan above (P small elementwise steps, the same on every
rank); (4) the inter-rank term, one batched matmul ``[T_r, K] × [K, V]`` per (batch, head).
The blocking rank-to-rank chain of LASP-1 becomes one collective whose volume is independent of T
(:mod:`lightning_attention.distributed.comm_volume`).

Backward is the mirror image. Write G(r) = dL/dS_in(r) (all ranks' losses together). Then

    G(P) = Σ_ranks dL_rank/dfinal                   the final state is replicated: its gradients are summed
    G(r) = dL_r/dS_in(r) + λ^(n_r) G(r+1)           rank r's own use of S_in(r), plus its effect on S_in(r+1)
    dL/dS_r = G(r + 1),   dL/dh0 = G(0)             every rank receives the full gradient of h0

so ONE all-gather of every rank's ``dL_r/dS_in(r)`` (and ``dL_r/dfinal``) gives each rank what it needs. Autograd
carries those gradients to q (through the inter-rank term) and to q, k, v (through the public op's backward, which
receives do for o_local and dL/dS_r for its final state together).

Why exactly one collective per direction: autograd may run independent backward branches in a different order on
different ranks, and gloo silently pairs up collectives of equal shape in issue order. Here the single backward
collective sits between the backward of the inter-rank term (which produces dL/dS_in) and that of the op call
(which consumes dL/dS_r), so its place in the order is fixed by data dependencies.

An empty slice (n_r = 0) still joins both all-gathers: its zero local state is tied to q, k, v in the autograd
graph (and its empty output to the incoming state), so whenever its inputs require grad its backward reaches the
exchange like every other rank's, with or without h0. The call header carries whether a rank will run backward, so
a rank that would not (grad mode off, or no input requiring grad) while others would is an error, not a hang.
"""

import torch
import torch.distributed as dist

from lightning_attention.distributed.call_header import check_call_consistency
from lightning_attention.distributed.comm_volume import LENGTH_SLOTS, recorded_all_gather
from lightning_attention.ops.lightning.interface import lightning_attn
from lightning_attention.ops.lightning.naive import compute_dtype
from lightning_attention.ops.lightning.validation import check_lightning_attn_inputs

# A float32 slot holds every integer below 2^24 exactly: a slice length n is sent as (n mod 2^24, n div 2^24).
_LENGTH_RADIX = 2**24


def _world(group) -> tuple[int, int]:
    """(world size, rank) of ``group``; (1, 0) when torch.distributed is not initialised and no group is given."""
    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise RuntimeError("lightning_attn_sp got a process group but torch.distributed is not initialised")
        return 1, 0
    if group is not None and not isinstance(group, dist.ProcessGroup):
        raise TypeError(f"group must be a torch.distributed ProcessGroup or None, got {type(group).__name__}")
    rank = dist.get_rank(group)
    if rank < 0:
        raise ValueError("lightning_attn_sp was called on a rank that is not a member of `group`")
    return dist.get_world_size(group), rank


def _encode_length(n: int, like: torch.Tensor) -> torch.Tensor:
    """``[2]`` in the state dtype: (n mod 2^24, n div 2^24), both exact in float32."""
    return torch.tensor([n % _LENGTH_RADIX, n // _LENGTH_RADIX], dtype=like.dtype).to(like.device, non_blocking=True)


def _decode_lengths(slots: torch.Tensor) -> torch.Tensor:
    """``[P, 2]`` gathered length slots -> ``[P]`` float64 lengths (exact), on the device (no host sync)."""
    slots = slots.to(torch.float64)
    return slots[:, 0] + slots[:, 1] * _LENGTH_RADIX


def _block_decays(slope: torch.Tensor | None, lengths: torch.Tensor, dtype: torch.dtype) -> torch.Tensor | None:
    """λ^(n_j) per rank and head, ``[P, 1, H, 1, 1]`` in ``dtype`` (broadcasts over a [B, H, K, V] state).

    ``None`` without decay (λ = 1). The exponent is formed in float64 so that long slices lose no precision.
    """
    if slope is None:
        return None
    exponent = slope.to(torch.float64)[None, :] * lengths[:, None]  # [P, H]
    return torch.exp(-exponent).to(dtype)[:, None, :, None, None]


class _StateExchange(torch.autograd.Function):
    """(local state S_r, global h0) -> (incoming state S_in(r), global final state S_in(P)); one all-gather each way.

    Shapes: every state is ``[B, H, K, V]`` in float32 (float64 for float64 inputs); ``initial_state`` may be None.
    """

    @staticmethod
    def forward(ctx, local_state, initial_state, slope, length, group, world_size, rank, grad_final):
        send = torch.cat([local_state.reshape(-1), _encode_length(length, local_state)])
        recv = recorded_all_gather(send, world_size, group, "forward")
        states = recv[:, :-LENGTH_SLOTS].view(world_size, *local_state.shape)
        decays = _block_decays(slope, _decode_lengths(recv[:, -LENGTH_SLOTS:]), local_state.dtype)

        # carry = S_in(j) while walking j = 0..P-1; a fresh tensor, never the caller's h0 (no output aliases an input)
        if initial_state is None:
            carry = torch.zeros_like(local_state)
        else:
            carry = initial_state.to(local_state.dtype, copy=True)
        incoming = None
        for j in range(world_size):
            if j == rank:
                incoming = carry
            carry = states[j] + (carry if decays is None else decays[j] * carry)

        ctx.save_for_backward(decays)
        ctx.group, ctx.world_size, ctx.rank = group, world_size, rank
        ctx.grad_final = grad_final
        ctx.has_initial_state = initial_state is not None
        return incoming, carry

    @staticmethod
    def backward(ctx, grad_incoming, grad_final):
        (decays,) = ctx.saved_tensors
        # Unused outputs arrive as zeros (materialised grads), so every rank sends a buffer of the same shape.
        parts = [grad_incoming, grad_final] if ctx.grad_final else [grad_incoming]
        send = torch.stack(parts).reshape(-1)
        recv = recorded_all_gather(send, ctx.world_size, ctx.group, "backward")
        recv = recv.view(ctx.world_size, len(parts), *grad_incoming.shape)

        # carry = G(j + 1) while walking j = P-1..0, starting from the summed gradient of the replicated final state
        carry = recv[:, 1].sum(0) if ctx.grad_final else torch.zeros_like(grad_incoming)
        grad_local = None
        for j in reversed(range(ctx.world_size)):
            if j == ctx.rank:
                grad_local = carry
            carry = recv[j, 0] + (carry if decays is None else decays[j] * carry)
        grad_initial = carry if ctx.has_initial_state else None
        return grad_local, grad_initial, None, None, None, None, None, None


def _empty_local_state(q, k, v) -> torch.Tensor:
    """The zero local state ``[B, H, K, V]`` (float32; float64 for float64 inputs) of an empty slice.

    Tied to q, k, v (their sums over zero tokens, exactly 0) when they require grad: the exchange's outputs then
    require grad on this rank as on the others, even without an h0 that requires grad, so this rank's backward
    reaches ``_StateExchange.backward`` and joins its all-gather; q, k, v receive (empty) zero gradients instead of
    None, so upstream parameters see a gradient like on every other rank.
    """
    B, _, H, K = q.shape
    zeros = torch.zeros(B, H, K, v.shape[-1], dtype=compute_dtype(q.dtype), device=q.device)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        zeros = zeros + (q.sum() + k.sum() + v.sum()).to(zeros.dtype)
    return zeros


def _empty_output(q, v, incoming) -> torch.Tensor:
    """``[B, 0, H, V]`` output of an empty slice, tied to the exchange's incoming state.

    A loss that reads only this rank's (empty) output must still reach ``_StateExchange.backward``.
    """
    B, _, H, _ = q.shape
    return (incoming.sum() * 0).to(q.dtype).expand(B, 0, H, v.shape[-1])


def _incoming_term(q, slope, incoming, scale) -> torch.Tensor:
    """``scale · λ^(t+1) q_t S_in`` for the T_r local positions t: ``[B, T_r, H, V]`` in q.dtype.

    q ``[B, T_r, H, K]``; incoming ``[B, H, K, V]`` float32; slope ``[H]`` or None. Arithmetic in the state dtype
    (the fp32 state is never rounded to the input dtype here); the decay exponent t+1 is formed in float64.
    """
    T = q.shape[1]
    qf = q.to(incoming.dtype)
    if slope is not None:
        t = torch.arange(1, T + 1, device=q.device, dtype=torch.float64)
        qf = qf * torch.exp(-slope.to(torch.float64)[None, :] * t[:, None]).to(incoming.dtype)[None, :, :, None]
    return (scale * torch.einsum("bthk,bhkv->bthv", qf, incoming)).to(q.dtype)


def lightning_attn_sp(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor | None = None,
    *,
    group: "dist.ProcessGroup | None" = None,
    scale: float = 1.0,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Sequence-parallel :func:`lightning_attention.lightning_attn`: each rank holds a slice of the sequences.

    The ranks of ``group`` hold contiguous slices of the same B sequences, in rank order; slice lengths ``T_r`` may
    differ between ranks and may be 0. Concatenating every rank's ``o`` along T gives exactly the output of
    ``lightning_attn`` on the full sequences.

    Args:
        q: ``[B, T_r, H, K]`` this rank's slice; float16 / bfloat16 / float32 (float64 on the PyTorch path).
        k: ``[B, T_r, H, K]``, dtype of q.
        v: ``[B, T_r, H, V]``, dtype of q.
        slope: ``[H]`` float32 >= 0 (λ = exp(-slope)) or ``None`` (no decay); the same on every rank.
        group: the sequence-parallel process group (``None``: the default group). Without an initialised
            ``torch.distributed`` and with ``group=None`` this is the single-device op.
        scale: output scale, as in ``lightning_attn``.
        initial_state: ``[B, H, K, V]`` float32 global h0 (state before the first token of rank 0), passed
            identically on every rank; each rank receives the full gradient of it.
        output_final_state: return the global final state (after the last token of the last rank) on every rank.
            Gradients that reach it from several ranks are summed. Must be the same on every rank.

    Returns:
        ``(o, final_state)``: o ``[B, T_r, H, V]`` in q.dtype (this rank's slice); final_state ``[B, H, K, V]``
        float32 or ``None``.

    Every rank of ``group`` must call this with the same B, H, K, V, dtype, scale, slope, flags and h0 (given or
    not, with the same values), with grad mode and requires-grad alike, and, when training, must backpropagate
    through its output (an all-gather runs in forward and one in backward, as with DDP). A call that breaks this
    raises the same ``ValueError`` on every rank (naming the argument and each rank's value) before any state is
    exchanged; a rank whose own inputs are invalid raises its own error and the others name it. This is checked on
    every call for CPU tensors (gloo) and with ``LIGHTNING_ATTENTION_DEBUG=1``, on the first call of each shape
    signature for CUDA tensors (:mod:`lightning_attention.distributed.call_header`; h0's values in debug mode only).
    Each rank's own arguments are checked as :func:`lightning_attention.lightning_attn` checks them (structure always;
    the slope's range on CPU tensors or in debug mode; in debug mode also non-finite inputs and overflow) and
    ``group`` must be a ``ProcessGroup`` or None (TypeError). Communication per call: one all-gather of
    ``[B, H, K, V]`` states in each direction, independent of T
    (:func:`~lightning_attention.distributed.comm_volume.sp_communication_bytes`). Compute: one call of the public
    op per rank plus the inter-rank term ``λ^(t+1) q_t S_in`` (2·T_r·K·V FLOP per head, like one inter-chunk product).
    """
    world_size, rank = _world(group)
    if world_size == 1:
        return lightning_attn(
            q, k, v, slope, scale=scale, initial_state=initial_state, output_final_state=output_final_state
        )
    try:
        check_lightning_attn_inputs(
            q,
            k,
            v,
            slope,
            scale=scale,
            initial_state=initial_state,
            output_final_state=output_final_state,
            cu_seqlens=None,
            cu_seqlens_cpu=None,
            backward="auto",
        )
        local_error = None
    except (TypeError, ValueError) as e:  # raised after the header exchange, so that no other rank waits for this one
        local_error = e
    check_call_consistency(group, world_size, q, k, v, slope, scale, initial_state, output_final_state, local_error)

    T = q.shape[1]
    if T > 0:
        o_local, local_state = lightning_attn(q, k, v, slope, scale=scale, output_final_state=True)
    else:
        local_state = _empty_local_state(q, k, v)
    incoming, final_state = _StateExchange.apply(
        local_state, initial_state, slope, T, group, world_size, rank, output_final_state
    )
    if T > 0:
        o = o_local + _incoming_term(q, slope, incoming, scale)
    else:
        o = _empty_output(q, v, incoming)
    return o, (final_state if output_final_state else None)
