"""Token sampling and streaming generation with a recurrent cache (constant memory for TNL).

This is the package's own small generator, used by ``lightning-attention generate``; it needs neither transformers
nor a KV cache. (``TransNormerForCausalLM.generate`` — transformers' generator with beam search and the rest — works
too when transformers is installed.)
"""

from collections.abc import Iterator

import torch


def sample_token(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                 generator: torch.Generator | None = None) -> torch.Tensor:
    """``logits [B, V]`` -> ``[B]`` int64. ``temperature == 0`` is greedy; top-k then nucleus (top-p) filtering."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        drop = cum - torch.softmax(sorted_logits, dim=-1) >= top_p  # keep the smallest prefix reaching top_p
        logits = logits.scatter(-1, order, sorted_logits.masked_fill(drop, float("-inf")))
    probs = torch.softmax(logits, dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


@torch.no_grad()
def stream_tokens(model, prompt_ids: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                  top_k: int = 0, top_p: float = 1.0, generator: torch.Generator | None = None,
                  stop_token: int | None = None) -> Iterator[int]:
    """Yields up to ``max_new_tokens`` sampled token ids after ``prompt_ids [1, T]`` (T >= 1).

    The prompt is prefilled in one call (chunked lightning attention, final states kept); every further token is one
    recurrent step on the cached fp32 states, so time and memory per token do not depend on how many came before.
    """
    if prompt_ids.ndim != 2 or prompt_ids.shape[0] != 1 or prompt_ids.shape[1] == 0:
        raise ValueError(f"prompt_ids must be [1, T] with T >= 1, got {tuple(prompt_ids.shape)}")
    out = model(prompt_ids, use_cache=True, logits_to_keep=1)
    cache = out.past_key_values
    for _ in range(max_new_tokens):
        token = sample_token(out.logits[:, -1], temperature=temperature, top_k=top_k, top_p=top_p,
                             generator=generator)
        value = int(token.item())
        yield value
        if stop_token is not None and value == stop_token:
            return
        out = model(token[:, None], past_key_values=cache, use_cache=True)
