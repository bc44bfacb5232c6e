"""Named model sizes for the two architectures, and building a model from (arch, config dict).

TNL and LLaMA of one preset share width, depth and heads and have the same parameter count: a TNL token mixer has
5·d² weights (q, k, v, u, out) and a LLaMA one 4·d² (q, k, v, o), so LLaMA's SwiGLU is d/3 wider than TNL's SGLU
(both have three d×ffn matrices). :func:`parameter_count` checks it.

========  =====  ======  =====  ========  ==========  =========================================================
preset    d      layers  heads  TNL glu   LLaMA ffn   use
========  =====  ======  =====  ========  ==========  =========================================================
smoke     32     2       2      64        75          CI: a handful of steps in seconds
tiny      128    4       4      352       395         default of ``lightning-attention train`` (2-core CPU, minutes)
40m       512    12      8      1408      1579        TNL vs LLaMA comparisons on a GPU (≈42M parameters)
400m      1024   24      8      2816      3157        the paper's smallest TNL (TransNormerLLM-385M's shape):
                                                      333M parameters in the blocks, 334M with the byte
                                                      tokenizer, 465M with the released 64000-token vocabulary
                                                      (untied embedding and head)
========  =====  ======  =====  ========  ==========  =========================================================
"""

from torch import nn

ARCHS = ("tnl", "llama")
# what the serving benchmark builds: TNL also with its decode steps replayed from CUDA graphs (decode_cuda_graphs)
SERVING_ARCHS = ("tnl", "tnl-graphs", "llama")
# options both architectures take, with one meaning (see TransNormerConfig's training options)
SHARED_OPTIONS = ("tie_word_embeddings", "dropout", "scale_residual_init")

PRESETS: dict[str, dict] = {
    "smoke": dict(d_model=32, n_layers=2, n_heads=2, ffn_dim=64),
    "tiny": dict(d_model=128, n_layers=4, n_heads=4, ffn_dim=352),
    "40m": dict(d_model=512, n_layers=12, n_heads=8, ffn_dim=1408),
    "400m": dict(d_model=1024, n_layers=24, n_heads=8, ffn_dim=2816),
}


def model_config(arch: str, preset: str = "tiny", vocab_size: int = 256, **overrides) -> dict:
    """The config dict of ``arch`` at ``preset`` size.

    ``overrides``: ``d_model``, ``n_layers``, ``n_heads``, ``ffn_dim`` (TNL glu width; LLaMA gets ``ffn_dim + d/3``)
    change the size; any other key is passed to the architecture's config unchanged (e.g. ``decay_recipe``,
    ``attention_variant``, ``softmax_attention_every`` for TNL; LLaMA takes only :data:`SHARED_OPTIONS`). ``None``
    values are ignored.
    """
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {tuple(PRESETS)}, got {preset!r}")
    size = dict(PRESETS[preset])
    extra = {}
    for key, value in overrides.items():
        if value is None:
            continue
        (size if key in size else extra)[key] = value
    d, layers, heads, ffn = size["d_model"], size["n_layers"], size["n_heads"], size["ffn_dim"]
    if arch == "tnl":
        return dict(vocab_size=vocab_size, decoder_embed_dim=d, decoder_layers=layers, decoder_attention_heads=heads,
                    hidden_dim=d, glu_dim=ffn, **extra)
    tnl_only = sorted(set(extra) - set(SHARED_OPTIONS))
    if tnl_only:
        raise ValueError(f"options {tnl_only} apply to --arch tnl only")
    return dict(vocab_size=vocab_size, hidden_size=d, num_hidden_layers=layers, num_attention_heads=heads,
                intermediate_size=ffn + round(d / 3), **extra)


def model_from_config(arch: str, config: dict, sequence_parallel_group=None) -> nn.Module:
    """A freshly initialised model of ``arch`` from a config dict (as :func:`model_config` or a checkpoint gives).

    ``sequence_parallel_group`` (TNL only): every lightning layer then runs sequence parallel over that group.
    """
    if arch == "tnl":
        from lightning_attention.models.transnormer import TransNormerConfig, TransNormerForCausalLM

        return TransNormerForCausalLM(
            TransNormerConfig.from_dict(dict(config)), sequence_parallel_group=sequence_parallel_group
        )
    if sequence_parallel_group is not None:
        raise ValueError(f"sequence parallelism needs the lightning-attention arch 'tnl', got {arch!r}")
    if arch == "llama":
        from lightning_attention.models.llama import llama_baseline

        return llama_baseline(config)
    raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")


def config_dict(model: nn.Module) -> dict:
    """The serialisable config of a model built by :func:`model_from_config`."""
    return model.config.to_dict()


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def parameter_counts(model: nn.Module) -> dict[str, int]:
    """``{"total", "embedding", "non_embedding"}`` parameters: ``embedding`` counts the input embedding and an untied
    LM head (each ``vocab × d``), so ``non_embedding`` compares models across vocabularies."""
    total = parameter_count(model)
    tables = {id(m.weight): m.weight.numel() for m in (model.get_input_embeddings(), model.get_output_embeddings())}
    embedding = sum(tables.values())
    return {"total": total, "embedding": embedding, "non_embedding": total - embedding}
