"""Padding never reaches a real token: garbage (NaN) at padded positions leaves the real tokens' outputs and every
gradient as they are, for right and left padding, in the model and in its token mixer; and the model's inputs are
checked before any layer runs."""

import pytest
import torch

from lightning_attention.nn.tnl_attention import TNLAttention
from tests.models.helpers import VARIANTS, tiny_tnl

B, T = 2, 12
LENGTHS = [12, 7]  # row 1 padded by 5


def _mask(side: str) -> torch.Tensor:
    mask = torch.zeros(B, T, dtype=torch.bool)
    for b, n in enumerate(LENGTHS):
        if side == "right":
            mask[b, :n] = True
        else:
            mask[b, T - n :] = True
    return mask


def _with_padding(x: torch.Tensor, mask: torch.Tensor, fill: float) -> torch.Tensor:
    return torch.where(mask.reshape(B, T, *([1] * (x.dim() - 2))), x, fill)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("variant", ["tnl", "minimax"])
def test_token_mixer_ignores_garbage_in_padding(variant, side):
    """TNLAttention with ``token_mask``: NaN in the padded inputs changes no real output and no gradient of a real
    input (q, k, v are selected to 0 there and so is the output, so the backward sends 0 into the op)."""
    torch.manual_seed(0)
    layer = TNLAttention(32, 32, 2, 0, 2, variant=variant, use_lrpe=True).double()
    mask = _mask(side)
    x = torch.randn(B, T, 32, dtype=torch.float64)
    results = []
    for fill in (0.0, float("nan")):
        xi = _with_padding(x, mask, fill).requires_grad_()
        y = layer(xi, token_mask=mask)
        (grad,) = torch.autograd.grad(y[mask].square().sum(), xi)
        results.append((y[mask], grad[mask]))
    (y_clean, g_clean), (y_nan, g_nan) = results
    assert torch.equal(y_nan, y_clean) and torch.equal(g_nan, g_clean)


@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_model_ignores_garbage_in_padding(variant, side):
    """The model zeroes padded positions of its embeddings: NaN embeddings there change no real logit, not the loss
    and no parameter gradient (the padded rows' zero gradients stay zero instead of 0 · NaN)."""
    mask = _mask(side)
    torch.manual_seed(1)
    embeds = torch.randn(B, T, 32, dtype=torch.float64)
    labels = torch.randint(0, 256, (B, T)).masked_fill(~mask, -100)
    results = []
    for fill in (0.0, float("nan")):
        model = tiny_tnl(**VARIANTS[variant]).train()
        out = model(inputs_embeds=_with_padding(embeds, mask, fill), attention_mask=mask.long(), labels=labels)
        out.loss.backward()
        grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((out.logits[mask].detach(), out.loss.detach(), grads))
    (logits, loss, grads), (logits_nan, loss_nan, grads_nan) = results
    assert torch.equal(logits_nan, logits) and torch.equal(loss_nan, loss)
    assert grads.keys() == grads_nan.keys()
    for name, g in grads.items():
        assert torch.equal(grads_nan[name], g), name


@pytest.mark.parametrize("side", ["right", "left"])
def test_cached_prefill_ignores_garbage_in_padding(side):
    """With a cache (the packed prefill path): real logits and the next decode step are unchanged."""
    mask = _mask(side)
    torch.manual_seed(2)
    embeds = torch.randn(B, T, 32, dtype=torch.float64)
    nxt = torch.randn(B, 1, 32, dtype=torch.float64)
    results = []
    for fill in (0.0, float("nan")):
        model = tiny_tnl()
        with torch.no_grad():
            out = model(inputs_embeds=_with_padding(embeds, mask, fill), attention_mask=mask.long(), use_cache=True)
            full = torch.cat([mask, torch.ones(B, 1, dtype=torch.bool)], dim=1).long()
            step = model(inputs_embeds=nxt, attention_mask=full, past_key_values=out.past_key_values, use_cache=True)
        results.append((out.logits[mask], step.logits))
    assert torch.equal(results[1][0], results[0][0]) and torch.equal(results[1][1], results[0][1])


# input checks of the model's forward

INPUT_CASES = [
    ("ids-float", dict(input_ids=torch.zeros(B, T)), TypeError, "input_ids must be an integer tensor"),
    ("ids-rank", dict(input_ids=torch.zeros(T, dtype=torch.long)), ValueError, "input_ids must have 2 dimensions"),
    ("ids-vocab", dict(input_ids=torch.full((B, T), 256)), ValueError, r"input_ids must be in \[0, vocab_size\)"),
    ("ids-negative", dict(input_ids=torch.full((B, T), -1)), ValueError, r"input_ids must be in \[0, vocab_size\)"),
    ("ids-and-embeds", dict(input_ids=torch.zeros(B, T, dtype=torch.long), inputs_embeds=torch.zeros(B, T, 32)),
     ValueError, "exactly one of input_ids and inputs_embeds"),
    ("embeds-width", dict(inputs_embeds=torch.zeros(B, T, 31, dtype=torch.float64)), ValueError,
     "inputs_embeds must have d_model = 32"),
    ("embeds-int", dict(inputs_embeds=torch.zeros(B, T, 32, dtype=torch.long)), TypeError,
     "inputs_embeds must be a floating-point tensor"),
    ("mask-shape", dict(attention_mask=torch.ones(B, T - 1)), ValueError, "attention_mask must have shape"),
    ("mask-values", dict(attention_mask=torch.full((B, T), 2)), ValueError, "attention_mask must hold 0"),
    ("positions-shape", dict(position_ids=torch.zeros(B, T + 1, dtype=torch.long)), ValueError,
     "position_ids must have shape"),
    ("positions-float", dict(position_ids=torch.zeros(B, T)), TypeError, "position_ids must be an integer tensor"),
    ("labels-shape", dict(labels=torch.zeros(B, T - 1, dtype=torch.long)), ValueError, "labels must have the shape"),
    ("labels-float", dict(labels=torch.zeros(B, T)), TypeError, "labels must be an integer tensor"),
    ("cu-float", dict(input_ids=torch.zeros(1, T, dtype=torch.long), cu_seqlens=torch.tensor([0.0, T])), TypeError,
     "cu_seqlens must be int32 or int64"),
    ("cu-end", dict(input_ids=torch.zeros(1, T, dtype=torch.long), cu_seqlens=torch.tensor([0, T - 1])), ValueError,
     "cu_seqlens must end at T"),
    ("cu-batch", dict(cu_seqlens=torch.tensor([0, T])), ValueError, "B must be 1"),
]


@pytest.mark.parametrize("name,kwargs,error,fragment", INPUT_CASES, ids=[c[0] for c in INPUT_CASES])
def test_model_forward_rejects(name, kwargs, error, fragment):
    model = tiny_tnl()
    args = dict(kwargs)
    if "input_ids" not in args and "inputs_embeds" not in args:
        args["input_ids"] = torch.zeros(B, T, dtype=torch.long)
    with pytest.raises(error, match=fragment):
        model(**args)


def test_token_mixer_rejects_a_malformed_mask():
    layer = TNLAttention(32, 32, 2, 0, 2).double()
    x = torch.randn(B, T, 32, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"token_mask must be a bool tensor of shape \[B, T\]"):
        layer(x, token_mask=torch.ones(B, T))
