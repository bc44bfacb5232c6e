"""TransNormerLLM (TNL) in one file: blocks, backbone, causal LM head, weight init, generation hooks.

    x = drop(embed(ids) · √d)                              (unless no_scale_embedding)
    for each block l:                                      pre-norm
        x = x + drop(token_mixer_l(SRMSNorm(x)))           TNLAttention (lightning, decay slopes of layer l);
                                                           LRPE in the layers of linear_use_lrpe_list; optionally a
                                                           softmax-attention layer every N (MiniMax-01 hybrid)
        x = x + drop(SGLU_l(SRMSNorm(x)))                  l3(l1 x ⊙ l2 x), no activation
    logits = lm_head(SRMSNorm(x))

``drop`` is dropout with ``config.dropout`` in training mode (0 by default, as the released models: the identity).

State-dict names are those of the released TransNormerLLM checkpoints (see CHECKPOINTS.md): ``model.embed_tokens``,
``model.layers.{i}.token_mixer.{qkvu_proj,out_proj,lrpe.theta}``, ``model.layers.{i}.channel_mixer.{l1,l2,l3}``,
``lm_head``; the norms have no weights.

Generation keeps a :class:`TransNormerCache` (a ``transformers.Cache``): one fp32 ``[N, H, K, V]`` state per layer
and the position of every sequence; a step costs the same at token 10 and at token 10 million, and ``generate()``
feeds one new token per step after the prompt. ``attention_mask`` marks padding (left padding for generation);
``cu_seqlens`` packs sequences of different lengths into one row for training. ``gradient_checkpointing_enable()``
(``activation_checkpointing_enable()`` on transformers 5) recomputes each block in the backward pass.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

from lightning_attention.models import registration
from lightning_attention.models.transnormer.cache import (
    CACHE_FIELD,
    TransNormerCache,
    cache_of,
    passed_cache,
    step_key_mask,
    step_positions,
)
from lightning_attention.models.transnormer.config import TransNormerConfig
from lightning_attention.models.transnormer.decode_graph import DecodeGraphs, drop_graphs, graphs_of
from lightning_attention.models.transnormer.inputs import check_labels, check_model_inputs
from lightning_attention.nn.lrpe import LRPE
from lightning_attention.nn.sglu import SGLU
from lightning_attention.nn.softmax_attention import SoftmaxAttention
from lightning_attention.nn.srmsnorm import RMSNorm, SRMSNorm
from lightning_attention.nn.tnl_attention import TNLAttention

IGNORE_INDEX = -100
# transformers 4.x reads a prompt in pieces (``prefill_chunk_size``) through this private method, giving every row
# the positions of the cache slots (``position_ids = cache_position``), blind to left padding; 5.x counts them from
# the attention mask
PREFILL_POSITIONS_IGNORE_PADDING = hasattr(GenerationMixin, "_prefill_chunking")
# a piece of a long inference forward is a whole number of the kernels' chunks (64 tokens) per sequence
PIECE_ALIGN = 64


def apply_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``config.dropout`` on an embedding or residual-branch output (``x`` itself when ``p`` is 0: no kernel, no RNG
    draw, so a model without dropout trains exactly as before the option existed)."""
    return F.dropout(x, p, training) if p else x


class TransNormerDecoderLayer(GradientCheckpointingLayer):
    """Pre-norm block ``x [B, T, d] -> [B, T, d]``: token mixer then SGLU channel mixer, each with a residual.

    ``x`` is passed positionally: under activation checkpointing it is the tensor the recomputation differentiates.
    """

    def __init__(self, config: TransNormerConfig, layer_idx: int, sequence_parallel_group=None):
        super().__init__()
        d, eps = config.decoder_embed_dim, config.norm_eps
        self.is_softmax = config.is_softmax_layer(layer_idx)
        if self.is_softmax:
            head_dim = config.hidden_dim // config.decoder_attention_heads
            rotary = int(head_dim * config.softmax_rotary_fraction) // 2 * 2
            self.token_mixer = SoftmaxAttention(
                d, config.decoder_attention_heads, head_dim, layer_idx,
                rotary_dim=rotary, rope_base=config.rope_theta, bias=config.bias,
            )
        else:
            self.token_mixer = TNLAttention(
                d, config.hidden_dim, config.decoder_attention_heads, layer_idx, config.decoder_layers,
                use_lrpe=bool(config.linear_use_lrpe_list[layer_idx]), variant=config.attention_variant,
                decay=config.decay_recipe, bias=config.bias, norm_eps=eps, lrpe_float32=config.lrpe_float32,
                learn_decay=config.learn_decay,
                sequence_parallel_group=sequence_parallel_group,
            )
        self.token_norm = SRMSNorm(d, eps=eps)
        self.channel_mixer = SGLU(d, config.glu_dim, bias=config.bias)
        self.channel_norm = SRMSNorm(d, eps=eps)
        self.dropout = config.dropout

    def forward(self, x, *, positions, token_mask, key_mask, cache, cu_seqlens) -> torch.Tensor:
        mixed = self.token_mixer(
            self.token_norm(x), positions=positions, token_mask=token_mask, key_mask=key_mask, cache=cache,
            cu_seqlens=cu_seqlens,
        )
        x = x + apply_dropout(mixed, self.dropout, self.training)
        return x + apply_dropout(self.channel_mixer(self.channel_norm(x)), self.dropout, self.training)


class TransNormerPreTrainedModel(PreTrainedModel):
    config_class = TransNormerConfig
    base_model_prefix = "model"
    _no_split_modules = ["TransNormerDecoderLayer"]
    _supports_sdpa = True
    supports_gradient_checkpointing = True
    _is_stateful = True  # a recurrent state cannot be rolled back: generate() refuses assisted decoding clearly
    # the embedding accessors (get/set_input_embeddings, get/set_output_embeddings) are transformers' own: they find
    # ``embed_tokens``, ``model.embed_tokens`` and ``lm_head`` by those names

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """The one weight-init function of the model (called per module by ``post_init``).

        ====================================  ==================================================================
        parameter                             initial value
        ====================================  ==================================================================
        embed_tokens.weight                   N(0, init_std)            (√d input scale is applied in forward)
        every nn.Linear weight                N(0, init_std)
        out_proj, channel_mixer.l3, o_proj    N(0, init_std / √(2L))    residual-branch outputs: GPT-2's scaled
                                                                        init (Radford et al. 2019, §2.3), so the
                                                                        residual stream's variance does not grow
                                                                        with the 2L branches; N(0, init_std) with
                                                                        scale_residual_init=False (the released
                                                                        TransNormerLLM code's init)
        every bias                            0
        token_mixer.lrpe.theta [H, 1, D]      10000^(-2i / (H·D))        (released TNL LRPE init)
        RMSNorm.weight (MiniMax variant)      1
        token_mixer.slope (buffer)            decay recipe (not learned, not saved)
        token_mixer.log_slope (learn_decay)   log of the decay recipe's slopes
        ====================================  ==================================================================

        Tensors that transformers already loaded from a checkpoint (``_is_hf_initialized``) are left alone.
        """
        std = self.config.init_std
        fresh = lambda t: not getattr(t, "_is_hf_initialized", False)  # noqa: E731
        if isinstance(module, nn.Linear):
            if getattr(module, "_is_residual_projection", False) and self.config.scale_residual_init:
                std = std / math.sqrt(2 * self.config.decoder_layers)
            if fresh(module.weight):
                nn.init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None and fresh(module.bias):
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            if fresh(module.weight):
                nn.init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, LRPE):
            if fresh(module.theta):
                module.reset_parameters()
        elif isinstance(module, RMSNorm):
            if fresh(module.weight):
                nn.init.ones_(module.weight)
        elif isinstance(module, TNLAttention):
            if not module.learn_decay or fresh(module.log_slope):
                module.reset_slope()


class TransNormerModel(TransNormerPreTrainedModel):
    """The TNL backbone: ``input_ids [B, T]`` -> ``last_hidden_state [B, T, d]`` (+ cache).

    Args:
        config: :class:`TransNormerConfig`.
        sequence_parallel_group: optional process group; every lightning layer then runs sequence parallel
            (each rank passes its contiguous slice of the sequence and the matching global ``position_ids``).
    """

    def __init__(self, config: TransNormerConfig, sequence_parallel_group=None):
        super().__init__(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.decoder_embed_dim)
        self.layers = nn.ModuleList(
            TransNormerDecoderLayer(config, i, sequence_parallel_group) for i in range(config.decoder_layers)
        )
        self.final_norm = SRMSNorm(config.decoder_embed_dim, eps=config.norm_eps)
        self.embed_scale = 1.0 if config.no_scale_embedding else math.sqrt(config.decoder_embed_dim)
        self.has_softmax_layers = any(layer.is_softmax for layer in self.layers)
        self.sequence_parallel = sequence_parallel_group is not None
        self.post_init()

    def inference_piece(self, B: int, T: int, cu_seqlens, output_hidden_states) -> int:
        """Tokens per sequence of each piece of a forward over ``[B, T]`` (``config.inference_piece_tokens`` over the
        batch, a multiple of :data:`PIECE_ALIGN`), or 0 for one piece: only without autograd (inference keeps no
        activations across pieces; training would keep them all anyway), and never for packed sequences, per-layer
        hidden states, hybrid models (their softmax layers see the whole prompt's keys at once) or sequence
        parallelism (each rank holds a slice already)."""
        budget = self.config.inference_piece_tokens
        if not budget or B * T <= budget or torch.is_grad_enabled() or cu_seqlens is not None:
            return 0
        if output_hidden_states or self.has_softmax_layers or self.sequence_parallel:
            return 0
        piece = max(PIECE_ALIGN, budget // B // PIECE_ALIGN * PIECE_ALIGN)
        return piece if piece < T else 0

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: TransNormerCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        cu_seqlens: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        past_key_values: TransNormerCache | None = None,
        **kwargs,
    ):
        """Args:
            input_ids: ``[B, T]`` token ids (or ``inputs_embeds [B, T, d]``).
            attention_mask: ``[B, T]`` or ``[B, past + T]`` (as ``generate`` passes it), 1 = token, 0 = padding.
            position_ids: ``[B, T]`` explicit positions (default: per sequence, from the cache and the mask).
            cache: a :class:`TransNormerCache` to continue from; filled in place. ``past_key_values`` is the same
                argument under its transformers 4.x name.
            use_cache: return a cache (default: ``config.use_cache`` in eval mode, False in training mode).
            cu_seqlens: ``[N + 1]`` int offsets of N sequences packed in one row (B == 1); each sequence
                starts from an empty state (or its own row of the cache) and never sees another.

        Returns:
            ``BaseModelOutputWithPast(last_hidden_state [B, T, d], cache, hidden_states)`` (the cache field is
            ``past_key_values`` on transformers 4.x).
        """
        check_model_inputs(self.config, input_ids, inputs_embeds, attention_mask, position_ids, cu_seqlens)
        cache = passed_cache(cache, past_key_values)
        if cache is not None and not isinstance(cache, TransNormerCache):
            raise TypeError(f"cache must be a TransNormerCache (the model creates one), got {type(cache).__name__}")
        if use_cache is None:
            use_cache = bool(getattr(self.config, "use_cache", True)) and not self.training
        B_in, T_in = (input_ids if inputs_embeds is None else inputs_embeds).shape[:2]
        if piece := self.inference_piece(B_in, T_in, cu_seqlens, output_hidden_states):
            return self._forward_in_pieces(
                piece, input_ids, inputs_embeds, attention_mask, position_ids, cache, use_cache
            )
        x = self._embed(input_ids, inputs_embeds)
        B, T, _ = x.shape
        given_cache = cache is not None
        if cache is None and use_cache:
            cache = TransNormerCache(self.config)
        if cu_seqlens is not None and cache is not None and self.has_softmax_layers:
            raise ValueError("a cache of a hybrid model cannot be filled from packed sequences")

        token_mask = None
        if attention_mask is not None:
            current = attention_mask[:, -T:].bool()
            if not bool(current.all()):  # one host sync; unpadded batches then take the plain paths
                token_mask = current
                # zeroed by selection: whatever padded positions hold (any embedding, NaN) never reaches a real token
                x = torch.where(token_mask[..., None], x, 0.0)
        positions = step_positions(B, T, x.device, position_ids, token_mask, cache, cu_seqlens)
        key_mask = None
        if self.has_softmax_layers:
            key_mask = step_key_mask(B, T, x.device, token_mask, cache)

        hidden_states = [] if output_hidden_states else None
        x = self._blocks(x, positions, token_mask, key_mask, cache, cu_seqlens, hidden_states)
        if cache is not None:
            cache.seen_tokens += T
        return BaseModelOutputWithPast(
            last_hidden_state=x,
            hidden_states=tuple(hidden_states) if hidden_states is not None else None,
            **{CACHE_FIELD: cache if use_cache or given_cache else None},
        )

    def _embed(self, input_ids, inputs_embeds) -> torch.Tensor:
        """``[B, T, d]``: the scaled token embeddings (or ``inputs_embeds``), with dropout in training mode."""
        x = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        return apply_dropout(x * self.embed_scale, self.config.dropout, self.training)

    def _blocks(self, x, positions, token_mask, key_mask, cache, cu_seqlens, hidden_states=None) -> torch.Tensor:
        """Every block then the final norm: ``x [B, T, d] -> [B, T, d]`` (each block's input, then the output,
        appended to ``hidden_states`` when it is a list)."""
        for layer in self.layers:
            if hidden_states is not None:
                hidden_states.append(x)
            x = layer(x, positions=positions, token_mask=token_mask, key_mask=key_mask, cache=cache,
                      cu_seqlens=cu_seqlens)
        x = self.final_norm(x)
        if hidden_states is not None:
            hidden_states.append(x)
        return x

    def decode_step(self, input_ids, positions, token_mask, cache) -> torch.Tensor:
        """The captured body of a graph-replayed decode step (``decode_graph.py``): what :meth:`forward` computes for
        one new token per row, without input checks, host reads or cache bookkeeping, so that it can be captured.

        Args:
            input_ids: ``[B, 1]``; positions: ``[B, 1]`` int64; token_mask: ``[B, 1]`` bool (False: padding, whose
                state row is left alone); cache: a :class:`TransNormerCache` whose lightning states ``[B, H, K, V]``
                are updated in place.

        Returns:
            ``[B, 1, d]``, as :meth:`forward`'s ``last_hidden_state``.
        """
        # selected, not multiplied, as in forward: a padded row's embedding never reaches its state
        x = torch.where(token_mask[..., None], self._embed(input_ids, None), 0.0)
        return self._blocks(x, positions, token_mask, None, cache, None)

    def _forward_in_pieces(self, piece, input_ids, inputs_embeds, attention_mask, position_ids, cache, use_cache):
        """:meth:`forward` over consecutive pieces of ``piece`` tokens, each continuing from the cache the previous
        one filled (a new one if none was given), the outputs ``[B, piece, d]`` concatenated: the recurrence of a
        lightning layer carries everything a later token needs across the cut."""
        x = input_ids if inputs_embeds is None else inputs_embeds
        T = x.shape[1]
        work = cache if cache is not None else TransNormerCache(self.config)
        if attention_mask is not None and bool(attention_mask[:, -T:].all()):
            # no padding among the new tokens (what a lightning layer reads of the mask): one host sync here instead
            # of one per piece
            attention_mask = None
        outputs = []
        for start in range(0, T, piece):
            end = min(start + piece, T)
            # attention_mask is [B, past + T] as generate() passes it: a piece sees the columns up to its last token
            mask = None if attention_mask is None else attention_mask[:, : attention_mask.shape[1] - T + end]
            out = self.forward(
                input_ids=None if input_ids is None else input_ids[:, start:end],
                inputs_embeds=None if inputs_embeds is None else inputs_embeds[:, start:end],
                attention_mask=mask,
                position_ids=None if position_ids is None else position_ids[..., start:end],
                cache=work,
                use_cache=True,
            )
            outputs.append(out.last_hidden_state)
        return BaseModelOutputWithPast(
            last_hidden_state=torch.cat(outputs, dim=1),
            **{CACHE_FIELD: work if use_cache or cache is not None else None},
        )


class TransNormerForCausalLM(TransNormerPreTrainedModel, GenerationMixin):
    """TNL with a language-model head: ``input_ids [B, T]`` -> ``logits [B, T, vocab]`` (+ loss, cache)."""

    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: TransNormerConfig, sequence_parallel_group=None):
        super().__init__(config)
        self.model = TransNormerModel(config, sequence_parallel_group=sequence_parallel_group)
        self.lm_head = nn.Linear(config.decoder_embed_dim, config.vocab_size, bias=False)
        self.post_init()
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: TransNormerCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        cu_seqlens: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        past_key_values: TransNormerCache | None = None,
        **kwargs,
    ):
        """Same arguments as :meth:`TransNormerModel.forward`, plus:

        Args:
            labels: ``[B, T]`` targets aligned with ``input_ids`` (shifted inside: position t predicts t + 1);
                ``-100`` is ignored. With ``cu_seqlens`` the last token of a sequence never predicts the first of
                the next. The loss is the mean cross entropy in float32.
            logits_to_keep: if > 0, logits only for the last ``logits_to_keep`` positions (generation).

        Returns:
            ``CausalLMOutputWithPast(loss, logits [B, T', vocab], cache, hidden_states)`` (the cache field is
            ``past_key_values`` on transformers 4.x; :func:`cache_of` reads it on both).
        """
        if labels is not None:
            check_labels(labels, input_ids if input_ids is not None else inputs_embeds)
        step_cache = past_key_values if cache is None else cache
        if self.config.decode_cuda_graphs and self.decode_graphs.applies(
            input_ids, inputs_embeds, attention_mask, position_ids, step_cache, cu_seqlens, output_hidden_states, labels
        ):
            check_model_inputs(self.config, input_ids, None, attention_mask, position_ids, None)
            step_cache = passed_cache(cache, past_key_values)
            logits = self.decode_graphs.step(input_ids, attention_mask, position_ids, step_cache)
            return CausalLMOutputWithPast(logits=logits, **{CACHE_FIELD: step_cache})
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
            past_key_values=past_key_values, inputs_embeds=inputs_embeds, use_cache=use_cache,
            cu_seqlens=cu_seqlens, output_hidden_states=output_hidden_states,
        )
        hidden = out.last_hidden_state
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = self.lm_head(hidden)
        loss = None
        if labels is not None:
            loss = causal_lm_loss(logits, labels, cu_seqlens)
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, hidden_states=out.hidden_states, **{CACHE_FIELD: cache_of(out)}
        )

    @property
    def decode_graphs(self) -> DecodeGraphs:
        """The captured decode steps (``config.decode_cuda_graphs``; created on first use)."""
        return graphs_of(self)

    def _apply(self, fn, *args, **kwargs):
        # .to() / .half() / .cuda() give the parameters new storage: a captured step would read the old one
        drop_graphs(self)
        return super()._apply(fn, *args, **kwargs)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # generate() must not create a DynamicCache: the model's own cache is a TransNormerCache

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        """transformers' own preparation, except that positions equal to the cache slots' (transformers 4.x's prefill
        in pieces) are dropped, so that they are counted from the attention mask as for a whole prompt: with left
        padding a row's real tokens start at position 0, and LRPE sees the same positions in pieces as at once."""
        positions, slots = kwargs.get("position_ids"), kwargs.get("cache_position")
        if (
            PREFILL_POSITIONS_IGNORE_PADDING and positions is not None and slots is not None
            and kwargs.get("attention_mask") is not None and positions.shape == (1, slots.numel())
            and torch.equal(positions[0], slots.to(positions.device))
        ):  # fmt: skip
            kwargs["position_ids"] = None
        return super().prepare_inputs_for_generation(input_ids, **kwargs)

    def _prepare_cache_for_generation(self, generation_config, model_kwargs: dict, *args, **kwargs):
        """``generate()``'s hook that creates the cache before the prompt is read: an empty
        :class:`TransNormerCache`, so that a prefill in pieces (``prefill_chunk_size``) fills one cache. A cache the
        caller passed, or ``use_cache=False``, goes to transformers' own checks."""
        if model_kwargs.get(CACHE_FIELD) is not None or generation_config.use_cache is False:
            return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)
        model_kwargs[CACHE_FIELD] = TransNormerCache(self.config)
        return None


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, cu_seqlens: torch.Tensor | None = None):
    """Mean next-token cross entropy, float32. ``logits [B, T, V]``, ``labels [B, T]`` (unshifted)."""
    targets = labels[:, 1:].clone()
    if cu_seqlens is not None:
        # position cu[i] - 1 is the last token of sequence i - 1: it must not predict the next sequence's start
        boundary = cu_seqlens[1:-1].to(device=targets.device, dtype=torch.long) - 1
        boundary = boundary[(boundary >= 0) & (boundary < targets.shape[1])]
        targets[:, boundary] = IGNORE_INDEX
    return F.cross_entropy(
        logits[:, :-1].float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE_INDEX
    )


registration.model_module_ready()  # into transformers' Auto classes if they are loaded (see registration.py)
