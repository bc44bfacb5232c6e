"""The TransNormerLLM token mixer: gated linear attention on top of :func:`lightning_attention.lightning_attn`.

TNL variant (released TransNormerLLM, paper §3)::

    q, k, v, u = split(qkvu_proj(x))              one fused projection, split as views (no copy)
    q, k = SiLU(q), SiLU(k)                        v and u have no activation
    q, k = LRPE(q), LRPE(k)                        first layer only (head dim D -> 2D)
    o = lightning_attn(q, k, v, slope)             per-layer decay, scale 1 (the norm below replaces it)
    y = out_proj(u ⊙ SRMSNorm(o))                  SRMSNorm over all heads jointly, no weight

MiniMax-01 variant (``variant="minimax"``)::

    q, k, v = split(SiLU(qkv_proj(x)))             SiLU on q, k and v
    o = lightning_attn(q, k, v, slope)
    y = out_proj(sigmoid(output_gate(x)) ⊙ RMSNorm(o))   weighted RMSNorm over all heads

Both use the same slopes (``tnl_slopes``, or ``paper_slopes`` with ``decay="paper"``), fixed as in the paper, or
learned from there with ``learn_decay`` (the slopes become a parameter, ``log_slope [H]``: positive by construction;
the op's slope gradient, docs/design.md "Gradients", reaches it on both backends). Paths through the op:

- training / prefill: ``lightning_attn`` (PyTorch chunked path on CPU, Triton kernels on CUDA);
- one new token per sequence with a cached state: ``lightning_attn_decode`` (fp32 state updated in place);
- a ``sequence_parallel_group``: ``lightning_attention.distributed.lightning_attn_sp`` (imported when first used).

Padding (``token_mask`` False at a position): q, k and v are zeroed there by selection (``torch.where``: whatever
the padded positions hold, NaN included, since 0 · NaN would still be NaN), and so is the output, so that the
backward sends exactly zero into the op from padded positions. The state update ``S = λS + kᵀv`` then adds 0 at a
padded step, but λ still multiplies S there. That is harmless for left padding from an empty state (λ·0 = 0) and for
right padding when no final state is needed (outputs at real positions never see later steps). When a final state
must be exact for any padding pattern and any initial state (a cache is being filled), the real tokens are packed
into one varlen row (``cu_seqlens``) instead, so padded steps do not exist at all. In a decode step a padded row is
a ``-1`` slot: its state is not touched. Either way the output is zero at padded positions.
"""

import torch
import torch.nn.functional as F
from torch import nn

from lightning_attention.nn.lrpe import LRPE
from lightning_attention.nn.srmsnorm import RMSNorm, SRMSNorm
from lightning_attention.ops.decay import paper_slopes, tnl_slopes
from lightning_attention.ops.lightning.decode import lightning_attn_decode
from lightning_attention.ops.lightning.interface import lightning_attn
from lightning_attention.ops.lightning.validation import require_tensor

DECAY_RECIPES = {"tnl": tnl_slopes, "paper": paper_slopes}
VARIANTS = ("tnl", "minimax")


def decay_slopes(recipe: str, num_heads: int, layer_idx: int, num_layers: int) -> torch.Tensor:
    """``[H]`` float32 slopes of ``recipe`` ("tnl" | "paper"), validated (finite, >= 0) once here."""
    if recipe not in DECAY_RECIPES:
        raise ValueError(f"decay must be one of {tuple(DECAY_RECIPES)}, got {recipe!r}")
    with torch.device("cpu"):  # also under a meta-device context (transformers' from_pretrained): values are needed
        slope = DECAY_RECIPES[recipe](num_heads, layer_idx, num_layers)
    if not bool(torch.isfinite(slope).all()) or bool((slope < 0).any()):
        raise ValueError(f"decay recipe {recipe!r} gave invalid slopes {slope.tolist()}")
    return slope


class TNLAttention(nn.Module):
    """Gated lightning attention (the TNL token mixer), ``x [B, T, d_model]`` -> ``[B, T, d_model]``.

    Args:
        d_model: model width.
        hidden_dim: attention width ``H · D`` (TNL: equal to d_model).
        num_heads: H; the head dim is ``D = hidden_dim // H`` (the op sees K = 2D in an LRPE layer, V = D).
        layer_idx, num_layers: position of this layer, for the decay schedule and the cache slot.
        use_lrpe: apply LRPE-d to q and k (the released models: first layer only).
        variant: "tnl" or "minimax" (see the module docstring).
        decay: "tnl" (released checkpoints) or "paper" (eq. 10).
        bias: biases in the projections.
        norm_eps: eps of the output norm.
        learn_decay: learn the slopes (parameter ``log_slope [H]``, initialised to the recipe's log) instead of
            keeping the recipe's fixed (buffer ``slope``, not saved). Not with ``sequence_parallel_group``.
        lrpe_float32: with LRPE, cast q, k, v to float32 before it, so LRPE and the lightning attention of this layer
            run in float32 under autocast and the angles θ get float32 gradients (a bf16 dq, dk makes θ's gradient,
            a sum of position-weighted products over every token, noisy).
        sequence_parallel_group: a ``torch.distributed`` group; when set, the op runs sequence parallel over it
            (each rank holds a contiguous slice of T; pass global ``positions``).

    State-dict names follow the released checkpoints: ``qkvu_proj``, ``out_proj``, ``lrpe.theta`` (TNL);
    ``qkv_proj``, ``output_gate``, ``norm.weight``, ``out_proj`` (MiniMax-01).
    """

    def __init__(
        self,
        d_model: int,
        hidden_dim: int,
        num_heads: int,
        layer_idx: int,
        num_layers: int,
        *,
        use_lrpe: bool = False,
        variant: str = "tnl",
        decay: str = "tnl",
        bias: bool = False,
        norm_eps: float = 1e-6,
        lrpe_float32: bool = False,
        learn_decay: bool = False,
        sequence_parallel_group=None,
    ):
        super().__init__()
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if hidden_dim % num_heads != 0:
            raise ValueError(f"hidden_dim ({hidden_dim}) must be divisible by num_heads ({num_heads})")
        self.d_model = d_model
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.head_dim = hidden_dim // num_heads
        self.layer_idx = layer_idx
        self.num_layers = num_layers
        self.variant = variant
        self.decay = decay
        self.learn_decay = learn_decay
        if learn_decay and sequence_parallel_group is not None:
            # lightning_attn_sp's state exchange returns no slope gradient: the decay would learn from part of it
            raise ValueError("learn_decay is not supported with sequence parallelism (a fixed decay is)")
        self.sequence_parallel_group = sequence_parallel_group
        if variant == "tnl":
            self.qkvu_proj = nn.Linear(d_model, 4 * hidden_dim, bias=bias)
            self.norm = SRMSNorm(hidden_dim, eps=norm_eps)
        else:
            self.qkv_proj = nn.Linear(d_model, 3 * hidden_dim, bias=bias)
            self.output_gate = nn.Linear(d_model, hidden_dim, bias=bias)
            self.norm = RMSNorm(hidden_dim, eps=norm_eps)
        self.lrpe = LRPE(num_heads, self.head_dim) if use_lrpe else None
        self.lrpe_float32 = lrpe_float32
        self.out_proj = nn.Linear(hidden_dim, d_model, bias=bias)
        self.out_proj._is_residual_projection = True
        slopes = decay_slopes(decay, num_heads, layer_idx, num_layers)
        if learn_decay:
            self.log_slope = nn.Parameter(slopes.log())
        else:
            # not a checkpoint entry (recomputed from the recipe), and kept float32 by _apply below
            self.register_buffer("slope", slopes, persistent=False)

    def decay_slope(self) -> torch.Tensor:
        """The ``[H]`` float32 slopes this layer runs with (λ = exp(-slope))."""
        if self.learn_decay:
            return self.log_slope.float().exp()
        return self.slope

    def reset_slope(self) -> None:
        """Sets the slopes to the recipe's (at init, after a meta-device construction or a dtype cast)."""
        slopes = decay_slopes(self.decay, self.num_heads, self.layer_idx, self.num_layers)
        if self.learn_decay:
            with torch.no_grad():
                self.log_slope.copy_(slopes.log())
            return
        device = self.slope.device if self.slope.device.type != "meta" else torch.device("cpu")
        self.slope = slopes.to(device)

    def _apply(self, fn, *args, **kwargs):
        # model.half() / .to(bfloat16) would round the fixed decay slopes: restore them in float32 (learned ones
        # follow the model's dtype, as every parameter does)
        out = super()._apply(fn, *args, **kwargs)
        if not self.learn_decay and self.slope.dtype != torch.float32 and self.slope.device.type != "meta":
            self.reset_slope()
        return out

    def _project(self, x: torch.Tensor, positions: torch.Tensor | None):
        """q, k ``[B, T, H, K]``, v ``[B, T, H, D]`` and the gate ``[B, T, hidden]`` (K = 2D with LRPE)."""
        B, T, _ = x.shape
        H, D = self.num_heads, self.head_dim
        if self.variant == "tnl":
            q, k, v, gate = self.qkvu_proj(x).split(self.hidden_dim, dim=-1)  # views of one [B, T, 4·hidden]
            q, k = F.silu(q), F.silu(k)
        else:
            q, k, v = F.silu(self.qkv_proj(x)).split(self.hidden_dim, dim=-1)
            gate = torch.sigmoid(self.output_gate(x))
        q, k, v = q.view(B, T, H, D), k.view(B, T, H, D), v.view(B, T, H, D)
        if self.lrpe is not None:
            if positions is None:
                positions = torch.arange(T, device=x.device).expand(B, T)
            if self.lrpe_float32 and q.dtype in (torch.float16, torch.bfloat16):
                q, k, v = q.float(), k.float(), v.float()
            q, k = self.lrpe(q, positions), self.lrpe(k, positions)
        return q, k, v, gate

    def forward(
        self,
        x: torch.Tensor,
        *,
        positions: torch.Tensor | None = None,
        token_mask: torch.Tensor | None = None,
        cache=None,
        cu_seqlens: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Args:
            x: ``[B, T, d_model]``.
            positions: ``[B, T]`` int positions for LRPE (default ``arange(T)``); only differences matter within a
                sequence, so each sequence may count from its own origin.
            token_mask: ``[B, T]`` bool, False at padded positions, or ``None`` (no padding).
            cache: a :class:`~lightning_attention.models.transnormer.cache.TransNormerCache`; this layer reads and
                writes its recurrent state ``[N, H, K, V]`` float32 (``get_recurrent_state`` /
                ``update_recurrent_state``).
            cu_seqlens: ``[N + 1]`` offsets of sequences packed along T (B == 1); each starts from its own state.
            key_mask: ignored (the softmax layers' key mask; a lightning state already excludes padding).

        Returns:
            ``[B, T, d_model]`` in the activation dtype.
        """
        B, T, _ = x.shape
        if token_mask is not None:
            require_tensor("token_mask", token_mask)
            if token_mask.dtype != torch.bool or tuple(token_mask.shape) != (B, T):
                raise ValueError(
                    f"token_mask must be a bool tensor of shape [B, T] = {(B, T)}, got {token_mask.dtype} "
                    f"{tuple(token_mask.shape)}"
                )
        q, k, v, gate = self._project(x, positions)
        o = self._attend(q, k, v, token_mask, cache, cu_seqlens)  # [B, T, H, D]
        # o is float32 with lrpe_float32 under autocast: the gated product goes on in the gate's dtype
        o = self.norm(o.reshape(B, T, self.hidden_dim)).to(gate.dtype)
        return self.out_proj(gate * o)

    def _attend(self, q, k, v, token_mask, cache, cu_seqlens) -> torch.Tensor:
        slope = self.decay_slope()
        state = None if cache is None else cache.get_recurrent_state(self.layer_idx)
        if self.sequence_parallel_group is not None:
            if cu_seqlens is not None or token_mask is not None:
                raise ValueError("sequence parallelism takes unpadded, unpacked sequences (no token_mask/cu_seqlens)")
            from lightning_attention.distributed import lightning_attn_sp

            o, final = lightning_attn_sp(
                q, k, v, slope, group=self.sequence_parallel_group, initial_state=state,
                output_final_state=cache is not None,
            )
        elif state is not None and q.shape[1] == 1 and cu_seqlens is None:
            # one new token per sequence: recurrent step, state updated in place (no autograd: generation only)
            rows = None
            if token_mask is not None:
                arange = torch.arange(q.shape[0], device=q.device)
                rows = torch.where(token_mask[:, 0], arange, torch.full_like(arange, -1))
            return lightning_attn_decode(q[:, 0], k[:, 0], v[:, 0], state, slope, state_indices=rows)[:, None]
        elif token_mask is not None and cache is not None:
            o, final = self._packed(q, k, v, slope, token_mask, state)
        else:
            keep = None if token_mask is None else token_mask[:, :, None, None]
            if keep is not None:  # selected, not multiplied: 0 · NaN would still be NaN (module docstring)
                q, k, v = (torch.where(keep, x, 0.0) for x in (q, k, v))
            o, final = lightning_attn(
                q, k, v, slope, initial_state=state, output_final_state=cache is not None, cu_seqlens=cu_seqlens
            )
            if keep is not None:  # so that the backward sends exactly 0 into the op at padded positions
                o = torch.where(keep, o, 0.0)
        if cache is not None:
            cache.update_recurrent_state(final, self.layer_idx)
        return o

    @staticmethod
    def _packed(q, k, v, slope, token_mask, state):
        """Exact padded prefill: the real tokens of each row become one sequence of a varlen batch.

        Returns o ``[B, T, H, D]`` (zeros at padded positions) and the final states ``[B, H, K, V]``.
        """
        B, T, H, _ = q.shape
        flat = token_mask.reshape(-1).nonzero().squeeze(-1)  # [total] indices of real tokens, row-major
        lengths = token_mask.sum(dim=1)
        cu = torch.zeros(B + 1, dtype=torch.int64, device=q.device)
        cu[1:] = torch.cumsum(lengths, 0)
        pack = lambda x: x.reshape(B * T, H, -1).index_select(0, flat)[None]  # noqa: E731
        o_packed, final = lightning_attn(
            pack(q), pack(k), pack(v), slope, initial_state=state, output_final_state=True, cu_seqlens=cu
        )
        o = o_packed.new_zeros(B * T, H, v.shape[-1]).index_copy(0, flat, o_packed[0])
        return o.reshape(B, T, H, -1), final
