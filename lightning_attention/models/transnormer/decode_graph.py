"""The one-token decode step of :class:`TransNormerForCausalLM` replayed from a CUDA graph.

A decode step at small batch is bound by the host: every block launches a dozen small kernels (projections, SiLU,
LRPE, the recurrent step, norms, the SGLU), each costing more time to launch than to run. Captured once per
(batch, device, dtype, autocast) and replayed, the step costs one graph launch and a few copies
(docs/performance.md, "CUDA-graph decode steps"). It is what ``config.decode_cuda_graphs = True`` turns on;
``generate()`` then uses it for every step after the prompt.

What a replay reads and writes lives in buffers the captured step owns (``Step``): the token ids ``[B, 1]``, the
positions ``[B, 1]``, the token mask ``[B, 1]`` (the last column of the attention mask) and one state
``[B, H, K, V]`` per lightning layer (float32, as the cache keeps it), which the recurrent step updates in place. A
cache stepping through a graph is *bound* to it: its layers' states become the graph's buffers (copied in once, and
again whenever beam search or batch selection replaces a state), so consecutive steps copy nothing. When another
cache binds, the previous one gets copies of its states back first: two caches never share a state.

The step applies only where it is exact and capture-safe (:meth:`DecodeGraphs.applies`): one new token per row from
``input_ids``, no autograd, eval mode, a lightning-only model (a softmax layer's keys and values grow), no sequence
parallelism, no per-layer hidden states, no labels, and states already filled by a prefill. Anything else runs the
eager forward. The graph reads the parameters where they are: ``model.to(...)`` / ``.half()`` drop the graphs
(``TransNormerForCausalLM._apply``); a caller who assigns new parameter tensors by hand calls
``model.decode_graphs.clear()``.
"""

import weakref

import torch

from lightning_attention.backend import value_checks_enabled
from lightning_attention.models.transnormer.cache import LightningStateLayer, TransNormerCache
from lightning_attention.utils.cuda_graph import capture


class CudaGraphReplay:
    """``body()`` captured in a ``torch.cuda.CUDAGraph`` after two eager warm-up runs on a side stream (they compile
    and autotune every kernel, and let cuBLAS pick its workspaces, before capture); :meth:`replay` runs the graph and
    returns the tensor ``body`` returned during capture, which every replay overwrites."""

    device_types = ("cuda",)

    def __init__(self, body, device: torch.device):
        # a memory pool of its own: the steps of different batch sizes may replay in any order
        self.graph, self.output = capture(body, device, warmups=2)

    def replay(self) -> torch.Tensor:
        self.graph.replay()
        return self.output


class EagerReplay:
    """The same interface without a graph: :meth:`replay` runs ``body()`` again. It checks on any device (the CPU
    tests) that the step reads and writes only its own buffers, which is what makes a graph replay exact."""

    device_types = ("cpu", "cuda")

    def __init__(self, body, device: torch.device):
        self.body = body

    def replay(self) -> torch.Tensor:
        return self.body()


class Step:
    """One captured decode step for batch ``B``: its input buffers, its states and the replay.

    Buffers: ``ids [B, 1]`` int64, ``positions [B, 1]`` int64, ``mask [B, 1]`` bool, ``states``: per lightning layer
    ``[B, H, K, V]`` in the cache's state dtype (``None`` for other layers). ``replay()`` returns logits
    ``[B, 1, vocab]``.
    """

    def __init__(self, lm, cache: TransNormerCache, B: int, device: torch.device, replay_cls):
        self.ids = torch.zeros(B, 1, dtype=torch.long, device=device)
        self.positions = torch.zeros(B, 1, dtype=torch.long, device=device)
        self.mask = torch.ones(B, 1, dtype=torch.bool, device=device)
        self.mask_is_ones = True  # what the buffer holds, so that an unpadded step skips refilling it
        self.states = [None if s is None else torch.zeros_like(s) for s in cache.states]
        # the cache the captured step reads its states from: the buffers above, never a caller's tensors
        self.own_cache = TransNormerCache(lm.config)
        for layer, state in zip(self.own_cache.layers, self.states):
            if state is not None:
                layer.state = state
        self.owner = None  # weak reference to the caller's cache bound to the buffers

        lm_ref = weakref.ref(lm)  # the model owns the step (through graphs_of), not the other way round

        def body() -> torch.Tensor:
            model = lm_ref()
            return model.lm_head(model.model.decode_step(self.ids, self.positions, self.mask, self.own_cache))

        self.replay = replay_cls(body, device).replay

    def release(self) -> None:
        """Gives the bound cache, if it is still alive, copies of the states it holds in the step's buffers."""
        owner = self.owner() if self.owner is not None else None
        if owner is not None:
            for layer, state in zip(owner.layers, self.states):
                if state is not None and getattr(layer, "state", None) is state:
                    layer.state = state.clone()
        self.owner = None

    def bind(self, cache: TransNormerCache) -> None:
        """Makes ``cache``'s lightning states the step's buffers (copying the states that are not yet)."""
        if self.owner is not None and self.owner() is not cache:
            self.release()  # the previous cache keeps its states before the buffers take this cache's
        for layer, state in zip(cache.layers, self.states):
            if state is not None and layer.state is not state:
                state.copy_(layer.state)
                layer.state = state
        self.owner = weakref.ref(cache)


class DecodeGraphs:
    """The captured decode steps of one :class:`TransNormerForCausalLM`, per (batch, device, dtype, autocast);
    :func:`graphs_of` gives a model's.

    Args:
        lm: the model (held weakly).
        replay_cls: :class:`CudaGraphReplay` (the default, CUDA only) or :class:`EagerReplay`.
    """

    def __init__(self, lm, replay_cls=CudaGraphReplay):
        self._lm = weakref.ref(lm)
        self.replay_cls = replay_cls
        self.steps: dict[tuple, Step] = {}

    def clear(self) -> None:
        """Drops every captured step and its buffers; caches bound to one keep copies of their states."""
        for step in self.steps.values():
            step.release()
        self.steps.clear()

    def applies(self, input_ids, inputs_embeds, attention_mask, position_ids, cache, cu_seqlens,
                output_hidden_states, labels) -> bool:
        """Whether this forward call is a decode step the captured graph computes exactly (module docstring)."""
        lm = self._lm()
        if lm is None or inputs_embeds is not None or input_ids is None or labels is not None:
            return False
        if cu_seqlens is not None or output_hidden_states or lm.training or torch.is_grad_enabled():
            return False
        if input_ids.ndim != 2 or input_ids.shape[1] != 1 or input_ids.device.type not in self.replay_cls.device_types:
            return False
        if lm.model.has_softmax_layers or lm.model.sequence_parallel or not isinstance(cache, TransNormerCache):
            return False
        if value_checks_enabled(input_ids) and input_ids.device.type != "cpu":
            return False  # debug mode reads values on the host: a sync that capture forbids
        if input_ids.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return False
        if torch.compiler.is_compiling():
            return False
        B = input_ids.shape[0]
        if position_ids is None and (cache.positions is None or cache.positions.shape != (B,)):
            return False
        if attention_mask is not None and (attention_mask.ndim != 2 or attention_mask.shape[0] != B):
            return False  # the model's input checks name the problem
        states = [layer.state for layer in cache.layers if isinstance(layer, LightningStateLayer)]
        return bool(states) and all(
            s is not None and s.shape[0] == B and s.device == input_ids.device
            for s in states
        )

    def step(self, input_ids, attention_mask, position_ids, cache: TransNormerCache) -> torch.Tensor:
        """Runs one decode step through the captured graph (capturing it on first use).

        Args:
            input_ids: ``[B, 1]`` the new token of each row.
            attention_mask: ``[B, past + 1]`` or ``[B, 1]`` (1 = token), or ``None``; only the last column is read.
            position_ids: ``[B, 1]`` / ``[1, 1]`` explicit positions, or ``None`` (the cache's).
            cache: the :class:`TransNormerCache` being continued; advanced as the eager forward advances it.

        Returns:
            logits ``[B, 1, vocab]`` (a tensor of the caller's, not the graph's buffer).
        """
        lm = self._lm()
        B, device = input_ids.shape[0], input_ids.device
        key = (B, device, lm.lm_head.weight.dtype, torch.is_autocast_enabled(device.type),
               torch.get_autocast_dtype(device.type), torch.is_inference_mode_enabled(),
               tuple(None if s is None else tuple(s.shape) for s in cache.states))
        step = self.steps.get(key)
        if step is None:
            step = self.steps[key] = Step(lm, cache, B, device, self.replay_cls)
        step.ids.copy_(input_ids)
        if position_ids is not None:
            step.positions.copy_(position_ids[..., -1:].reshape(-1, 1).expand(B, 1))
        else:
            step.positions.copy_(cache.positions[:, None])
        if attention_mask is not None:
            step.mask.copy_(attention_mask[:, -1:])
            step.mask_is_ones = False
        elif not step.mask_is_ones:
            step.mask.fill_(True)
            step.mask_is_ones = True
        step.bind(cache)
        logits = step.replay().clone()
        # the positions the eager forward leaves in the cache: one past explicit positions, else advanced by real tokens
        cache.positions = step.positions[:, 0] + (1 if position_ids is not None else step.mask[:, 0])
        cache.seen_tokens += 1
        return logits


# kept here, not as an attribute of the model: copying or pickling a model must not copy its CUDA graphs
_GRAPHS: "weakref.WeakKeyDictionary[torch.nn.Module, DecodeGraphs]" = weakref.WeakKeyDictionary()


def graphs_of(lm) -> DecodeGraphs:
    """The :class:`DecodeGraphs` of ``lm`` (created empty on first use)."""
    graphs = _GRAPHS.get(lm)
    if graphs is None:
        graphs = _GRAPHS[lm] = DecodeGraphs(lm)
    return graphs


def drop_graphs(lm) -> None:
    """Drops ``lm``'s captured steps, if any (bound caches keep copies of their states)."""
    graphs = _GRAPHS.pop(lm, None)
    if graphs is not None:
        graphs.clear()
