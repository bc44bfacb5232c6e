"""State-dict names of the released TransNormerLLM checkpoints and how they map onto this model.

The released ``OpenNLPLab/TransNormerLLM-{385M,1B,7B}`` checkpoints (HF remote code ``modeling_transnormer.py``)
name their tensors as in :func:`released_state_dict_shapes`. This model uses the same module names, so the mapping is
the identity on every parameter; it is written out (here and in CHECKPOINTS.md) so that a checkpoint can be checked
before it is loaded, and so that the places where the two differ are explicit:

- the norms (``token_norm``, ``channel_norm``, ``token_mixer.norm``, ``final_norm``) are SRMSNorm without weights:
  no entries on either side;
- the decay slopes are not checkpoint entries: the released code rebuilds them from the head count and the layer
  index (its ``slopes`` attribute), and so does this model (non-persistent ``slope`` buffer); a stray ``slopes`` /
  ``slope`` entry is dropped;
- the released code's LRPE ``index`` is a plain attribute (no entry).
"""

import re

import torch

from lightning_attention.models.transnormer.config import TransNormerConfig

# (released name pattern, this model's name pattern, shape and notes): the table of CHECKPOINTS.md
NAME_MAP: list[tuple[str, str, str]] = [
    ("model.embed_tokens.weight", "model.embed_tokens.weight", "[vocab_size, d]"),
    ("model.layers.{i}.token_mixer.qkvu_proj.weight", "model.layers.{i}.token_mixer.qkvu_proj.weight",
     "[4·hidden_dim, d]; rows q | k | v | u in that order"),
    ("model.layers.{i}.token_mixer.qkvu_proj.bias", "model.layers.{i}.token_mixer.qkvu_proj.bias",
     "[4·hidden_dim], only with bias=True"),
    ("model.layers.{i}.token_mixer.out_proj.weight", "model.layers.{i}.token_mixer.out_proj.weight", "[d, hidden_dim]"),
    ("model.layers.{i}.token_mixer.out_proj.bias", "model.layers.{i}.token_mixer.out_proj.bias", "[d], bias=True"),
    ("model.layers.{i}.token_mixer.lrpe.theta", "model.layers.{i}.token_mixer.lrpe.theta",
     "[H, 1, hidden_dim/H], layers with linear_use_lrpe_list[i] = 1"),
    ("model.layers.{i}.channel_mixer.l1.weight", "model.layers.{i}.channel_mixer.l1.weight", "[glu_dim, d]"),
    ("model.layers.{i}.channel_mixer.l2.weight", "model.layers.{i}.channel_mixer.l2.weight", "[glu_dim, d]"),
    ("model.layers.{i}.channel_mixer.l3.weight", "model.layers.{i}.channel_mixer.l3.weight", "[d, glu_dim]"),
    ("model.layers.{i}.channel_mixer.l{j}.bias", "model.layers.{i}.channel_mixer.l{j}.bias", "bias=True"),
    ("lm_head.weight", "lm_head.weight", "[vocab_size, d]"),
]

DROPPED = re.compile(r"(^|\.)(slopes?|index)$")  # rebuilt from the config, never loaded


def released_state_dict_shapes(config: TransNormerConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name of a released TNL checkpoint with ``config``, and its shape (TNL variant, no hybrid)."""
    d, hidden, glu, heads = config.decoder_embed_dim, config.hidden_dim, config.glu_dim, config.decoder_attention_heads
    shapes = {"model.embed_tokens.weight": (config.vocab_size, d), "lm_head.weight": (config.vocab_size, d)}
    for i in range(config.decoder_layers):
        p = f"model.layers.{i}."
        shapes[p + "token_mixer.qkvu_proj.weight"] = (4 * hidden, d)
        shapes[p + "token_mixer.out_proj.weight"] = (d, hidden)
        if config.linear_use_lrpe_list[i]:
            shapes[p + "token_mixer.lrpe.theta"] = (heads, 1, hidden // heads)
        shapes[p + "channel_mixer.l1.weight"] = (glu, d)
        shapes[p + "channel_mixer.l2.weight"] = (glu, d)
        shapes[p + "channel_mixer.l3.weight"] = (d, glu)
        if config.bias:
            shapes[p + "token_mixer.qkvu_proj.bias"] = (4 * hidden,)
            shapes[p + "token_mixer.out_proj.bias"] = (d,)
            for j in (1, 2):
                shapes[p + f"channel_mixer.l{j}.bias"] = (glu,)
            shapes[p + "channel_mixer.l3.bias"] = (d,)
    return shapes


def map_released_name(name: str) -> str | None:
    """This model's name for a released tensor name, or ``None`` for entries that are rebuilt, not loaded."""
    if DROPPED.search(name):
        return None
    return name  # identical module names, see NAME_MAP


def load_released_state_dict(model, state_dict: dict[str, torch.Tensor]) -> None:
    """Loads a released-format state dict into a ``TransNormerForCausalLM``, checking names and shapes.

    Raises ``ValueError`` listing missing, unexpected and mis-shaped tensors (nothing is loaded then).
    """
    mapped = {}
    for name, tensor in state_dict.items():
        target = map_released_name(name)
        if target is not None:
            mapped[target] = tensor
    own = model.state_dict()
    missing = sorted(set(own) - set(mapped))
    unexpected = sorted(set(mapped) - set(own))
    misshaped = sorted(n for n in set(own) & set(mapped) if tuple(own[n].shape) != tuple(mapped[n].shape))
    if missing or unexpected or misshaped:
        raise ValueError(f"checkpoint does not fit: missing {missing}, unexpected {unexpected}, shape {misshaped}")
    model.load_state_dict(mapped, strict=True)
