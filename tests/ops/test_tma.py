"""When the walk moves its tiles through tensor descriptors (``plan.tma_ready``), and that each launch of a program
follows that rule: the descriptor path wherever TMA's 16-byte rules hold, the pointer path elsewhere (and in the
inter-only mode), and Triton's scratch allocator set only where none is. The values of both paths are checked
against float64 in ``test_chunk.py``."""

import contextvars

import pytest
import torch

from lightning_attention.ops.lightning import plan, run, tma
from lightning_attention.ops.lightning.device import H100, INTERPRETER, DeviceInfo
from lightning_attention.ops.lightning.plan import TensorSpec
from lightning_attention.settings import Settings
from tests.ops.test_plan import problem

ON = Settings()


def _spec(*shape, dtype=torch.bfloat16):
    return TensorSpec.of(torch.randn(*shape).to(dtype))


def test_contiguous_inputs_are_ready():
    assert plan.tma_ready(H100, ON, _spec(2, 8, 3, 64), _spec(2, 8, 3, 64), _spec(2, 8, 3, 48))


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda: torch.randn(1, 8, 3, 100).bfloat16(), "head stride 200 B"),
        (lambda: torch.randn(1, 8, 3, 72).bfloat16()[..., 4:68], "starts 8 B into a row"),
        (lambda: torch.randn(1, 8, 3, 64).half().transpose(-1, -2), "last dim not contiguous"),
        (lambda: torch.randn(1, 9, 64).bfloat16()[:, 1:].reshape(1, 8, 1, 64),
         "start 128 B in, token stride 128 B: ready"),
    ],
)
def test_the_16_byte_rules(make, why):
    expected = why.endswith("ready")
    assert plan.tma_ready(H100, ON, TensorSpec.of(make())) is expected, why


def test_only_on_sm90_and_the_interpreter_and_not_when_switched_off():
    x = _spec(1, 8, 2, 64)
    assert plan.tma_ready(INTERPRETER, ON, x)  # CPU tests run the path an H100 runs
    assert not plan.tma_ready(DeviceInfo.of_capability(80, sm_count=108), ON, x)
    assert not plan.tma_ready(H100, Settings(tma=False), x)


def _use_tma(program) -> list:
    return [launch.constexprs["USE_TMA"] for launch in program.launches if "USE_TMA" in launch.constexprs]


@pytest.mark.parametrize("K, expected, backward_walks", [(64, True, 3), (100, False, 5)])
def test_each_walk_launch_follows_the_rule(K, expected, backward_walks):
    """Forward, pre-pass and the backward walks of a segmented call: descriptors at K = 64 (dq's pre-pass and walk,
    which also computes the reverse local states, and the fused dk/dv walk), pointers at K = 100 (a bf16 head stride
    of 200 B; both pre-passes and dq's, dk's and dv's walks)."""
    forward = run.forward_program(problem(B=1, T=80, H=2, K=K, V=K, device=INTERPRETER, segment_len=32))
    backward = run.backward_program(problem(B=1, T=80, H=2, K=K, V=K, device=INTERPRETER, segment_len=32,
                                            backward=True))  # fmt: skip
    uses = _use_tma(forward) + _use_tma(backward)
    assert len(uses) == 2 + backward_walks  # pre-pass and walk; the backward's pre-passes and walks
    assert all(use is expected for use in uses), uses


def test_inter_only_mode_uses_pointers():
    """The inter-only walk's chunks are shorter than its tile: a descriptor would read and write the next chunk's
    rows, so it keeps the masked pointer path (its pre-pass, which does not chunk, may use descriptors)."""
    program = run.forward_program(problem(B=1, T=64, H=2, K=32, V=32, device=INTERPRETER, inter_chunk=16))
    (walk,) = program.launches
    assert walk.constexprs["INTER_ONLY"] and walk.constexprs["USE_TMA"] is False


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
