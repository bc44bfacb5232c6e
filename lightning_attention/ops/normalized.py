"""Normalised linear attention with a feature map, computed by :func:`lightning_attention.lightning_attn`.

Per head, with λ = exp(-slope) (``slope=None``: λ = 1), a positive feature map φ (see
:mod:`lightning_attention.ops.feature_maps`) and the initial pair (S₋₁, z₋₁) = ``initial_state`` (zeros if None)::

    S_t = λ · S_{t-1} + φ(k_t) v_tᵀ        S is [K', V], float32
    z_t = λ · z_{t-1} + φ(k_t)              z is [K'],    float32 — decays with the same λ as S
    o_t = (scale · φ(q_t))ᵀ S_t / ((scale · φ(q_t))ᵀ z_t + eps)
    final_state = (S_{T-1}, z_{T-1})

Inclusive like ``lightning_attn`` (token t is in S_t and z_t before it is read), in the parallel path *and* in the
decode step (a decode that read before writing, or clamped the denominator where the parallel path adds eps, would
disagree with the parallel path). One eps form, ``den + eps``, everywhere. ``scale`` multiplies φ(q) (as in FLA's
normalised linear attention): it cancels between numerator and denominator except against eps.

How it runs — the normaliser rides along with the values. With v' = [v, 1] (one extra value column of ones) the
state of ``lightning_attn(φ(q), φ(k), v')`` is [S | z], and its output column V is φ(q)ᵀz: numerator and
denominator come out of one call of the same kernels, forward and backward, no second kernel family.
The kernels take V ≤ 256 (:data:`MAX_KERNEL_V`), so V = 256 cannot carry the extra column. Then
(:func:`fused_normaliser` is False) the values go through one call with v as is and the normaliser through a second,
narrow call whose values are :data:`NARROW_V` = 16 columns of ones (the kernels' smallest V; all 16 columns are equal,
column 0 is used). We chose this over splitting the values into two calls of 128 and 129 columns because (1) the narrow
call adds only one narrow value tile (64 wide: kernels.configs.WALK_MIN_TILE), while a 129-wide call crosses a tile
boundary and pays a second full-width tile; (2) v goes to the kernel without the concatenation copy; (3) both options
recompute φ(q)φ(k)ᵀ twice, so that cost is equal.

float16 inputs: num and den are not normalised, and in float16 they overflow (den ~ K'·T without decay) or, decayed,
underflow where they still matter against eps; the linear part of float16 calls therefore runs in float32.
bfloat16 (float32's exponent range) runs on the input dtype.
"""

from collections.abc import Callable

import torch

from lightning_attention.ops.feature_maps import FeatureMapLike, require_positive
from lightning_attention.ops.lightning.decode import lightning_attn_decode, pool_rows
from lightning_attention.ops.lightning.interface import lightning_attn
from lightning_attention.ops.lightning.decode_validation import check_no_shared_memory, check_out, require_no_broadcast
from lightning_attention.ops.lightning.naive import compute_dtype
from lightning_attention.ops.lightning.validation import check_lightning_attn_inputs, check_qkv, require_float

MAX_KERNEL_V = 256  # largest value head dim the kernels take (docs/design.md, "Public API")
NARROW_V = 16  # smallest value head dim the kernels take: width of the separate normaliser call

NormalisedState = tuple[torch.Tensor, torch.Tensor]  # (S [N, H, K', V], z [N, H, K']), float32


def check_eps(eps) -> float:
    """eps must be a finite Python float > 0 (den + eps must never be 0: strong decay can underflow den)."""
    return require_float("eps", eps, positive=True)


def fused_normaliser(v_dim: int) -> bool:
    """Whether the normaliser rides along as value column V, else it gets its own narrow call (V = 16 of ones).

    It rides along when V + 1 fits the kernels (<= 256) *and* costs no wider tile: V + 1 rounds up to the same
    power-of-two tile as V (e.g. V = 100). At a power of two (V = 64, 128) the extra column would double the value
    tile (V = 128 -> 256: twice the inter work, and chunk tiles of 256 tokens no longer fit in shared memory), so
    the narrow call (one more read of φ(q), φ(k), a 16-wide value tile) is cheaper.
    """
    return v_dim + 1 <= MAX_KERNEL_V and _tile(v_dim + 1) == _tile(v_dim)


def _tile(d: int) -> int:
    """The walk's value tile for a head dim of ``d`` (kernels.configs.walk_tile, without importing Triton)."""
    return max(64, 1 << (d - 1).bit_length())


def check_state_pair(name: str, state, shape_s: tuple, q: torch.Tensor) -> NormalisedState:
    """Checks ``state`` = (S ``[N, H, K', V]``, z ``[N, H, K']``), float32 (float64 allowed for float64 q)."""
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise TypeError(f"{name} must be the pair (S [N, H, K', V], z [N, H, K']), got {type(state).__name__}")
    s, z = state
    allowed = (torch.float32, torch.float64) if q.dtype == torch.float64 else (torch.float32,)
    for part, x, shape in ((f"{name}[0] (S)", s, shape_s), (f"{name}[1] (z)", z, shape_s[:-1])):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{part} must be a torch.Tensor, got {type(x).__name__}")
        if x.dtype not in allowed:
            raise TypeError(f"{part} must be float32, got {x.dtype}")
        if tuple(x.shape) != tuple(shape):
            raise ValueError(f"{part} must have shape {tuple(shape)}, got {tuple(x.shape)}")
        if x.device != q.device:
            raise ValueError(f"{part} must be on {q.device} (the device of q), got {x.device}")
    return s, z


# attn(q, k, v, initial_state, output_final_state) -> (o, final_state | None): lightning_attn or
# lightning_attn_inter with every other option bound.
AttnCall = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, bool], tuple]


def attend_with_normaliser(
    attn: AttnCall,
    phi_q: torch.Tensor,
    phi_k: torch.Tensor,
    v: torch.Tensor,
    initial_state: NormalisedState | None,
    output_final_state: bool,
    eps: float,
) -> tuple[torch.Tensor, NormalisedState | None]:
    """Runs ``attn`` on v' = [v, 1] (or v and a narrow ones call when V = 256) and divides.

    Args:
        attn: the linear-attention op, options bound (see :data:`AttnCall`).
        phi_q, phi_k: ``[B, T, H, K']`` features, dtype of v.
        v: ``[B, T, H, V]``.
        initial_state: (S ``[N, H, K', V]``, z ``[N, H, K']``) or None.
        eps: added to the denominator.

    Returns:
        o ``[B, T, H, V]`` = num / (den + eps) in the arithmetic dtype (float32; float64 for float64 inputs: the
        caller rounds once, after anything it adds), and the final
        (S, z) or None. With the fused layout S and z are views of one ``[N, H, K', V + 1]`` buffer, the layout
        :func:`normalized_linear_attn_decode` updates in a single call.
    """
    V = v.shape[-1]
    S0, z0 = (None, None) if initial_state is None else initial_state
    out_dtype = v.dtype
    if v.dtype == torch.float16:
        # num and den leave the kernels in the input dtype, and in float16 they leave its range: den = φ(q)ᵀz grows
        # like K'·T without decay (inf past ~65504, i.e. a few hundred tokens) and, decayed, sinks below float16's
        # smallest normal where it is still comparable with eps. float16 inputs therefore run the linear part in
        # float32 (exact, slower); bfloat16 has float32's range and stays on the fast path.
        phi_q, phi_k, v = phi_q.float(), phi_k.float(), v.float()
    if fused_normaliser(V):
        v_aug = torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)
        h0 = None if S0 is None else torch.cat([S0, z0.unsqueeze(-1)], dim=-1)
        o_aug, final = attn(phi_q, phi_k, v_aug, h0, output_final_state)
        num, den = o_aug[..., :V], o_aug[..., V:]
        final_pair = None if final is None else (final[..., :V], final[..., V])
    else:
        num, final_s = attn(phi_q, phi_k, v, S0, output_final_state)
        ones = v.new_ones(*v.shape[:-1], NARROW_V)
        z_h0 = None if z0 is None else z0.unsqueeze(-1).expand(*z0.shape, NARROW_V).contiguous()
        o_z, final_z = attn(phi_q, phi_k, ones, z_h0, output_final_state)
        den = o_z[..., :1]
        final_pair = None if final_s is None else (final_s, final_z[..., 0])
    ct = compute_dtype(out_dtype)
    return num.to(ct) / (den.to(ct) + eps), final_pair


def normalized_linear_attn(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slope: torch.Tensor | None = None,
    *,
    feature_map: FeatureMapLike = "elu+1",
    eps: float = 1e-6,
    scale: float = 1.0,
    initial_state: NormalisedState | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
    backward: str = "auto",
) -> tuple[torch.Tensor, NormalisedState | None]:
    """Causal normalised linear attention ``o_t = φ(q_t)ᵀ S_t / (φ(q_t)ᵀ z_t + eps)`` with decay (module docstring).

    Args:
        q, k: ``[B, T, H, K]`` raw queries and keys (φ is applied here); float16 / bfloat16 / float32
            (float64 on the PyTorch path, for references).
        v: ``[B, T, H, V]``, dtype of q.
        slope: ``[H]`` float32 >= 0 (λ = exp(-slope), shared by S and z) or None (no decay).
        feature_map: a positive map: ``"elu+1"``, ``"relu2"``, a :class:`LearnedFeatureMap` (its gradients flow),
            or ``FeatureMap(name, fn, positive=True)``. ``"identity"`` and ``"silu"`` raise ValueError.
            φ maps ``[..., K]`` to ``[..., K']``.
        eps: finite float > 0 added to the denominator.
        scale: multiplies φ(q) (cancels except against eps).
        initial_state: (S ``[N, H, K', V]``, z ``[N, H, K']``) float32, N = B or len(cu_seqlens) - 1.
        output_final_state: return the final (S, z) (else None).
        cu_seqlens, cu_seqlens_cpu, backward: as in :func:`lightning_attention.lightning_attn`.

    Returns:
        ``(o [B, T, H, V] in q.dtype, (S, z) or None)``. Gradients flow to q, k, v, the feature map's parameters
        and the initial pair, and through the final pair.
    """
    phi = require_positive(feature_map)
    eps = check_eps(eps)
    # structure of the raw inputs first, so errors name q/k/v rather than the augmented tensors built below
    check_lightning_attn_inputs(
        q, k, v, slope, scale=scale, initial_state=None, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, backward=backward,
    )
    phi_q, phi_k = phi(q).to(q.dtype), phi(k).to(q.dtype)
    if initial_state is not None:
        N = q.shape[0] if cu_seqlens is None else cu_seqlens.numel() - 1
        initial_state = check_state_pair(
            "initial_state", initial_state, (N, q.shape[2], phi_q.shape[-1], v.shape[-1]), q
        )

    def attn(a, b, c, h0, want_final):
        return lightning_attn(
            a, b, c, slope, scale=scale, initial_state=h0, output_final_state=want_final,
            cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, backward=backward,
        )

    o, final_state = attend_with_normaliser(attn, phi_q, phi_k, v, initial_state, output_final_state, eps)
    return o.to(q.dtype), final_state


def new_normalized_state(
    num_rows: int, num_heads: int, feature_dim: int, v_dim: int, *, device=None, dtype=torch.float32
) -> NormalisedState:
    """A zero (S ``[P, H, K', V]``, z ``[P, H, K']``) pool for decoding, stored as views of one packed buffer
    ``[P, H, K', V + 1]`` so that :func:`normalized_linear_attn_decode` updates both with one
    ``lightning_attn_decode`` call (when V + 1 ≤ 256)."""
    buf = torch.zeros(num_rows, num_heads, feature_dim, v_dim + 1, device=device, dtype=dtype)
    return buf[..., :v_dim], buf[..., v_dim]


def packed_buffer(s: torch.Tensor, z: torch.Tensor) -> torch.Tensor | None:
    """The ``[P, H, K', V + 1]`` buffer of which ``s`` and ``z`` are the column views ``[..., :V]`` and ``[..., V]``,
    or None when they are not laid out that way (or V + 1 exceeds the kernels' limit, or torch.compile traces)."""
    V = s.shape[-1]
    if not fused_normaliser(V) or s.dtype != z.dtype or s.device != z.device:
        return None
    if torch.compiler.is_compiling():  # storage addresses cannot be traced: the two-call form compiles whole
        return None
    if s.untyped_storage().data_ptr() != z.untyped_storage().data_ptr():
        return None
    if s.stride(-1) != 1 or tuple(z.stride()) != tuple(s.stride()[:-1]) or s.stride(-2) < V + 1:
        return None
    if z.storage_offset() != s.storage_offset() + V:
        return None
    return s.as_strided((*s.shape[:-1], V + 1), s.stride(), s.storage_offset())


def normalized_linear_attn_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    state: NormalisedState,
    slope: torch.Tensor | None = None,
    *,
    feature_map: FeatureMapLike = "elu+1",
    eps: float = 1e-6,
    scale: float = 1.0,
    state_indices: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One decoding step of :func:`normalized_linear_attn`; updates (S, z) in place (inclusive: update, then read).

    Args:
        q, k: ``[B, H, K]`` raw; v: ``[B, H, V]`` (one dtype).
        state: (S ``[P, H, K', V]``, z ``[P, H, K']``) float32 pool, read and written in place. When S and z are
            views of one packed ``[P, H, K', V + 1]`` buffer (:func:`new_normalized_state`, or the final state of
            :func:`normalized_linear_attn` with V < 256), the step is a single :func:`lightning_attn_decode` call
            with v' = [v, 1] on that buffer (no copies, CUDA-graph friendly). Otherwise S is updated by
            ``lightning_attn_decode`` and z by a few PyTorch ops.
        slope, scale, state_indices: as in :func:`lightning_attention.lightning_attn_decode` (``-1`` = padding slot:
            its rows are untouched and its output is zeros).
        feature_map, eps: as in :func:`normalized_linear_attn`.
        out: optional ``[B, H, V]`` buffer in q.dtype.

    Returns:
        o ``[B, H, V]`` in q.dtype.

    Input checks, before the state is touched: q, k, v, ``out`` and the state pair's structure, and that S, z and
    ``out`` are not expanded views and ``out`` shares no memory with them or the inputs; slope, scale and
    state_indices as :func:`lightning_attention.lightning_attn_decode` checks them.
    """
    phi = require_positive(feature_map)
    eps = check_eps(eps)
    # the raw inputs first, so that errors name q, k, v, out rather than the features and the augmented values
    check_qkv(q, k, v, 3, "[B, H, K]", "[B, H, V]")
    B, H, _ = q.shape
    V = v.shape[-1]
    if not isinstance(state, (tuple, list)) or len(state) != 2:
        raise TypeError(f"state must be the pair (S [P, H, K', V], z [P, H, K']), got {type(state).__name__}")
    if out is not None:
        check_out(out, (B, H, V), q)
    with torch.no_grad():
        phi_q, phi_k = phi(q).to(q.dtype), phi(k).to(q.dtype)
        if q.dtype == torch.float16:  # float16 num/den leave float16's range: see attend_with_normaliser
            phi_q, phi_k, v = phi_q.float(), phi_k.float(), v.float()
        P = state[0].shape[0] if isinstance(state[0], torch.Tensor) else 0
        s, z = check_state_pair("state", state, (P, H, phi_q.shape[-1], V), q)
        require_no_broadcast("state[0] (S)", s)
        require_no_broadcast("state[1] (z)", z)
        if not torch.compiler.is_compiling():  # addresses cannot be traced
            check_no_shared_memory({"out": out}, {"q": q, "k": k, "v": v, "state[0] (S)": s, "state[1] (z)": z})
        buf = packed_buffer(s, z)
        if buf is not None:
            v_aug = torch.cat([v, v.new_ones(B, H, 1)], dim=-1)
            o_aug = lightning_attn_decode(phi_q, phi_k, v_aug, buf, slope, scale=scale, state_indices=state_indices)
            num, den = o_aug[..., :V], o_aug[..., V:]
        else:
            num = lightning_attn_decode(phi_q, phi_k, v, s, slope, scale=scale, state_indices=state_indices)
            den = _decode_normaliser(phi_q, phi_k, z, slope, scale, state_indices)
        ct = compute_dtype(q.dtype)
        o = (num.to(ct) / (den.to(ct) + eps)).to(q.dtype)  # padding slots: 0 / (0 + eps) = 0
        if out is None:
            return o
        out.copy_(o)
        return out


def _decode_normaliser(phi_q, phi_k, z, slope, scale, state_indices) -> torch.Tensor:
    """z ← λ z + φ(k) in place on the rows in use; returns scale · φ(q)ᵀz ``[B, H, 1]`` (0 for padding slots)."""
    B, H, _ = phi_q.shape
    ct = compute_dtype(phi_q.dtype)
    src, rows, active, lam = pool_rows(B, H, state_indices, slope, z.device, ct, z.shape[0])
    old = z[rows].to(ct)
    new = lam[None, :, None] * old + phi_k[src].to(ct)
    z[rows] = torch.where(active.any(), new, old).to(z.dtype)
    den = scale * torch.einsum("bhk,bhk->bh", phi_q.to(ct), new).unsqueeze(-1)
    return torch.where(active[:, None, None], den, 0.0)
