"""A long input without autograd runs through TNL in pieces of ``config.inference_piece_size`` tokens, each continuing
from the cache the previous one filled: the same logits, cache and generated tokens as one piece (float64), no layer
ever sees more than a piece (what bounds the activation memory of a long prompt), and one piece wherever pieces
would change the result or keep nothing (autograd, packed sequences, per-layer hidden states, hybrid models)."""

import pytest
import torch

from lightning_attention.models.transnormer import TransNormerConfig, TransNormerForCausalLM, cache_of
from tests.models.helpers import left_pad, tiny_tnl

PIECE = 16


def _layer_lengths(model) -> list[int]:
    """Installs a hook recording the token count of every block call of ``model``; returns the list it fills."""
    lengths = []
    for layer in model.model.layers:
        layer.register_forward_pre_hook(lambda module, args, kwargs: lengths.append(args[0].shape[1]), with_kwargs=True)
    return lengths


def _run(model, piece: int, **inputs):
    model.config.inference_piece_size = piece
    with torch.no_grad():
        return model(**inputs, use_cache=True)


def _assert_same(a, b):
    torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=1e-12)
    ca, cb = cache_of(a), cache_of(b)
    assert torch.equal(ca.positions, cb.positions) and ca.seen_tokens == cb.seen_tokens
    for la, lb in zip(ca.layers, cb.layers, strict=True):
        torch.testing.assert_close(la.state, lb.state, rtol=0, atol=1e-12)


@pytest.mark.parametrize("variant", ["plain", "left-padded", "positions", "embeddings", "continued"])
def test_pieces_equal_one_piece(variant):
    model = tiny_tnl(linear_use_lrpe_list=[1, 0])  # LRPE: positions must carry across the cut
    ids, mask = left_pad([list(range(1, 51)), list(range(3, 40)), list(range(7, 27))])
    inputs = {"input_ids": ids}
    if variant == "left-padded":
        inputs["attention_mask"] = mask
    elif variant == "positions":
        inputs["position_ids"] = torch.arange(100, 150).expand(3, 50)
    elif variant == "embeddings":
        inputs = {"inputs_embeds": model.model.embed_tokens(ids).detach()}
    lengths = _layer_lengths(model)
    if variant == "continued":  # a cache handed in: the pieces continue it, past columns of the mask included
        whole = [model(ids[:, :9], use_cache=True) for _ in range(2)]
        full = torch.cat([torch.ones(3, 9, dtype=torch.long), mask], dim=1)
        got = _run(model, PIECE, input_ids=ids, attention_mask=full, cache=cache_of(whole[0]))
        expected = _run(model, 0, input_ids=ids, attention_mask=full, cache=cache_of(whole[1]))
    else:
        got = _run(model, PIECE, **inputs)
        expected = _run(model, 0, **inputs)
    _assert_same(got, expected)
    pieces = lengths[: len(lengths) - len(model.model.layers)]  # the one-piece run's calls come last
    assert pieces[-2:] == [50 - 3 * PIECE] * 2 and max(pieces) == PIECE  # 16, 16, 16, 2 per layer


def test_generate_gives_the_same_tokens_in_pieces():
    model = tiny_tnl()
    ids, mask = left_pad([list(range(5, 45)), list(range(9, 30))])
    runs = []
    for piece in (0, PIECE):
        model.config.inference_piece_size = piece
        runs.append(model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False))
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("case", ["autograd", "hidden-states", "packed", "hybrid", "short"])
def test_one_piece_where_pieces_do_not_apply(case):
    model = tiny_tnl(softmax_attention_every=2) if case == "hybrid" else tiny_tnl()
    model.config.inference_piece_size = PIECE
    lengths = _layer_lengths(model)
    ids = torch.randint(1, 256, (1, 40 if case != "short" else PIECE))
    kwargs = {}
    if case == "hidden-states":
        kwargs["output_hidden_states"] = True
    elif case == "packed":
        kwargs["cu_seqlens"] = torch.tensor([0, 25, 40])
    with torch.set_grad_enabled(case == "autograd"):
        model(ids, use_cache=case != "packed", **kwargs)
    assert lengths == [ids.shape[1]] * len(model.model.layers)


def test_piece_size_is_a_validated_config_field(tmp_path):
    with pytest.raises(ValueError, match="inference_piece_size"):
        TransNormerConfig(inference_piece_size=-1)
    assert TransNormerConfig().inference_piece_size == 16384
    model = tiny_tnl(inference_piece_size=4096)
    model.save_pretrained(tmp_path)
    assert TransNormerForCausalLM.from_pretrained(tmp_path).config.inference_piece_size == 4096
