"""Released TransNormerLLM state-dict names: a synthetic checkpoint lands where CHECKPOINTS.md says."""

import pytest
import torch

from lightning_attention.models.transnormer import TransNormerConfig, TransNormerForCausalLM
from lightning_attention.models.transnormer.checkpoints import (
    load_released_state_dict,
    map_released_name,
    released_state_dict_shapes,
)


@pytest.mark.parametrize("bias", [False, True])
def test_synthetic_released_checkpoint_loads_where_the_mapping_says(bias):
    config = TransNormerConfig(vocab_size=256, decoder_embed_dim=32, decoder_layers=3, decoder_attention_heads=2,
                               glu_dim=48, bias=bias, linear_use_lrpe_list=[1, 0, 1])
    model = TransNormerForCausalLM(config)
    shapes = released_state_dict_shapes(config)
    torch.manual_seed(1)
    released = {name: torch.randn(shape) for name, shape in shapes.items()}
    released["model.slopes"] = torch.rand(2, 1, 1)  # rebuilt from the recipe, never loaded
    load_released_state_dict(model, released)
    params = dict(model.named_parameters())
    assert len(params) == len(shapes)  # every parameter comes from the checkpoint, none left at init
    for name, tensor in released.items():
        target = map_released_name(name)
        if target is None:
            continue
        assert torch.equal(params[target].detach(), tensor), name
    # the fused projection is split q | k | v | u: q of layer 0 is the first hidden_dim rows
    ids = torch.randint(0, 256, (1, 4))
    x = model.model.embed_tokens(ids) * model.model.embed_scale
    h = model.model.layers[0].token_norm(x)
    q = torch.nn.functional.linear(h, released["model.layers.0.token_mixer.qkvu_proj.weight"][:32],
                                   released.get("model.layers.0.token_mixer.qkvu_proj.bias", torch.zeros(128))[:32])
    q_model, *_ = model.model.layers[0].token_mixer.qkvu_proj(h).split(32, dim=-1)
    assert torch.equal(q, q_model)


def test_mismatched_checkpoint_is_rejected_by_name_and_shape():
    config = TransNormerConfig(vocab_size=256, decoder_embed_dim=32, decoder_layers=2, decoder_attention_heads=2,
                               glu_dim=48)
    model = TransNormerForCausalLM(config)
    released = {name: torch.zeros(shape) for name, shape in released_state_dict_shapes(config).items()}
    released["model.layers.1.channel_mixer.l1.weight"] = torch.zeros(47, 32)
    del released["lm_head.weight"]
    with pytest.raises(ValueError, match="missing \\['lm_head.weight'\\].*l1.weight"):
        load_released_state_dict(model, released)
