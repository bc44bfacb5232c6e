"""Configuration of TransNormerLLM; field names follow the released checkpoints' ``config.json``."""

from transformers import PretrainedConfig

from lightning_attention.models import registration


class TransNormerConfig(PretrainedConfig):
    """TransNormerLLM hyper-parameters (a transformers ``PretrainedConfig``).

    Released-checkpoint fields (defaults are TransNormerLLM's):
        vocab_size: 64000 in the released tokenizer; 256 for the byte-level tokenizer of ``lightning-attention train``.
        decoder_embed_dim: model width d.
        decoder_layers: number of blocks L (the decay schedule spans them).
        decoder_attention_heads: H; head dim ``hidden_dim // H``.
        hidden_dim: width of the token mixer (q, k, v, u each ``hidden_dim`` wide); TNL uses d.
        glu_dim: inner width of the SGLU channel mixer.
        linear_act_fun: activation of q and k; only the released "silu" (alias "swish") is implemented.
        norm_type: "simplermsnorm" (the released SRMSNorm, no weight) — kept for config.json compatibility.
        linear_use_lrpe_list: per layer, 1 = LRPE on q/k; default: first layer only (the paper's "Mix" setting).
        no_scale_embedding: if False (default) embeddings are multiplied by √d.
        bias: biases in every projection (released: False).
        init_std: std of the normal weight init (see ``model._init_weights``).
    Extensions of this library:
        norm_eps: eps of every RMS norm (released SRMSNorm: 1e-6; keeps all-zero rows finite).
        decay_recipe: "tnl" (``tnl_slopes``, the released checkpoints) or "paper" (``paper_slopes``, eq. 10).
        attention_variant: "tnl" or "minimax" (SiLU on q, k, v; weighted RMSNorm; sigmoid output gate).
        softmax_attention_every: 0 (none) or N: layers N-1, 2N-1, ... are causal softmax attention with RoPE
            (MiniMax-01: N = 8, one softmax layer after every 7 lightning layers).
        softmax_rotary_fraction: fraction of a softmax head's channels RoPE rotates (MiniMax-01: 0.5).
        rope_theta: RoPE base of the softmax layers (MiniMax-01: 1e7).
        tie_word_embeddings: share the input embedding with the LM head (released: False).
        inference_piece_tokens: a forward without autograd over more tokens than this (a long prompt, or a batch of
            them) runs through the model in pieces of at most this many tokens over the batch (``B × length``, the
            length a multiple of 64), each continuing from the cache the previous one filled: the same result, with
            activation memory bounded by the piece instead of the prompt (0: one piece; hybrid models, packed
            sequences and sequence parallelism always run one piece).
        decode_cuda_graphs: on CUDA, run each one-token decode step of ``TransNormerForCausalLM`` (every step of
            ``generate()`` after the prompt) as a replay of a CUDA graph captured per batch size, instead of launching
            its kernels one by one (``decode_graph.py`` says where it applies; the eager forward runs elsewhere).
            Off by default: each captured batch size keeps a graph and its state buffers.
    Training options (off by default; the released code has none of them):
        dropout: dropout on the embedding output and on the output of every residual branch (token mixer, channel
            mixer) in training mode, as fairseq's Transformer (the paper's baseline) applies it; 0 = none.
        scale_residual_init: True (default): the residual-branch outputs start from N(0, init_std / √(2L)) (GPT-2's
            scaled init); False: every weight from N(0, init_std), as the released TransNormerLLM code initialises.
        learn_decay: the lightning layers learn their decay slopes (a ``log_slope [H]`` parameter per layer,
            initialised to ``decay_recipe``'s) instead of keeping them fixed; not with sequence parallelism.
        lrpe_float32: run the LRPE layers' q, k, v and their lightning attention in float32 under autocast (the
            LRPE angles' gradient sums position-weighted products over every token: in bf16 it is noisy).
    """

    model_type = "transnormer"
    keys_to_ignore_at_inference = ["past_key_values"]
    attribute_map = {  # standard transformers names, read by generic utilities
        "hidden_size": "decoder_embed_dim",
        "num_hidden_layers": "decoder_layers",
        "num_attention_heads": "decoder_attention_heads",
        "intermediate_size": "glu_dim",
        "initializer_range": "init_std",
    }

    def __init__(
        self,
        vocab_size: int = 64000,
        decoder_embed_dim: int = 1024,
        decoder_layers: int = 24,
        decoder_attention_heads: int = 8,
        hidden_dim: int | None = None,
        glu_dim: int = 2816,
        linear_act_fun: str = "silu",
        norm_type: str = "simplermsnorm",
        linear_use_lrpe_list: list[int] | None = None,
        no_scale_embedding: bool = False,
        bias: bool = False,
        init_std: float = 0.02,
        norm_eps: float = 1e-6,
        decay_recipe: str = "tnl",
        attention_variant: str = "tnl",
        softmax_attention_every: int = 0,
        softmax_rotary_fraction: float = 0.5,
        rope_theta: float = 10000.0,
        tie_word_embeddings: bool = False,
        dropout: float = 0.0,
        scale_residual_init: bool = True,
        lrpe_float32: bool = False,
        learn_decay: bool = False,
        inference_piece_tokens: int = 65536,
        decode_cuda_graphs: bool = False,
        pad_token_id: int | None = None,
        bos_token_id: int | None = None,
        eos_token_id: int | None = None,
        use_cache: bool = True,
        **kwargs,
    ):
        self.vocab_size = vocab_size
        self.decoder_embed_dim = decoder_embed_dim
        self.decoder_layers = decoder_layers
        self.decoder_attention_heads = decoder_attention_heads
        self.hidden_dim = decoder_embed_dim if hidden_dim is None else hidden_dim
        self.glu_dim = glu_dim
        self.linear_act_fun = linear_act_fun
        self.norm_type = norm_type
        if linear_use_lrpe_list is None:
            linear_use_lrpe_list = [1] + [0] * (decoder_layers - 1)
        self.linear_use_lrpe_list = [int(x) for x in linear_use_lrpe_list]
        self.no_scale_embedding = no_scale_embedding
        self.bias = bias
        self.init_std = init_std
        self.norm_eps = norm_eps
        self.decay_recipe = decay_recipe
        self.attention_variant = attention_variant
        self.softmax_attention_every = softmax_attention_every
        self.softmax_rotary_fraction = softmax_rotary_fraction
        self.rope_theta = rope_theta
        self.dropout = float(dropout)
        self.scale_residual_init = bool(scale_residual_init)
        self.lrpe_float32 = bool(lrpe_float32)
        self.learn_decay = bool(learn_decay)
        self.inference_piece_tokens = int(inference_piece_tokens)
        self.decode_cuda_graphs = bool(decode_cuda_graphs)
        self.use_cache = use_cache
        # through the base class: transformers 4.x's constructor would reset them to its own defaults
        super().__init__(tie_word_embeddings=tie_word_embeddings, pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                         eos_token_id=eos_token_id, **kwargs)
        self.validate_fields()
        # transformers builds the config before it looks up the model class: make AutoModel* know it by then
        registration.ensure_models_registered()

    def validate_fields(self) -> None:
        """Raises ``ValueError`` naming the field for inconsistent values."""
        if self.hidden_dim % self.decoder_attention_heads:
            raise ValueError(
                f"hidden_dim ({self.hidden_dim}) must be divisible by decoder_attention_heads "
                f"({self.decoder_attention_heads})"
            )
        if len(self.linear_use_lrpe_list) != self.decoder_layers:
            raise ValueError(
                f"linear_use_lrpe_list needs one entry per layer ({self.decoder_layers}), "
                f"got {len(self.linear_use_lrpe_list)}"
            )
        if self.linear_act_fun not in ("silu", "swish"):
            raise ValueError(f"linear_act_fun must be 'silu' (the released models), got {self.linear_act_fun!r}")
        if self.attention_variant not in ("tnl", "minimax"):
            raise ValueError(f"attention_variant must be 'tnl' or 'minimax', got {self.attention_variant!r}")
        if self.decay_recipe not in ("tnl", "paper"):
            raise ValueError(f"decay_recipe must be 'tnl' or 'paper', got {self.decay_recipe!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.inference_piece_tokens < 0:
            raise ValueError(f"inference_piece_tokens must be >= 0, got {self.inference_piece_tokens}")
        if self.softmax_attention_every < 0:
            raise ValueError(f"softmax_attention_every must be >= 0, got {self.softmax_attention_every}")

    def is_softmax_layer(self, layer_idx: int) -> bool:
        """Whether block ``layer_idx`` uses softmax attention (hybrid models) instead of lightning attention."""
        n = self.softmax_attention_every
        return n > 0 and (layer_idx + 1) % n == 0
