"""The chunked form on packed sequences, from device offsets alone: no host copy, no per-sequence Python loop.

A batch of N sequences packed in one row of T tokens (offsets ``cu_seqlens [N + 1]``) is cut into blocks of C tokens
of the *row*, as a single sequence would be; sequence boundaries are masks inside the blocks. Per token t with
sequence n(t), its first token bos(t) and its position p(t) = t - bos(t):

    intra:  scores_ij = (q_i·k_j) λ^(i-j) where j ≤ i and n(j) = n(i), else 0   (selected with ``where``)
    inter:  a token whose sequence runs on from the previous block reads the carried state: λ^(i+1) q_i S_{b-1};
            a token whose sequence starts inside the block reads its own h0: λ^(p+1) q_i h0[n]
    carry:  S_b = the state of the block's last sequence after the block's last token

The h0 terms concern only the first tokens of each sequence, so they are computed per sequence on a window of its
first tokens and added where they belong; nothing of size T × K × V is ever formed. Final states are the states at
each sequence's last token, from the carries and one block's partial sums (an empty sequence keeps its h0). Every
shape depends on T, N and C only, so ``torch.compile`` captures the whole computation in one graph, and autograd
goes through it: this is the CPU path's varlen training.

The inter-only mode (the hybrid attention's linear half) chunks each *sequence* from its own start: a token reads
the state after x, the token before its sequence-chunk. A row block holds at most one such x, so that state is one
[K, V] state per block: a carry of the row's blocks plus a partial sum over x's block, which is the token's own block
or the one before.

Wherever a product may meet another sequence's tokens, their operands are selected (``where``) on both sides, inputs
and outputs: a zero weight times a non-finite value is NaN, and autograd multiplies by the zero gradients of the
tokens a product does not reach (docs/design.md, "Non-finite values and overflow").
"""

import torch


def packed_chunk_lightning_attn(q, k, v, s, h0, cu_seqlens, *, scale: float, chunk_size: int, intra: bool = True):
    """Lightning Attention on packed sequences (module docstring).

    Args:
        q, k: ``[T, H, K]``; v: ``[T, H, V]``, already in the arithmetic dtype (the batch row squeezed out).
        s: ``[H]`` slopes (0: no decay); h0: ``[N, H, K, V]`` initial states (zeros where none).
        cu_seqlens: ``[N + 1]`` offsets (any integer dtype, any device), from 0 to T.
        scale: output scale; chunk_size: C; intra: False for the inter-chunk term alone (chunks from each sequence
            start).

    Returns:
        ``(o [T, H, V], final_state [N, H, K, V])`` in the arithmetic dtype.
    """
    T, H, K = q.shape
    V = v.shape[-1]
    N = h0.shape[0]
    if T == 0 or N == 0:  # every sequence is empty (each keeps its h0), or no token belongs to a sequence
        return v.new_zeros(T, H, V), h0
    C = chunk_size
    NT = max(1, -(-T // C))
    # valid offsets pass unchanged; offsets that were not checked (CUDA outside debug mode) become some valid
    # packing, so that no index below leaves the tensors (a wrong answer, never an out-of-bounds access)
    cu = torch.as_tensor(cu_seqlens).to(device=q.device, dtype=torch.long).clamp(0, T).cummax(dim=0).values
    rows = _RowLayout(cu, T, NT, C, q.dtype)
    qb, kb, vb = (rows.blocks(x) for x in (q, k, v))  # [NT, C, H, D]
    carries = _carries(rows, kb, vb, h0, -s)
    before = torch.cat([torch.zeros_like(carries[:1]), carries[:-1]])  # S_{b-1} (never read in block 0)
    if intra:
        o = _outputs(rows, qb, kb, vb, before, -s)
        fresh = ~rows.runs_on_tok  # the sequence starts in the token's block: it reads h0 itself
        o = o + _h0_terms(rows, q, h0, -s, fresh, width=C)
    else:
        o, fresh = _inter_outputs(rows, qb, kb, vb, before, -s)
        o = o + _h0_terms(rows, q, h0, -s, fresh, width=2 * C)
    return scale * o, _final_states(rows, kb, vb, carries, h0, -s)


class _RowLayout:
    """Where every position of the padded row (NT·C tokens) stands: its sequence (N for padding: matches none), its
    sequence's first token, its position in the sequence, and whether its sequence runs on from the previous
    block."""

    def __init__(self, cu: torch.Tensor, T: int, NT: int, C: int, dtype: torch.dtype):
        self.cu, self.T, self.NT, self.C, self.dtype = cu, T, NT, C, dtype
        N = cu.numel() - 1
        t = torch.arange(NT * C, device=cu.device)
        real = t < T
        self.seq = torch.where(real, torch.bucketize(t, cu[1:], right=True), N)  # [NT·C]
        self.first = torch.where(real, cu[self.seq.clamp(max=N - 1)], t)
        self.pos = t - self.first  # [NT·C] int
        block_start = (t // C) * C
        self.runs_on_tok = (block_start > 0) & (self.seq[(block_start - 1).clamp(min=0)] == self.seq)

    def blocks(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, ...]`` zero-padded to NT·C rows and cut into ``[NT, C, ...]`` blocks."""
        pad = self.NT * self.C - x.shape[0]
        return torch.nn.functional.pad(x, (0,) * (2 * (x.dim() - 1)) + (0, pad)).reshape(self.NT, self.C, *x.shape[1:])

    def decay(self, log_lambda: torch.Tensor, exponent: torch.Tensor) -> torch.Tensor:
        """λ^exponent per head: ``exponent [...]`` (ints or floats) -> ``[..., H]``."""
        return torch.exp(log_lambda * exponent.to(self.dtype)[..., None])


def _carries(rows: _RowLayout, kb, vb, h0, log_lambda) -> torch.Tensor:
    """``[NT, H, K, V]``: after each block's last real token, the state of that token's sequence."""
    NT, C, N = rows.NT, rows.C, h0.shape[0]
    c0 = torch.arange(NT, device=kb.device) * C
    last = torch.clamp(c0 + C - 1, max=rows.T - 1)  # [NT]
    seq_last = rows.seq[last]
    j = c0[:, None] + torch.arange(C, device=kb.device)[None, :]  # [NT, C]
    inside = (rows.seq.reshape(NT, C) == seq_last[:, None]) & (j <= last[:, None])
    w = rows.decay(log_lambda, (last[:, None] - j).clamp(min=0))
    local = torch.einsum("bjhk,bjhv->bhkv", *_select(inside, kb * w[..., None], vb))
    length = last - c0 + 1
    fresh = rows.decay(log_lambda, rows.pos[last] + 1)[..., None, None] * h0[seq_last.clamp(max=N - 1)]
    runs_on = rows.runs_on_tok[last]
    carries, S = [], torch.zeros_like(h0[0])
    for b in range(NT):  # the scan over blocks: NT small [H, K, V] updates
        S = torch.where(runs_on[b], rows.decay(log_lambda, length[b])[:, None, None] * S, fresh[b]) + local[b]
        carries.append(S)
    return torch.stack(carries)


def _select(keep: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Each of ``tensors`` ``[..., H, D]`` with the tokens where ``keep`` (``[...]`` bool) is False set to 0 by
    selection: a state sums k_jᵀ v_j over its tokens only, and a 0 weight times a non-finite k or v of another
    sequence or a later token would still be NaN."""
    return tuple(torch.where(keep[..., None, None], x, 0.0) for x in tensors)


def _outputs(rows: _RowLayout, qb, kb, vb, before, log_lambda) -> torch.Tensor:
    """o (unscaled) of the full op without its h0 terms: intra within the block for tokens of one sequence, and
    λ^(i+1) q_i S_{b-1} for tokens whose sequence runs on from the previous block. ``[T, H, V]``."""
    NT, C = rows.NT, rows.C
    local = torch.arange(C, device=qb.device)
    dist = local[:, None] - local[None, :]
    seq = rows.seq.reshape(NT, C)
    same = (seq[:, :, None] == seq[:, None, :]) & (dist >= 0)  # [NT, C, C]
    scores = torch.einsum("bihk,bjhk->bijh", qb, kb) * rows.decay(log_lambda, dist.clamp(min=0))
    o = torch.einsum("bijh,bjhv->bihv", torch.where(same[..., None], scores, 0.0), vb)
    # λ^(i+1) q_i S_{b-1} for the tokens whose sequence runs on, selected in q as well as in the output: a token that
    # does not read the state then takes none of its non-finite values into dq (the backward multiplies the state by
    # that token's zero gradient) and gives none of its own to the state's gradient
    runs_on = rows.runs_on_tok.reshape(NT, C)[..., None, None]
    qd = torch.where(runs_on, qb * rows.decay(log_lambda, local + 1)[None, :, :, None], 0.0)
    carried = torch.einsum("bihk,bhkv->bihv", qd, before)
    o = o + torch.where(runs_on, carried, 0.0)
    return o.reshape(NT * C, *o.shape[2:])[: rows.T]


def _inter_outputs(rows: _RowLayout, qb, kb, vb, before, log_lambda) -> tuple[torch.Tensor, torch.Tensor]:
    """o (unscaled) of the inter-only mode without its h0 terms, and which tokens take an h0 term.

    Token t reads S(x), x = the token before its sequence-chunk: o_t = λ^(t-x) q_t S(x). A row block holds at most one
    such x (the next one of its sequence is C tokens on, and another sequence needs C tokens of its own before its
    first), so S(x) is one state per block, built from that block alone: X_b = λ^(x+1-c0(b)) S_{b-1} when x's sequence
    runs on from before block b, plus Σ_{j in block b, j ≤ x, same sequence} λ^(x-j) k_jᵀ v_j. Without the run-on
    term the rest of S(x), λ^(p(x)+1) h0, is an h0 term, as it is for the tokens of a sequence's first chunk (p < C,
    λ^(p+1) h0): both are λ^(p(t)+1) q_t h0. Every product takes one sequence's tokens only, so no other sequence's
    non-finite value meets a zero weight."""
    NT, C, T = rows.NT, rows.C, rows.T
    device = qb.device
    t = torch.arange(NT * C, device=device)
    # the block's x: a token followed, in its sequence, by the first token of a chunk that reads a state
    nxt = (t + 1).clamp(max=NT * C - 1)
    is_x = (t + 1 < T) & (rows.seq[nxt] == rows.seq) & (rows.pos[nxt] >= C) & (rows.pos[nxt] % C == 0)
    is_x = is_x.reshape(NT, C)
    has_x = is_x.any(dim=1)
    xi = is_x.to(torch.int32).argmax(dim=1)  # [NT] x's place in its block (0 where the block has none)
    x_tok = torch.arange(NT, device=device) * C + xi
    j = torch.arange(C, device=device)
    inside = has_x[:, None] & (rows.seq.reshape(NT, C) == rows.seq[x_tok][:, None]) & (j[None, :] <= xi[:, None])
    w = rows.decay(log_lambda, (xi[:, None] - j[None, :]).clamp(min=0))  # [NT, C, H]: λ^(x-j)
    X = torch.einsum("bjhk,bjhv->bhkv", *_select(inside, kb * w[..., None], vb))
    runs_on = (has_x & rows.runs_on_tok[x_tok])[:, None, None, None]
    X = X + torch.where(runs_on, rows.decay(log_lambda, xi + 1)[..., None, None] * before, 0.0)
    # each token's x lies in its own block or the one before; q is selected to the tokens that take each product, as
    # well as the output (as in _outputs)
    reads_state = rows.pos >= C
    x = (rows.first + (rows.pos // C) * C - 1).clamp(min=0)
    reads = reads_state.reshape(NT, C)[..., None, None]
    prev = (x // C < t // C).reshape(NT, C)[..., None, None]
    qx = qb * rows.decay(log_lambda, (t - x).clamp(min=0).reshape(NT, C))[..., None]  # λ^(t-x) q_t
    in_this = torch.einsum("bihk,bhkv->bihv", torch.where(reads & ~prev, qx, 0.0), X)
    in_prev = torch.einsum("bihk,bhkv->bihv", torch.where(reads & prev, qx, 0.0), torch.cat([X[:1], X[:-1]]))
    o = torch.where(reads, torch.where(prev, in_prev, in_this), 0.0)
    fresh = ~reads_state | ~rows.runs_on_tok[x]
    return o.reshape(NT * C, *o.shape[2:])[:T], fresh


def _h0_terms(rows: _RowLayout, q, h0, log_lambda, wanted: torch.Tensor, width: int) -> torch.Tensor:
    """``[T, H, V]``: λ^(p(t)+1) q_t h0[n(t)] for the tokens ``wanted`` (``[NT·C]`` bool), which lie among the first
    ``width`` tokens of their sequences: computed per sequence on that window and added at the tokens' places
    (index_add into one spare row for the window's other places, so every shape is fixed)."""
    T = rows.T
    cu = rows.cu
    r = torch.arange(width, device=q.device)
    tok = cu[:-1, None] + r[None, :]  # [N, width]
    inside = (tok < cu[1:, None]) & wanted[tok.clamp(max=wanted.numel() - 1)]
    tok_c = tok.clamp(max=T - 1)
    # [N, width, H, K]; the window's other places hold other sequences' q: selected out, or a non-finite one would
    # reach dh0 through the zero gradient of the spare row
    qd = torch.where(inside[..., None, None], q[tok_c] * rows.decay(log_lambda, r + 1)[None, :, :, None], 0.0)
    terms = torch.einsum("nrhk,nhkv->nrhv", qd, h0)
    out = q.new_zeros(T + 1, *terms.shape[2:])
    out.index_add_(0, torch.where(inside, tok, T).flatten(), terms.flatten(0, 1))
    return out[:T]


def _final_states(rows: _RowLayout, kb, vb, carries, h0, log_lambda) -> torch.Tensor:
    """``[N, H, K, V]``: the state after each sequence's last token (its h0 when it is empty)."""
    C, N = rows.C, h0.shape[0]
    device = kb.device
    cu = rows.cu
    n = torch.arange(N, device=device)
    x = (cu[1:] - 1).clamp(min=0)  # each sequence's last token
    empty = cu[1:] == cu[:-1]
    bx = x // C
    runs_on = rows.runs_on_tok[x]
    carry = torch.cat([torch.zeros_like(carries[:1]), carries])[bx]  # S_{bx-1}
    alpha = rows.decay(log_lambda, x - bx * C + 1)[..., None, None]
    beta = rows.decay(log_lambda, rows.pos[x] + 1)[..., None, None]
    base = torch.where(runs_on[:, None, None, None], alpha * carry, beta * h0)
    j = bx[:, None] * C + torch.arange(C, device=device)[None, :]  # [N, C] the tokens of x's block
    inside = (j <= x[:, None]) & (rows.seq[j] == n[:, None])
    w = rows.decay(log_lambda, (x[:, None] - j).clamp(min=0))
    partial = torch.einsum("njhk,njhv->nhkv", *_select(inside, kb[bx] * w[..., None], vb[bx]))
    return torch.where(empty[:, None, None, None], h0, base + partial)
