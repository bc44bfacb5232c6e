"""Evaluations of the model-quality protocol, all on fixed windows of the validation tokens.

- :func:`length_eval`: the loss over windows of one length, overall and by position bucket (where in the window a
  target sits: the first 64 tokens have little context, the last ones the most). At lengths beyond the training
  context it measures extrapolation.
- :func:`copy_probe`: sequences whose second half repeats their first; the loss on the second half says how well a
  model retrieves what it saw ``L/2`` tokens earlier (softmax attention can copy exactly, a decayed state cannot
  hold everything).

Losses are nats per token and bits per UTF-8 byte (``byte_lengths``: bytes each token id stands for), so byte-level
and BPE runs compare. The windows are the first ones of the split, the same for every model.
"""

import math

import torch
import torch.nn.functional as F

from lightning_attention.bench.model_quality_protocol import POSITION_EDGES


@torch.no_grad()
def token_losses(model, ids: torch.Tensor, device, autocast, max_batch_tokens: int = 2**15) -> torch.Tensor:
    """``ids [N, T + 1]`` (CPU) -> next-token nats ``[N, T]`` float64 on CPU (inputs ``[:, :-1]``, targets
    ``[:, 1:]``), in batches of at most ``max_batch_tokens`` tokens."""
    rows = max(1, max_batch_tokens // (ids.shape[1] - 1))
    out = []
    for batch in ids.split(rows):
        batch = batch.to(device)
        with autocast:
            logits = model(batch[:, :-1], use_cache=False).logits
        nats = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten(), reduction="none")
        out.append(nats.view(batch.shape[0], -1).double().cpu())
    return torch.cat(out)


def windows_of(tokens: torch.Tensor, length: int, count: int) -> torch.Tensor:
    """The first ``count`` non-overlapping windows of ``length + 1`` tokens (fewer if the split is shorter):
    ``[n, length + 1]`` int64."""
    n = min(count, (len(tokens) - 1) // length)
    if n < 1:
        raise ValueError(f"the validation split ({len(tokens)} tokens) holds no window of {length + 1} tokens")
    starts = torch.arange(n)[:, None] * length
    return tokens[starts + torch.arange(length + 1)[None, :]].long()


def _rates(nats: float, tokens: int, nbytes: float) -> dict:
    return {"loss": nats / max(tokens, 1), "bpb": nats / (math.log(2) * nbytes) if nbytes else None}


def length_eval(model, tokens, length: int, count: int, byte_lengths, device, autocast, context: int | None = None):
    """Loss of ``count`` validation windows of ``length`` targets, overall and per position bucket.

    Returns ``{"length", "windows", "loss", "bpb", "buckets": [{"start", "end", "loss", "bpb"}]}``: the buckets
    between :data:`POSITION_EDGES` and the training ``context`` (an edge too, so no bucket straddles it) below
    ``length``; the last one ends at ``length``.
    """
    was_training = model.training
    model.eval()
    ids = windows_of(tokens, length, count)
    nats = token_losses(model, ids, device, autocast).sum(0)  # [length]
    nbytes = byte_lengths[ids[:, 1:]].sum(0).double()  # [length]
    model.train(was_training)
    n = ids.shape[0]
    buckets = []
    edges = sorted({e for e in (*POSITION_EDGES, context or 0) if e < length}) + [length]
    for start, end in zip(edges[:-1], edges[1:]):
        rates = _rates(float(nats[start:end].sum()), n * (end - start), float(nbytes[start:end].sum()))
        buckets.append({"start": start, "end": end, **rates})
    return {"length": length, "windows": n, **_rates(float(nats.sum()), n * length, float(nbytes.sum())),
            "buckets": buckets}


def copy_probe(model, tokens, length: int, count: int, byte_lengths, device, autocast) -> dict:
    """Loss on sequences ``[s, s]`` of ``length`` tokens (``s``: ``length / 2`` validation tokens, ``count`` of them).

    Returns ``{"length", "sequences", "first_half": {"loss", "bpb"}, "second_half": {"loss", "bpb"}}``: the first
    half is ordinary text, the second can be copied from ``length / 2`` tokens back (targets at positions
    ``length/2 .. length-1``).
    """
    half = length // 2
    segments = windows_of(tokens, half, count)[:, :half]  # [n, half]
    ids = torch.cat([segments, segments], dim=1)  # [n, 2 half]: targets are positions 1 .. 2 half - 1
    was_training = model.training
    model.eval()
    nats = token_losses(model, ids, device, autocast)  # [n, 2 half - 1]; column j predicts position j + 1
    model.train(was_training)
    nbytes = byte_lengths[ids[:, 1:]].double()
    first, second = slice(0, half - 1), slice(half - 1, None)
    return {"length": 2 * half, "sequences": ids.shape[0],
            "first_half": _rates(float(nats[:, first].sum()), nats[:, first].numel(), float(nbytes[:, first].sum())),
            "second_half": _rates(float(nats[:, second].sum()), nats[:, second].numel(),
                                  float(nbytes[:, second].sum()))}
