"""Debug-mode checks of the data itself: non-finite inputs and overflow (docs/design.md, "Non-finite values and
overflow").

The chunked computation keeps a non-finite q or k at token t away from every output before t (masks select with
``where``), but a non-finite value in the operand that a chunk's score matrix multiplies (v in the forward; k, do and
q in the backward's walks) reaches the other tokens of its chunk: 0 × NaN = NaN inside a matrix product. And the
float32 state of an undecayed head grows with the sum of k_tᵀ v_t until it overflows. Neither is checked on the hot
path (it would read every input on the host); with ``LIGHTNING_ATTENTION_DEBUG=1`` these checks run on every call,
on CPU and CUDA tensors (they sync), and raise a ValueError that names the tensor and the token:

- :func:`check_finite_inputs` before the op: q, k, v finite;
- :func:`check_gradient_finite` (through :class:`FiniteGradient`) in the backward: do finite;
- :func:`check_outputs_finite` after the op: with finite inputs, a non-finite output is an overflow, reported with
  the tokens where it happened;
- :func:`guarded_decode_step` around a decode step: finite q, k, v before, and a non-finite output from finite
  inputs and a finite pool row is that row's state overflowing at this step.

Nothing runs while torch.compile traces (:func:`debug_checks_enabled`).
"""

import torch

from lightning_attention import settings

DOCS = 'docs/design.md, "Non-finite values and overflow"'


def debug_checks_enabled() -> bool:
    """Debug mode is on and nothing traces (a value read on the host would break the graph)."""
    return settings.current().debug and not torch.compiler.is_compiling()


def first_non_finite_token(x: torch.Tensor) -> tuple[int, ...] | None:
    """``(b, t, h)`` of the first non-finite element of ``x [B, T, H, D]`` in (batch, token, head) order, or None.
    For ``x [B, H, D]`` (a decode step): ``(b, h)``."""
    bad = ~torch.isfinite(x)
    if not bool(bad.any()):
        return None
    return tuple(int(i) for i in bad.any(dim=-1).nonzero()[0])


def _where(token: tuple[int, ...], offsets: list[int] | None) -> str:
    b, t, h = token
    if offsets is None:
        return f"token {t} (batch {b}, head {h})"
    n = max(i for i in range(len(offsets) - 1) if offsets[i] <= t)
    return f"token {t} of the packed row (sequence {n}, its token {t - offsets[n]}; head {h})"


def host_offsets(cu_seqlens: torch.Tensor | None, cu_seqlens_cpu: torch.Tensor | None) -> list[int] | None:
    """The packed sequences' offsets as a list (the host copy when given), or None without packed sequences."""
    if cu_seqlens is None:
        return None
    return (cu_seqlens_cpu if cu_seqlens_cpu is not None else cu_seqlens).tolist()


def check_finite_inputs(op: str, tensors: dict[str, torch.Tensor], offsets: list[int] | None = None) -> None:
    """Each of ``tensors`` (``[B, T, H, D]``) is finite; else ValueError naming it and its first non-finite token."""
    for name, x in tensors.items():
        token = first_non_finite_token(x)
        if token is not None:
            raise ValueError(
                f"{op}: {name} is not finite at {_where(token, offsets)}. Debug mode refuses non-finite inputs: "
                f"inside a chunk they can reach the outputs or gradients of earlier tokens ({DOCS})"
            )


def check_outputs_finite(
    op: str, o: torch.Tensor, offsets: list[int] | None = None, final_state: torch.Tensor | None = None
) -> None:
    """After a call whose inputs were finite: ``o [B, T, H, V]`` and ``final_state [N, H, K, V]`` (when returned)
    are finite, else a ValueError that reports an overflow and the tokens where it happened: those from its
    sequence's start up to the first token whose output is not finite. (In ``lightning_attn`` every state a final
    state passes through is read by an output; in the inter-only mode the last chunk's is not, hence the second
    check.)"""
    token = first_non_finite_token(o)
    if token is not None:
        t = token[1]
        start = 0 if offsets is None else max(x for x in offsets if x <= t)
        raise ValueError(
            f"{op}: overflow: the inputs are finite but the output is not, first at {_where(token, offsets)}: the "
            f"float32 state or the output ({o.dtype}) left its range within tokens {start}..{t} of the sequence "
            f"(the outputs before token {t} are finite). Without decay the state grows like the sum of k_tᵀ v_t: "
            f"scale k or v down, or use a decay ({DOCS})"
        )
    if final_state is not None and not bool(torch.isfinite(final_state).all()):
        n = int((~torch.isfinite(final_state)).flatten(1).any(dim=1).nonzero()[0])
        raise ValueError(
            f"{op}: overflow: the inputs and every output are finite but the final state of sequence {n} is not: "
            f"the float32 state left its range after the last state any output read ({DOCS})"
        )


def check_gradient_finite(op: str, grad: torch.Tensor, offsets: list[int] | None = None) -> None:
    """The gradient ``do [B, T, H, V]`` reaching the op's output is finite, else ValueError naming its first
    non-finite token."""
    token = first_non_finite_token(grad)
    if token is not None:
        raise ValueError(
            f"{op}: do (the gradient of o) is not finite at {_where(token, offsets)}. Debug mode refuses it: inside a "
            f"chunk it can reach the gradients of other tokens ({DOCS})"
        )


class FiniteGradient(torch.autograd.Function):
    """Identity on ``o`` whose backward checks the incoming gradient (:func:`check_gradient_finite`)."""

    @staticmethod
    def forward(ctx, o, op, offsets):
        ctx.op, ctx.offsets = op, offsets
        return o.view_as(o)

    @staticmethod
    def backward(ctx, grad):
        if grad is not None:
            check_gradient_finite(ctx.op, grad, ctx.offsets)
        return grad, None, None


def check_finite_state(op: str, name: str, state: torch.Tensor | None) -> None:
    """``state [N, H, K, V]`` (an initial state) is finite, else ValueError naming its first non-finite sequence."""
    if state is not None and not bool(torch.isfinite(state).all()):
        n, h = (int(i) for i in (~torch.isfinite(state)).flatten(2).any(dim=2).nonzero()[0])
        raise ValueError(f"{op}: {name} is not finite for sequence {n}, head {h} (debug mode refuses it: {DOCS})")


def guarded(op: str, run, tensors: dict[str, torch.Tensor], offsets: list[int] | None,
            initial_state: torch.Tensor | None = None):  # fmt: skip
    """``run()`` -> ``(o, final_state)`` with the debug checks around it: the inputs ``tensors`` (``[B, T, H, D]``)
    and ``initial_state`` before, the outputs after, and the gradient of ``o`` in the backward."""
    check_finite_inputs(op, tensors, offsets)
    check_finite_state(op, "initial_state", initial_state)
    o, final_state = run()
    check_outputs_finite(op, o, offsets, final_state)
    if o.requires_grad:
        o = FiniteGradient.apply(o, op, offsets)
    return o, final_state


def guarded_decode_step(run, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, state: torch.Tensor, state_indices):
    """``run()`` -> o ``[B, H, V]`` of a decode step on q, k ``[B, H, K]``, v ``[B, H, V]`` and the pool ``state
    [P, H, K, V]``, with the debug checks around it: q, k, v finite (before anything is written), and after the step
    a finite output wherever the inputs and the slot's pool row were finite (else an overflow of that row's state at
    this step; the pool then holds it)."""
    op = "lightning_attn_decode"
    for name, x in (("q", q), ("k", k), ("v", v)):
        bad = first_non_finite_token(x)
        if bad is not None:
            raise ValueError(f"{op}: {name} is not finite at slot {bad[0]}, head {bad[1]} (debug mode refuses it: "
                             f"{DOCS})")  # fmt: skip
    B, P = q.shape[0], state.shape[0]
    rows = torch.arange(B, device=q.device) if state_indices is None else state_indices.long()
    active = (rows >= 0) & (rows < P)
    was_finite = torch.isfinite(state[rows.clamp(0, max(P - 1, 0))].flatten(2)).all(dim=2) if P else None
    o = run()
    if P == 0:
        return o
    overflow = active[:, None] & was_finite & ~torch.isfinite(o).all(dim=2)  # [B, H]
    if bool(overflow.any()):
        b, h = (int(i) for i in overflow.nonzero()[0])
        raise ValueError(
            f"{op}: overflow: the inputs and the state of pool row {int(rows[b])} were finite, but after this step "
            f"the output of slot {b}, head {h} is not: that row's float32 state left its range at this token (the "
            f"pool now holds it). Without decay the state grows like the sum of k_tᵀ v_t ({DOCS})"
        )
    return o
