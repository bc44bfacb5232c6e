"""When the walk moves its tiles through tensor descriptors (``ops/lightning/tma.py``), and that each launch follows
that rule: the descriptor path wherever TMA's 16-byte rules hold, the pointer path elsewhere (and in the inter-only
mode), and Triton's scratch allocator set only where none is. The values of both paths are checked against float64
in ``test_chunk.py``."""

import contextvars

import pytest
import torch

import lightning_attention as la
from lightning_attention.ops.lightning import chunk, tma

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _x(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, device=DEVICE).to(dtype)


def test_contiguous_inputs_are_ready():
    assert tma.tma_ready(_x(2, 8, 3, 64), _x(2, 8, 3, 64), _x(2, 8, 3, 48))


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda: _x(1, 8, 3, 100), "head stride 200 B"),
        (lambda: _x(1, 8, 3, 72)[..., 4:68], "starts 8 B into a row"),
        (lambda: _x(1, 8, 3, 64, dtype=torch.float16).transpose(-1, -2), "last dim not contiguous"),
        (lambda: _x(1, 9, 64)[:, 1:].reshape(1, 8, 1, 64), "start 128 B in, token stride 128 B: ready"),
    ],
)
def test_the_16_byte_rules(make, why):
    x = make()
    expected = why.endswith("ready")
    assert tma.tma_ready(x) is expected, why


def test_switched_off_by_the_environment(monkeypatch):
    monkeypatch.setenv(tma.ENV_TMA, "0")
    assert not tma.tma_ready(_x(1, 8, 2, 64))


def _launches(monkeypatch) -> list:
    """Records ``USE_TMA`` of every walk launch (main walk, pre-pass, inter-only walk)."""
    seen = []
    for name in ("_WALK", "_STATE", "_INTER_WALK"):
        launcher = getattr(chunk, name)

        def record(grid, args, constexprs, x, launcher=launcher, name=name):
            seen.append((name, constexprs["USE_TMA"]))
            return launcher(grid, args, constexprs, x)

        monkeypatch.setattr(chunk, name, record)
    return seen


@pytest.mark.parametrize("K, expected", [(64, True), (100, False)])
def test_each_walk_launch_follows_the_rule(monkeypatch, K, expected):
    """Forward, pre-pass and the three backward walks of a segmented call: descriptors at K = 64, pointers at
    K = 100 (a bf16 head stride of 200 B)."""
    monkeypatch.setenv("LIGHTNING_ATTENTION_BACKEND", "triton")
    monkeypatch.setenv("LIGHTNING_ATTENTION_SEGMENT_LEN", "32")
    seen = _launches(monkeypatch)
    q, k, v = (_x(1, 80, 2, K).requires_grad_() for _ in range(3))
    o, _ = la.lightning_attn(q, k, v, torch.full((2,), 0.1, device=DEVICE))
    o.float().sum().backward()
    kinds = {name for name, _ in seen}
    assert kinds == {"_WALK", "_STATE"}, seen
    assert all(use is expected for _, use in seen), seen


def test_inter_only_mode_uses_pointers(monkeypatch):
    """The inter-only walk's chunks are shorter than its tile: a descriptor would read and write the next chunk's
    rows, so it keeps the masked pointer path."""
    seen = _launches(monkeypatch)
    q, k, v = (_x(1, 64, 2, 32) for _ in range(3))
    chunk.lightning_attn_inter_triton(q, k, v, torch.full((2,), 0.1, device=DEVICE), chunk_size=16)
    assert ("_INTER_WALK", False) in seen, seen


def test_allocator_set_only_where_none_is():
    from triton.runtime import _allocation

    def fresh_context(fn):
        return contextvars.Context().run(fn)  # a context with every variable at its default

    def set_when_null():
        tma.ensure_allocator()
        return _allocation._allocator.get()

    assert fresh_context(set_when_null) is tma._torch_scratch

    def keep_users():
        def users(size, alignment, stream):
            return torch.empty(size, dtype=torch.int8)

        import triton

        triton.set_allocator(users)
        tma.ensure_allocator()
        return _allocation._allocator.get() is users

    assert fresh_context(keep_users)
