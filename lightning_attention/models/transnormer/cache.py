"""Generation cache of TransNormerLLM: one fp32 recurrent state per lightning layer, plus the positions.

A lightning layer needs no KV cache: its whole past is one ``[N, H, K, V]`` float32 state (K is twice the head dim
in an LRPE layer), so the memory of generation is constant in the number of tokens. Softmax-attention layers of a
hybrid model (``softmax_attention_every``) keep ordinary growing keys and values in a transformers ``DynamicLayer``.

:class:`TransNormerCache` is a ``transformers.Cache``: ``generate()`` (greedy, sampling, beam search, left padding)
passes it from step to step and reorders it for beam search; on transformers 5 the model reads it from the ``cache``
argument, on 4.x from ``past_key_values`` (:data:`CACHE_FIELD` is the name this installation uses).

The position of every sequence lives **in the cache** (``positions [N]``), not in a module attribute as in the
released TNL / MiniMax code: two caches (two conversations, two beams) never interfere, and a batch may hold
sequences of different lengths (left padding).
"""

import torch
from transformers import Cache
from transformers.cache_utils import DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

# transformers 5 renamed the cache argument and output field from `past_key_values` to `cache`
CACHE_FIELD = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
NO_ROLLBACK = ("a recurrent state cannot be rolled back to an earlier length (assisted and prompt-lookup decoding "
               "are not supported by TransNormerLLM)")


def passed_cache(cache, past_key_values):
    """The cache a forward call was given, under either name (``cache`` on transformers 5, ``past_key_values`` on
    4.x, where generate() passes it); both at once is an error."""
    if cache is not None and past_key_values is not None:
        raise ValueError("pass the cache once: `cache` and `past_key_values` are the same argument")
    return past_key_values if cache is None else cache


def cache_of(output) -> "TransNormerCache | None":
    """The cache of a model output, under the field name of the installed transformers (no deprecation warning)."""
    return getattr(output, CACHE_FIELD)


class LightningStateLayer:
    """The cache of one lightning layer: ``state [N, H, K, V]`` float32 (``None`` before the first call).

    Implements the per-layer hooks ``transformers.Cache`` calls (beam reordering, batch expansion and selection).
    """

    is_compileable = False
    is_croppable = False
    is_sliding = False

    def __init__(self):
        self.state: torch.Tensor | None = None

    def __repr__(self) -> str:
        return f"LightningStateLayer({None if self.state is None else tuple(self.state.shape)})"

    def _map(self, fn) -> None:
        if self.state is not None:
            self.state = fn(self.state)

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        self._map(lambda s: s.index_select(0, beam_idx.to(s.device)))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._map(lambda s: s[indices.to(s.device)])

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._map(lambda s: s.repeat_interleave(repeats, dim=0))

    def reset(self) -> None:
        self.state = None

    def crop(self, *args) -> None:
        raise ValueError(NO_ROLLBACK)

    def get_max_length(self) -> int:
        return -1  # the recurrent state has no length

    get_max_cache_shape = get_max_length  # the transformers 4.x name

    def offload(self) -> None:
        raise NotImplementedError("cache offloading is not supported: a recurrent state is small and constant")

    prefetch = offload


class TransNormerCache(Cache):
    """Per-layer generation state of a :class:`TransNormerForCausalLM`.

    Args:
        config: the model's :class:`TransNormerConfig` (which layers are lightning, which softmax).

    Attributes:
        layers: per layer, a :class:`LightningStateLayer` or a transformers ``DynamicLayer`` (keys and values
            ``[N, H, S, D]`` of a softmax layer).
        key_mask: ``[N, S]`` bool, which cached positions are real tokens; ``None`` while no padding was seen
            (kept only by models with softmax layers: a lightning layer's state already excludes padding).
        positions: ``[N]`` int64, the position the next token of each sequence gets; ``None`` before the first call.
        seen_tokens: number of time steps (columns of ``input_ids``, padding included) processed so far.
    """

    def __init__(self, config):
        layers = [DynamicLayer() if config.is_softmax_layer(i) else LightningStateLayer()
                  for i in range(config.decoder_layers)]
        super().__init__(layers=layers)
        self.key_mask: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.seen_tokens = 0

    # -- the lightning layers' states (the names transformers 5 gives linear-attention caches) -------------------
    def get_recurrent_state(self, layer_idx: int) -> torch.Tensor | None:
        """``[N, H, K, V]`` float32 state of lightning layer ``layer_idx``, or ``None`` before its first call."""
        return self.layers[layer_idx].state

    def update_recurrent_state(self, state: torch.Tensor, layer_idx: int) -> torch.Tensor:
        """Stores the new ``[N, H, K, V]`` state of lightning layer ``layer_idx`` (a decode step updates in place)."""
        self.layers[layer_idx].state = state
        return state

    @property
    def states(self) -> list[torch.Tensor | None]:
        """Every layer's recurrent state (``None`` for softmax layers and before the first call)."""
        return [getattr(layer, "state", None) for layer in self.layers]

    # -- what generate() reads --------------------------------------------------------------------------------
    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Time steps processed so far (what transformers calls the past length)."""
        return self.seen_tokens

    def get_max_length(self, layer_idx: int | None = None) -> int:
        return -1  # unbounded: the recurrent state has no length

    get_max_cache_shape = get_max_length  # the transformers 4.x name

    @property
    def is_compileable(self) -> bool:
        return False  # generate() must not compile around a cache whose tensors are replaced per call

    @property
    def is_croppable(self) -> bool:
        return False

    def _map_rows(self, fn) -> None:
        if self.key_mask is not None:
            self.key_mask = fn(self.key_mask)
        if self.positions is not None:
            self.positions = fn(self.positions)

    def reorder_cache(self, beam_idx: torch.Tensor) -> None:
        """Beam search: row i of the new cache is row ``beam_idx[i]`` of the old one."""
        super().reorder_cache(beam_idx)
        self._map_rows(lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keeps rows ``indices`` ([N'] int) of every tensor, in that order."""
        super().batch_select_indices(indices)
        self._map_rows(lambda t: t[indices.to(t.device)])

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeats every row ``repeats`` times in place (expanding prompts to beams or samples)."""
        super().batch_repeat_interleave(repeats)
        self._map_rows(lambda t: t.repeat_interleave(repeats, dim=0))

    def crop(self, *args) -> None:
        raise ValueError(NO_ROLLBACK)

    def reset(self) -> None:
        super().reset()
        self.key_mask = self.positions = None
        self.seen_tokens = 0

    def memory_bytes(self) -> int:
        """Bytes held by the cache (constant during generation for a model without softmax layers)."""
        tensors = [layer.state for layer in self.layers if isinstance(layer, LightningStateLayer)]
        tensors += [t for layer in self.layers if isinstance(layer, DynamicLayer) for t in (layer.keys, layer.values)]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def step_positions(B, T, device, position_ids, token_mask, cache, cu_seqlens) -> torch.Tensor:
    """Positions of the ``T`` new tokens, and the cache's offsets advanced past them.

    Each sequence counts its own real tokens from its cached offset (0 for a new cache): padded positions do not
    advance it, and packed sequences (``cu_seqlens [N + 1]``) each start at their own offset. ``position_ids
    [B, T]`` overrides all of this (``generate()`` passes them, computed the same way from the attention mask; the
    trainer passes global positions under sequence parallelism).

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
