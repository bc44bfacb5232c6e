"""Generation cache of TransNormerLLM: one fp32 recurrent state per lightning layer, plus the positions.

A lightning layer needs no KV cache: its whole past is one ``[H, K, V]`` float32 state per sequence (K is twice the
head dim in an LRPE layer), so the memory of generation is constant in the number of tokens. Softmax-attention layers
of a hybrid model (``softmax_attention_every``) and of the LLaMA baseline keep ordinary growing key/value tensors here.

The position of every sequence lives **in the cache** (``positions [N]``), not in a module attribute as in the released
TNL / MiniMax code: two caches (two conversations, two beams) never interfere, and a batch may hold sequences of
different lengths (left padding).

Beam search and batch surgery act on dim 0 of every tensor: :meth:`reorder_cache` / :meth:`batch_select_indices`
(index select) and :meth:`batch_repeat_interleave`. The class is duck-typed to what ``transformers``' ``generate()``
reads from a cache (``get_seq_length``, ``is_compileable``, ``reorder_cache``), so it does not depend on the
transformers ``Cache`` base class, whose constructor changed between 4.x and 5.x.
"""

import torch


class TransNormerCache:
    """Per-layer generation state.

    Attributes:
        states: per layer, ``[N, H, K, V]`` float32 (lightning layers) or ``None``.
        keys, values: per layer, ``[N, S, H, D]`` in the activation dtype (softmax layers) or ``None``.
        key_mask: ``[N, S]`` bool, which cached positions are real tokens; ``None`` while no padding was seen
            (kept only by models with softmax layers: a lightning layer's state already excludes padding).
        positions: ``[N]`` int64, the position the next token of each sequence gets; ``None`` before the first call.
        seen_tokens: number of time steps (columns of ``input_ids``) processed so far.
    """

    is_compileable = False  # generate() must not try to compile around a cache whose tensors change shape

    def __init__(self, num_layers: int):
        self.states: list[torch.Tensor | None] = [None] * num_layers
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.key_mask: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.seen_tokens = 0

    def __len__(self) -> int:
        return len(self.states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Time steps processed so far (what transformers calls the past length)."""
        return self.seen_tokens

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return -1  # unbounded: the recurrent state has no length

    def _map(self, fn) -> None:
        for items in (self.states, self.keys, self.values):
            for i, t in enumerate(items):
                if t is not None:
                    items[i] = fn(t)
        if self.key_mask is not None:
            self.key_mask = fn(self.key_mask)
        if self.positions is not None:
            self.positions = fn(self.positions)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keeps rows ``indices`` ([N'] int) of every tensor, in that order (beam search, dropping finished rows)."""
        self._map(lambda t: t.index_select(0, indices.to(t.device)))

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """transformers' beam-search hook: row i of the new cache is row ``beam_idx[i]`` of the old one."""
        self.batch_select_indices(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeats every row ``repeats`` times in place (expanding prompts to beams or samples)."""
        self._map(lambda t: t.repeat_interleave(repeats, dim=0))

    def crop(self, max_length: int) -> None:
        raise NotImplementedError(
            "a recurrent state cannot be rolled back to an earlier length (assisted decoding is not supported)"
        )

    def memory_bytes(self) -> int:
        """Bytes held by the cache (constant during generation for a model without softmax layers)."""
        total = 0
        for items in (self.states, self.keys, self.values):
            total += sum(t.numel() * t.element_size() for t in items if t is not None)
        return total


def step_positions(B, T, device, position_ids, token_mask, cache, cu_seqlens) -> torch.Tensor:
    """Positions of the ``T`` new tokens, and the cache's offsets advanced past them.

    Each sequence counts its own real tokens from its cached offset (0 for a new cache): padded positions do not
    advance it, and packed sequences (``cu_seqlens [N + 1]``) each start at their own offset. ``position_ids
    [B, T]`` overrides all of this (e.g. global positions under sequence parallelism).

    Returns ``[B, T]`` int64 (``[1, T]`` with ``cu_seqlens``); sets ``cache.positions`` (``[B]`` or ``[N]``).
    """
    start = cache.positions if cache is not None else None
    if position_ids is not None:
        positions = position_ids.to(device=device, dtype=torch.long).expand(B, T)
        nxt = positions[:, -1] + 1
    elif cu_seqlens is not None:
        cu = cu_seqlens.to(device=device, dtype=torch.long)
        t = torch.arange(T, device=device)
        seg = torch.bucketize(t, cu[1:-1], right=True)
        if start is None:
            start = torch.zeros(cu.numel() - 1, dtype=torch.long, device=device)
        positions = (start[seg] + t - cu[seg])[None]
        nxt = start + (cu[1:] - cu[:-1])
    else:
        if start is None:
            start = torch.zeros(B, dtype=torch.long, device=device)
        if token_mask is None:
            positions = start[:, None] + torch.arange(T, device=device)
            nxt = start + T
        else:
            counts = torch.cumsum(token_mask.long(), dim=1)
            positions = start[:, None] + (counts - 1).clamp_min(0)
            nxt = start + counts[:, -1]
    if cache is not None:
        cache.positions = nxt
    return positions

def step_key_mask(B, T, device, token_mask, cache) -> torch.Tensor | None:
    """``[B, past + T]`` bool key mask of the softmax layers (``None`` while no padding was ever seen).

    ``token_mask [B, T]`` marks the real new tokens (``None``: all real); the result is stored in the cache.
    """
    previous = cache.key_mask if cache is not None else None
    past = cache.seen_tokens if cache is not None else 0
    if previous is None and token_mask is None:
        return None
    if previous is None:
        previous = torch.ones(B, past, dtype=torch.bool, device=device)
    current = token_mask if token_mask is not None else torch.ones(B, T, dtype=torch.bool, device=device)
    key_mask = torch.cat([previous, current], dim=1)
    if cache is not None:
        cache.key_mask = key_mask
    return key_mask
