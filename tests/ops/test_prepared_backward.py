"""The backward a forward prepares (``run.PreparedBackward``), on CPU under the interpreter.

- In plain eager mode the autograd Function's backward runs the program its forward prepared, and the gradients are
  bitwise those of the planned path (the operator, every decision taken again) for the same call: fixed-length,
  segmented (with the forward's segment states), with an initial and a final state, packed, packed and segmented,
  and a learned slope on float32 inputs.
- It steps aside, and the planned path runs, when the gradients are not the ones it was built for (a ``do`` with
  other strides, a final state whose gradient does not come), or the settings changed or the cached programs were
  cleared between the forward and the backward; and nothing is prepared where the backward is not the chunk one in
  the input dtype (the recompute backward, a learned slope on 16-bit inputs).
"""

import pytest
import torch

import lightning_attention as la
from lightning_attention import settings
from lightning_attention.ops.decay import tnl_slopes
from lightning_attention.ops.lightning import run
from tests.ops.test_compile_ahead import CASES as COMPILE_AHEAD_CASES

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
H, K, V = 2, 16, 16


@pytest.fixture
def prepared_runs(monkeypatch) -> list:
    """Records every run of a prepared backward (the real one still runs)."""
    runs = []
    real = run.PreparedBackward.__call__

    def recording(self, *args):
        runs.append(self)
        return real(self, *args)

    monkeypatch.setattr(run.PreparedBackward, "__call__", recording)
    return runs


def _leaves(T=40, dtype=torch.float32, h0=False, learn_slope=False):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, T, H, d, generator=g).to(DEVICE, dtype).requires_grad_() for d in (K, K, V))
    slope = tnl_slopes(H, 0, 2).to(DEVICE).requires_grad_(learn_slope)
    state = torch.randn(1 if h0 is True else h0, H, K, V, generator=g).to(DEVICE).requires_grad_() if h0 else None
    return q, k, v, slope, state


def _gradients(leaves, do, dht=None, **kwargs):
    """The gradients of every leaf that needs one, from ``do`` (and ``dht`` on the final state)."""
    q, k, v, slope, state = leaves
    o, ht = la.lightning_attn(q, k, v, slope, initial_state=state, **kwargs)
    outputs, grads = [o], [do]
    if dht is not None:
        outputs.append(ht)
        grads.append(dht)
    wanted = [x for x in leaves if x is not None and x.requires_grad]
    return torch.autograd.grad(outputs, wanted, grads)


def _planned(monkeypatch, leaves, do, dht=None, **kwargs):
    """The same call's gradients with the prepared backward refused: the operator plans the backward again."""
    with monkeypatch.context() as m:
        m.setattr(run.PreparedBackward, "matches", lambda self, do, dht: False)
        return _gradients(leaves, do, dht, **kwargs)


# the calls whose backward program the forward guesses (test_compile_ahead.py), and a learned slope on float32 inputs
CASES = {**COMPILE_AHEAD_CASES, "learned-slope-float32": dict(learn_slope=True)}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_backward_runs_the_prepared_program_with_the_planned_gradients(
    triton_backend, monkeypatch, prepared_runs, case
):
    opts = CASES[case]
    if "seg" in opts:
        triton_backend(segment_len=opts["seg"])
    kwargs = {}
    h0 = opts.get("h0", False)
    if "cu" in opts:
        cu = torch.tensor(opts["cu"], dtype=torch.int32)
        kwargs.update(cu_seqlens=cu.to(DEVICE), cu_seqlens_cpu=cu)
        h0 = len(opts["cu"]) - 1 if h0 else False
    leaves = _leaves(h0=h0, learn_slope=opts.get("learn_slope", False))
    g = torch.Generator().manual_seed(1)
    do = torch.randn(1, 40, H, V, generator=g).to(DEVICE)
    dht = None
    if opts.get("final"):
        kwargs["output_final_state"] = True
        dht = torch.randn(1, H, K, V, generator=g).to(DEVICE)

    prepared = _gradients(leaves, do, dht, **kwargs)
    assert len(prepared_runs) == 1
    if "seg" in opts and "cu" not in opts:
        assert prepared_runs[0].program.specs[-1] is not None  # it takes the forward's segment states
    planned = _planned(monkeypatch, leaves, do, dht, **kwargs)
    assert len(prepared_runs) == 1
    assert len(prepared) == len(planned) >= 3
    for a, b in zip(prepared, planned):
        assert torch.equal(a, b)


def test_other_gradients_or_settings_take_the_planned_path(triton_backend, monkeypatch, prepared_runs):
    leaves = _leaves()
    q, k, v, slope, _ = leaves
    g = torch.Generator().manual_seed(1)
    do = torch.randn(1, 40, H, V, generator=g).to(DEVICE)
    expected = _planned(monkeypatch, leaves, do)

    # a do with other strides (the last dim still contiguous): built for a contiguous one, so not taken
    do_strided = do.transpose(1, 2).contiguous().transpose(1, 2)
    assert do_strided.stride() != do.stride() and torch.equal(do_strided, do)
    for a, b in zip(_gradients(leaves, do_strided), expected):
        assert torch.equal(a, b)
    assert prepared_runs == []

    # the final state returned but its gradient never comes (dht is None, the program expected one)
    o, ht = la.lightning_attn(q, k, v, slope, output_final_state=True)
    assert ht is not None
    for a, b in zip(torch.autograd.grad(o, (q, k, v), do), expected):
        assert torch.equal(a, b)
    assert prepared_runs == []

    # settings changed between the forward and the backward: the backward plans under its own settings
    o, _ = la.lightning_attn(q, k, v, slope)
    with settings.override(segment_len=16):
        grads = torch.autograd.grad(o, (q, k, v), do)
    assert prepared_runs == []
    for a, b in zip(grads, expected):  # another plan (segments): the same gradients up to float32 rounding
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)

    # the programs cleared between the forward and the backward: the prepared one may be stale, so the backward plans
    o, _ = la.lightning_attn(q, k, v, slope)
    run.clear_programs()
    for a, b in zip(torch.autograd.grad(o, (q, k, v), do), expected):
        assert torch.equal(a, b)
    assert prepared_runs == []

    # the expected gradients again: the prepared program runs
    for a, b in zip(_gradients(leaves, do), expected):
        assert torch.equal(a, b)
    assert len(prepared_runs) == 1


def test_nothing_prepared_for_the_recompute_or_a_float32_backward(triton_backend, prepared_runs):
    q, k, v, slope, _ = _leaves()
    o, _ = la.lightning_attn(q, k, v, slope, backward="recompute")
    o.sum().backward()
    q, k, v, slope, _ = _leaves(dtype=torch.float16, learn_slope=True)
    o, _ = la.lightning_attn(q, k, v, slope)  # a learned slope on 16-bit inputs: the backward runs in float32
    o.float().sum().backward()
    assert slope.grad is not None and q.grad is not None
    assert prepared_runs == []
