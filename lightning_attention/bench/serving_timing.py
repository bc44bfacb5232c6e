"""HF ``generate()`` serving timing: one model, one (batch, prompt length) point, greedy, plain ``generate()``.

- :func:`build_model`: TNL or transformers' ``LlamaForCausalLM`` of one preset (equal size), in eval mode; bf16
  weights on CUDA, float32 on CPU; LLaMA's attention set to SDPA. ``tnl-graphs`` is TNL with
  ``decode_cuda_graphs`` on: every decode step a CUDA-graph replay (an eager step on CPU).
- :func:`time_point`: a warm-up ``generate`` (2 new tokens: compiles and autotunes the prefill and the decode step
  of this shape), then ``repeats`` times (3 by default) ``generate(max_new_tokens=1)`` (the prefill: time to first
  token) followed by ``generate(max_new_tokens=N, min_new_tokens=N)`` (the whole request); prompts are random token
  ids ``[batch, prompt]`` of the model's vocabulary. Times are the minimum over the repeats: at these sizes
  ``generate()`` is largely host time, and on a shared host interference only ever adds to a time (as
  ``benchmarks/guard_points.py`` takes host times).

Derived numbers (``B`` = batch, ``N`` = new tokens):

- ``decode_s``: the time between the first and the last token inside the whole request (a stopping criterion that
  never stops records when each token is ready; ``generate()`` waits on the device after every token anyway, to
  check for finished rows, so the clock adds no synchronisation that was not there), the minimum over the repeats;
- ``decode_tokens_per_s`` = B · (N − 1) / ``decode_s``: the N − 1 tokens after the first;
- ``tokens_per_s`` = B · N / total;
- ``decode_s_from_calls`` = total − prefill, the same decode time from the two separate calls: a cross-check. It
  assumes both calls' prefills were equally fast, so where the decode is short against the noise of a prefill (a
  few new tokens on a CPU smoke run) it can come out at zero or below; the headline numbers never use it.

The cache after generation is measured on the returned cache (``return_dict_in_generate=True``):
``cache_bytes`` is every tensor it holds — TNL's fp32 recurrent states ``[B, H, K, V]`` per layer, constant in the
prompt length; LLaMA's keys and values ``[B, kv_heads, tokens, head_dim]`` per layer. ``cache_tokens`` is the
length the cache has seen: prompt + N − 1 (the last token generated is never fed back). For LLaMA
``kv_cache_bytes_formula`` = 2 · layers · B · (prompt + N − 1) · kv_heads · head_dim · bytes per element gives the
same number from the config.

Peak memory is ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` (CUDA only; None on CPU).
"""

import time

import torch
from transformers import StoppingCriteria, StoppingCriteriaList

from lightning_attention.bench import metrics
from lightning_attention.bench.timing import peak_memory, synchronize, wall_seconds
from lightning_attention.models.presets import model_config, model_from_config, parameter_count
from lightning_attention.models.transnormer.cache import cache_of
from lightning_attention.utils.dtypes import dtype_name

WARMUP_NEW_TOKENS = 2  # one prefill and one decode step: every kernel of the request runs once


def model_dtype(device: torch.device) -> torch.dtype:
    """bf16 weights on CUDA (how a model is served); float32 on CPU, where bf16 matmuls are slow and only the
    plumbing is checked."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def build_model(arch: str, preset: str, device: torch.device, seed: int = 0) -> tuple[torch.nn.Module, dict]:
    """``arch`` (one of ``presets.SERVING_ARCHS``) at ``preset`` size on ``device`` in eval mode, and what describes it
    (parameters, dtype, the attention implementation of LLaMA)."""
    torch.manual_seed(seed)
    base = "tnl" if arch == "tnl-graphs" else arch  # the same weights: the seed is the same
    model = model_from_config(base, model_config(base, preset))
    if arch == "tnl-graphs":
        model.config.decode_cuda_graphs = True
    if arch == "llama" and getattr(model.config, "_attn_implementation", None) != "sdpa":
        model.set_attn_implementation("sdpa")  # the baseline is SDPA attention, whatever transformers defaults to
    dtype = model_dtype(device)
    model = model.to(device=device, dtype=dtype).eval()
    info = {"arch": arch, "preset": preset, "parameters": parameter_count(model), "dtype": dtype_name(dtype),
            "vocab_size": model.config.vocab_size}
    if arch == "llama":
        info["attn_implementation"] = model.config._attn_implementation
    if arch == "tnl-graphs":
        info["decode_cuda_graphs"] = True
    return model, info


def random_prompt(batch: int, prompt: int, vocab_size: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    """``[batch, prompt]`` int64 token ids drawn uniformly from the vocabulary (seeded, the same for every arch)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, vocab_size, (batch, prompt), generator=g).to(device)


def generate(model, ids: torch.Tensor, new_tokens: int, **kwargs):
    """Greedy ``model.generate`` of exactly ``new_tokens`` tokens per row (``min_new_tokens`` keeps an end-of-text
    token from ending a row early). ``ids [B, P]`` -> ``[B, P + new_tokens]`` (or the ``return_dict_in_generate``
    output)."""
    mask = torch.ones_like(ids)  # no padding; given explicitly so generate() does not guess it from a pad token
    return model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=new_tokens,
                          min_new_tokens=new_tokens, use_cache=True, **kwargs)


class TokenClock(StoppingCriteria):
    """A stopping criterion that never stops: records when each new token of the batch is ready (after a device
    synchronisation), from ``start`` (set by the caller just before ``generate``)."""

    def __init__(self, device: torch.device):
        self.device, self.start, self.ready = device, None, []

    def __call__(self, input_ids: torch.Tensor, scores, **kwargs) -> torch.Tensor:
        synchronize(self.device)
        self.ready.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def cache_bytes(cache) -> int:
    """Bytes of every tensor a generation cache holds: :meth:`TransNormerCache.memory_bytes` (recurrent states), or
    the keys and values of each layer of a transformers cache (``layers[i].keys`` / ``.values``; ``key_cache`` /
    ``value_cache`` on older transformers)."""
    if hasattr(cache, "memory_bytes"):
        return cache.memory_bytes()
    if hasattr(cache, "layers"):
        tensors = [t for layer in cache.layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))]
    else:
        tensors = [*cache.key_cache, *cache.value_cache]
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def kv_cache_bytes_formula(config, batch: int, tokens: int, dtype: torch.dtype) -> int:
    """2 (keys, values) · layers · batch · tokens · kv_heads · head_dim · bytes: a LLaMA config's KV cache."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * batch * tokens * kv_heads * head_dim * dtype.itemsize


def _measured_call(fn, device: torch.device) -> tuple[object, float, int | None, int | None]:
    """``(fn(), seconds, allocated before, peak during)`` of one synchronised call; the bytes are None on CPU."""
    box = {}

    def call():
        box["seconds"] = wall_seconds(lambda: box.__setitem__("out", fn()), device)

    memory = peak_memory(call, device)
    if memory is None:  # no allocator statistics on CPU: the call still runs, once
        call()
    start, peak = memory if memory is not None else (None, None)
    return box["out"], box["seconds"], start, peak


def time_point(model, batch: int, prompt: int, new_tokens: int, *, device: torch.device, record: dict,
               repeats: int = 3, seed: int = 0) -> dict:
    """Warm-up, then ``repeats`` times the prefill and the whole request, of ``batch`` random prompts of ``prompt``
    tokens (module docstring); times are the minimum over the repeats, peaks the largest.

    Fills ``record`` as it goes (so a point that runs out of memory in a later call keeps what was measured before
    it) with ``stage`` (the call running: "warm-up", "prefill", "generate", then "done"), ``warmup_s``,
    ``prefill_s`` (time to first token), ``prefill_peak_bytes``, ``total_s``, ``start_bytes``, ``peak_bytes``,
    ``decode_s``, ``decode_tokens_per_s``, ``tokens_per_s``, ``first_token_in_run_s``, ``decode_s_from_calls``,
    ``prefill_runs_s``, ``total_runs_s`` and ``decode_runs_s`` (every repeat), ``cache_bytes``,
    ``cache_kind``, ``cache_tokens`` (and for LLaMA ``kv_cache_bytes_formula``). Raises what ``generate`` raises
    (``torch.cuda.OutOfMemoryError`` included): the caller records it. Returns ``record``.
    """
    if new_tokens < 2:
        raise ValueError(f"new_tokens must be at least 2 (one prefill token and one decoded), got {new_tokens}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    ids = random_prompt(batch, prompt, model.config.vocab_size, device, seed)
    record["stage"] = "warm-up"
    record["warmup_s"] = wall_seconds(lambda: generate(model, ids, WARMUP_NEW_TOKENS), device)

    prefills, totals, firsts, decodes = [], [], [], []
    for _ in range(repeats):
        record["stage"] = "prefill"
        _, seconds, _, peak = _measured_call(lambda: generate(model, ids, 1), device)
        prefills.append(seconds)
        record.update(prefill_runs_s=prefills, prefill_s=min(prefills),
                      prefill_peak_bytes=_largest(record.get("prefill_peak_bytes"), peak))

        record["stage"] = "generate"
        clock = TokenClock(device)

        def request(clock=clock):
            clock.start = time.perf_counter()
            return generate(model, ids, new_tokens, return_dict_in_generate=True,
                            stopping_criteria=StoppingCriteriaList([clock]))

        out, seconds, record["start_bytes"], peak = _measured_call(request, device)
        if tuple(out.sequences.shape) != (batch, prompt + new_tokens) or len(clock.ready) != new_tokens:
            raise RuntimeError(f"generate() returned {tuple(out.sequences.shape)} after {len(clock.ready)} tokens, "
                               f"expected ({batch}, {prompt + new_tokens}) after {new_tokens}")
        totals.append(seconds)
        firsts.append(clock.ready[0] - clock.start)
        decodes.append(clock.ready[-1] - clock.ready[0])
        record.update(total_runs_s=totals, decode_runs_s=decodes,
                      peak_bytes=_largest(record.get("peak_bytes"), peak))
        record.update(_cache_record(cache_of(out), model, batch))
        del out  # the next prefill must not run beside this request's cache (tens of GB for LLaMA at 64 x 32K)

    decoded = batch * (new_tokens - 1)
    total = min(totals)
    record["total_s"] = total
    record["decode_s"] = min(decodes)
    record["decode_tokens_per_s"] = metrics.tokens_per_s(decoded, 1e3 * record["decode_s"])
    record["tokens_per_s"] = metrics.tokens_per_s(batch * new_tokens, 1e3 * total)
    record["first_token_in_run_s"] = min(firsts)
    record["decode_s_from_calls"] = total - record["prefill_s"]
    record["stage"] = "done"
    return record


def _largest(a: int | None, b: int | None) -> int | None:
    """The larger of two peaks, either of which may be unmeasured (None)."""
    return None if a is None and b is None else max(x for x in (a, b) if x is not None)


def _cache_record(cache, model, batch: int) -> dict:
    """``cache_bytes``, ``cache_tokens``, ``cache_kind`` of the cache a request returned (and for a KV cache
    ``kv_cache_bytes_formula``, the same bytes from the config)."""
    record = {"cache_bytes": cache_bytes(cache), "cache_tokens": cache.get_seq_length()}
    if hasattr(cache, "memory_bytes"):
        record["cache_kind"] = "recurrent states"
    else:
        record["cache_kind"] = "KV cache"
        dtype = next(model.parameters()).dtype
        record["kv_cache_bytes_formula"] = kv_cache_bytes_formula(model.config, batch, record["cache_tokens"], dtype)
    return record
