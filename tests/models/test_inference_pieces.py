"""A long input without autograd runs through TNL in pieces of at most ``config.inference_piece_tokens`` tokens over
the batch, each continuing from the cache the previous one filled: the same logits, cache and generated tokens as one
piece (float64), no layer ever sees more than a piece (what bounds the activation memory of a long prompt), and one
piece wherever pieces would change the result or keep nothing (autograd, packed sequences, per-layer hidden states,
hybrid models)."""

import pytest
import torch

from lightning_attention.models.transnormer import TransNormerConfig, TransNormerForCausalLM, cache_of
from tests.models.helpers import left_pad, tiny_tnl

from lightning_attention.models.transnormer.model import PIECE_ALIGN

PIECE = PIECE_ALIGN  # tokens per sequence of a piece at batch 3 with the budget below
BUDGET = 3 * PIECE


def _layer_lengths(model) -> list[int]:
    """Installs a hook recording the token count of every block call of ``model``; returns the list it fills."""
    lengths = []
    for layer in model.model.layers:
        layer.register_forward_pre_hook(lambda module, args, kwargs: lengths.append(args[0].shape[1]), with_kwargs=True)
    return lengths


def _run(model, budget: int, **inputs):
    model.config.inference_piece_tokens = budget
    with torch.no_grad():
        return model(**inputs, use_cache=True)


def _assert_same(a, b):
    torch.testing.assert_close(a.logits, b.logits, rtol=0, atol=1e-12)
    ca, cb = cache_of(a), cache_of(b)
    assert torch.equal(ca.positions, cb.positions) and ca.seen_tokens == cb.seen_tokens
    for la, lb in zip(ca.layers, cb.layers, strict=True):
        torch.testing.assert_close(la.state, lb.state, rtol=0, atol=1e-12)


def _prompts(lengths=(200, 151, 90)) -> tuple[torch.Tensor, torch.Tensor]:
    return left_pad([[1 + (7 * i + n) % 250 for i in range(n)] for n in lengths])


@pytest.mark.parametrize("variant", ["plain", "left-padded", "unpadded-mask", "positions", "embeddings", "continued"])
def test_pieces_equal_one_piece(variant):
    model = tiny_tnl(linear_use_lrpe_list=[1, 0])  # LRPE: positions must carry across the cut
    ids, mask = _prompts()
    inputs = {"input_ids": ids}
    if variant == "left-padded":
        inputs["attention_mask"] = mask
    elif variant == "unpadded-mask":  # all ones: read once, then left out of the pieces
        inputs["attention_mask"] = torch.ones_like(mask)
    elif variant == "positions":
        inputs["position_ids"] = torch.arange(100, 300).expand(3, 200)
    elif variant == "embeddings":
        inputs = {"inputs_embeds": model.model.embed_tokens(ids).detach()}
    lengths = _layer_lengths(model)
    if variant == "continued":  # a cache handed in: the pieces continue it, past columns of the mask included
        whole = [model(ids[:, :9], use_cache=True) for _ in range(2)]
        full = torch.cat([torch.ones(3, 9, dtype=torch.long), mask], dim=1)
        got = _run(model, BUDGET, input_ids=ids, attention_mask=full, cache=cache_of(whole[0]))
        expected = _run(model, 0, input_ids=ids, attention_mask=full, cache=cache_of(whole[1]))
    else:
        got = _run(model, BUDGET, **inputs)
        expected = _run(model, 0, **inputs)
    _assert_same(got, expected)
    pieces = lengths[: len(lengths) - len(model.model.layers)]  # the one-piece run's calls come last
    assert pieces[-2:] == [200 - 3 * PIECE] * 2 and max(pieces) == PIECE  # 64, 64, 64, 8 per layer


def test_generate_gives_the_same_tokens_in_pieces():
    model = tiny_tnl()
    ids, mask = _prompts((150, 70))
    runs = []
    for budget in (0, 2 * PIECE):
        model.config.inference_piece_tokens = budget
        runs.append(model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False))
    assert torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("case", ["autograd", "hidden-states", "packed", "hybrid", "short"])
def test_one_piece_where_pieces_do_not_apply(case):
    model = tiny_tnl(softmax_attention_every=2) if case == "hybrid" else tiny_tnl()
    model.config.inference_piece_tokens = PIECE
    lengths = _layer_lengths(model)
    ids = torch.randint(1, 256, (1, 3 * PIECE if case != "short" else PIECE))
    kwargs = {}
    if case == "hidden-states":
        kwargs["output_hidden_states"] = True
    elif case == "packed":
        kwargs["cu_seqlens"] = torch.tensor([0, 100, 3 * PIECE])
    with torch.set_grad_enabled(case == "autograd"):
        model(ids, use_cache=case != "packed", **kwargs)
    assert lengths == [ids.shape[1]] * len(model.model.layers)


@pytest.mark.parametrize("B, T, piece", [(1, 100_000, 65536), (64, 32768, 1024), (3, 30_000, 21824), (2000, 100, 64),
                                         (2000, 64, 0), (4, 16384, 0)])  # fmt: skip
def test_piece_length_from_the_token_budget(B, T, piece):
    """Per sequence: the budget over the batch, down to a multiple of 64, at least 64; one piece when the whole call
    fits the budget or a piece would be the whole sequence."""
    model = tiny_tnl()
    with torch.no_grad():
        assert model.model.inference_piece(B, T, None, False) == piece


def test_piece_size_is_a_validated_config_field(tmp_path):
    with pytest.raises(ValueError, match="inference_piece_tokens"):
        TransNormerConfig(inference_piece_tokens=-1)
    assert TransNormerConfig().inference_piece_tokens == 65536
    model = tiny_tnl(inference_piece_tokens=4096)
    model.save_pretrained(tmp_path)
    assert TransNormerForCausalLM.from_pretrained(tmp_path).config.inference_piece_tokens == 4096
