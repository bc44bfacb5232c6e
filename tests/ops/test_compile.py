"""Whole-graph compile: every public op traces with zero graph breaks under ``torch.compile(fullgraph=True)``.

``torch._dynamo.explain`` counts the breaks of one call; then the same call is compiled with ``fullgraph=True`` on the
``aot_eager`` backend (Inductor needs a C++ toolchain and minutes on 2 cores) and checked against eager mode, so the
captured graph is the right one. Both backends: the PyTorch path (CPU tensors by default) and the Triton kernels
(under the interpreter on CPU). Packed sequences with and without their host copy ``cu_seqlens_cpu``; decode with
``out=``.
"""

import pytest
import torch

import lightning_attention as la
from lightning_attention.compat.fla import chunk_lightning_attn, fused_recurrent_lightning_attn
from lightning_attention.ops.hybrid import HybridDecodeState, hybrid_chunk_attn, hybrid_chunk_attn_decode
from lightning_attention.ops.lightning.inter import lightning_attn_inter
from lightning_attention.ops.normalized import (
    new_normalized_state,
    normalized_linear_attn,
    normalized_linear_attn_decode,
)
from lightning_attention.utils.testing import assert_close

T, H, K, V = 40, 2, 16, 16


def _inputs(B=1, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, d, generator=g) for d in (K, K, V))
    return q, k, v, torch.tensor([0.1, 1.0])


CU = torch.tensor([0, 7, 7, 40], dtype=torch.int32)
H0 = torch.randn(3, H, K, V, generator=torch.Generator().manual_seed(1))


def _calls():
    """(id, function of the inputs) for every public op and mode."""
    return {
        "lightning_attn-dense": lambda q, k, v, s: la.lightning_attn(
            q, k, v, s, initial_state=H0[:1], output_final_state=True),
        "lightning_attn-varlen": lambda q, k, v, s: la.lightning_attn(
            q, k, v, s, initial_state=H0, output_final_state=True, cu_seqlens=CU),
        "lightning_attn-varlen-cpu-offsets": lambda q, k, v, s: la.lightning_attn(
            q, k, v, s, initial_state=H0, output_final_state=True, cu_seqlens=CU, cu_seqlens_cpu=CU.clone()),
        "lightning_attn_func": lambda q, k, v, s: la.lightning_attn_func(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), s),
        "lightning_attn_inter-varlen": lambda q, k, v, s: lightning_attn_inter(
            q, k, v, s, chunk_size=16, initial_state=H0, output_final_state=True, cu_seqlens=CU),
        "normalized_linear_attn": lambda q, k, v, s: normalized_linear_attn(q, k, v, s, output_final_state=True),
        "hybrid_chunk_attn": lambda q, k, v, s: hybrid_chunk_attn(q, k, v, s, chunk_size=16),
        "fla-chunk-varlen": lambda q, k, v, s: chunk_lightning_attn(
            q, k, v, 0, 4, initial_state=H0, output_final_state=True, cu_seqlens=CU),
        "fla-recurrent-reverse": lambda q, k, v, s: fused_recurrent_lightning_attn(
            q, k, v, 1, 4, output_final_state=True, reverse=True),
    }  # fmt: skip


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for o in out if o is not None for t in _flat(o)]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", list(_calls()))
def test_public_ops_compile_without_graph_breaks(name, backend, configure, fresh_dynamo):
    configure(backend=backend)
    fn = _calls()[name]
    q, k, v, s = _inputs()
    explanation = torch._dynamo.explain(fn)(q, k, v, s)
    assert explanation.graph_break_count == 0, [str(b.reason) for b in explanation.break_reasons]
    torch._dynamo.reset()
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    got = _flat(compiled(*leaves, s))
    want = _flat(fn(q, k, v, s))
    for i, (a, b) in enumerate(zip(got, want)):
        assert_close(f"{name} output {i}", a, b.detach(), 1e-5)
    grads = torch.autograd.grad(sum(t.float().square().sum() for t in got), leaves, allow_unused=True)
    assert any(g is not None for g in grads)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_decode_with_out_compiles_without_graph_breaks(backend, configure, fresh_dynamo):
    """A decode step into a given ``out`` (the CUDA-graph form) with a slot-indexed pool."""
    configure(backend=backend)
    g = torch.Generator().manual_seed(2)
    q, k = (torch.randn(3, H, K, generator=g) for _ in range(2))
    v = torch.randn(3, H, V, generator=g)
    idx = torch.tensor([2, -1, 0])

    def step(q, k, v, pool, out):
        return la.lightning_attn_decode(q, k, v, pool, None, scale=0.5, state_indices=idx, out=out)

    pool = torch.randn(4, H, K, V, generator=g)
    explanation = torch._dynamo.explain(step)(q, k, v, pool.clone(), torch.empty(3, H, V))
    assert explanation.graph_break_count == 0, [str(b.reason) for b in explanation.break_reasons]
    torch._dynamo.reset()
    pool_eager, pool_compiled = pool.clone(), pool.clone()
    out_eager, out_compiled = torch.empty(3, H, V), torch.empty(3, H, V)
    step(q, k, v, pool_eager, out_eager)
    torch.compile(step, fullgraph=True, backend="aot_eager")(q, k, v, pool_compiled, out_compiled)
    assert_close("out", out_compiled, out_eager, 1e-6)
    assert_close("pool", pool_compiled, pool_eager, 1e-6)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("variant", ["normalized", "hybrid"])
def test_feature_map_decodes_compile_without_graph_breaks(variant, backend, configure, fresh_dynamo):
    """The decode steps of the normalised and hybrid attentions (in-place states) trace whole too."""
    configure(backend=backend)
    g = torch.Generator().manual_seed(3)
    q, k = (torch.randn(2, H, K, generator=g) for _ in range(2))
    v = torch.randn(2, H, V, generator=g)
    slope = torch.tensor([0.1, 1.0])
    if variant == "normalized":
        def fresh():
            return new_normalized_state(3, H, K, V)

        def step(q, k, v, state):
            return normalized_linear_attn_decode(q, k, v, state, slope, state_indices=torch.tensor([2, -1]))
    else:
        def fresh():
            return HybridDecodeState.empty(2, H, K, V, K, chunk_size=4)

        def step(q, k, v, state):
            return hybrid_chunk_attn_decode(q, k, v, state, slope)

    explanation = torch._dynamo.explain(step)(q, k, v, fresh())
    assert explanation.graph_break_count == 0, [str(b.reason) for b in explanation.break_reasons]
    torch._dynamo.reset()
    eager_state, compiled_state = fresh(), fresh()
    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    for _ in range(2):
        assert_close(variant, compiled(q, k, v, compiled_state), step(q, k, v, eager_state), 1e-6)
