"""Launch replay (ops/lightning/replay.py): recorded calls repeat the same launches on the new call's tensors.

The first part drives the recorder with a fake launcher that computes with PyTorch, so that every step's effect is
visible; the second runs the chunk forward and backward (Triton, under the interpreter on the CPU) through replays
against float64 and against the same calls without replay.
"""

import pytest
import torch

import lightning_attention as la
from lightning_attention.ops.lightning import chunk, naive, replay
from lightning_attention.utils.testing import assert_close

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class FakeLauncher:
    """A launcher as the chunk path calls it: ``(grid, args, constexprs, x)``; logs each call's arguments."""

    def __init__(self, body):
        self.body, self.calls = body, []

    def __call__(self, grid, args, constexprs, x):
        self.calls.append((grid, args, dict(constexprs), x))
        self.body(*args, **constexprs)


def _scale_plus_sum(x, t, buf, n, scale, C):
    buf.copy_(x[:n] * scale + t.sum() * C)


def _row_sums(buf, out):
    out.copy_(buf.sum(dim=1))


FIRST, SECOND = FakeLauncher(_scale_plus_sum), FakeLauncher(_row_sums)
BODY_RUNS = []


@replay.replayable(uncacheable=lambda a: a[2] < 0, environment=("LIGHTNING_ATTENTION_SEGMENT_LEN",))
def fake_op(x, y, scale):
    """x: [4, 3]; y: [3, 5]; scale: a float (< 0: uncacheable). Returns ([4] row sums, None)."""
    BODY_RUNS.append(1)
    buf = replay.empty(4, 3, dtype=x.dtype, device=x.device)
    t = replay.view(y.t()[1:], y)  # a view with a storage offset
    replay.launch(FIRST, (1,), (x, t, buf, 4, scale), {"C": 2.0}, x)
    out = replay.empty(4, dtype=x.dtype, device=x.device)
    replay.launch(SECOND, (1,), (buf, out), {}, x)
    return out, None


def _expected(x, y, scale):
    return (x * scale + y.t()[1:].sum() * 2.0).sum(dim=1)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.delenv(replay.ENV_REPLAY, raising=False)  # recordings: cleared by tests/conftest.py
    BODY_RUNS.clear()
    FIRST.calls.clear()
    SECOND.calls.clear()


def _inputs(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(4, 3, generator=g, dtype=torch.float64), torch.randn(3, 5, generator=g, dtype=torch.float64)


def test_second_call_replays_on_its_own_tensors():
    x0, y0 = _inputs(0)
    out0, none0 = fake_op(x0, y0, 0.5)
    assert len(fake_op.recordings) == 1 and len(BODY_RUNS) == 1
    x1, y1 = _inputs(1)
    y1 = torch.cat([torch.zeros(2, 5, dtype=y1.dtype), y1])[2:]  # same key, a storage offset of its own
    out1, none1 = fake_op(x1, y1, 0.5)
    assert len(BODY_RUNS) == 1, "the second call ran the function's body instead of its recording"
    assert none0 is None and none1 is None
    torch.testing.assert_close(out0, _expected(x0, y0, 0.5), rtol=0, atol=0)
    torch.testing.assert_close(out1, _expected(x1, y1, 0.5), rtol=0, atol=0)
    # the launchers got the new call's tensors, the view rebuilt on the new y, and the same constants
    _, args, constexprs, x = FIRST.calls[1]
    assert args[0] is x1 and x is x1 and args[3:] == (4, 0.5) and constexprs == {"C": 2.0}
    assert args[1].data_ptr() == y1.t()[1:].data_ptr() and args[1].stride() == y1.t()[1:].stride()
    assert SECOND.calls[1][1][1] is out1


def test_key_holds_shapes_values_and_environment(monkeypatch):
    x, y = _inputs(0)
    fake_op(x, y, 0.5)
    fake_op(x, y, 0.25)  # another float
    fake_op(x.to(torch.float32), y.to(torch.float32), 0.5)  # another dtype
    fake_op(x.t().contiguous().t(), y, 0.5)  # other strides
    monkeypatch.setenv("LIGHTNING_ATTENTION_SEGMENT_LEN", "64")
    fake_op(x, y, 0.5)  # another environment
    assert len(fake_op.recordings) == 5 and len(BODY_RUNS) == 5


def test_buffers_are_released_after_their_last_launch_and_outputs_kept():
    x, y = _inputs(0)
    fake_op(x, y, 0.5)
    (rec,) = fake_op.recordings.values()
    kinds = [step[0] for step in rec.steps]
    assert kinds == ["alloc", "view", "launch", "free", "alloc", "launch", "free"]
    buf_slot, view_slot = rec.steps[0][1], rec.steps[1][1]
    assert set(rec.steps[3][1]) == {view_slot}  # the view's last use is the first launch
    assert set(rec.steps[6][1]) == {buf_slot}  # buf's is the second; out is an output: kept
    assert rec.outputs[0].index == rec.steps[4][1] and rec.outputs[1] is None


def test_same_object_twice_is_not_recorded_but_replays_of_distinct_inputs_stay_right():
    x, _ = _inputs(0)
    y = torch.randn(4, 3, dtype=torch.float64)

    @replay.replayable(uncacheable=lambda a: False)
    def add(a, b):
        out = replay.empty(4, 3, dtype=a.dtype, device=a.device)
        replay.launch(FakeLauncher(lambda a, b, out: out.copy_(a + 2 * b)), (1,), (a, b, out), {}, a)
        return out

    torch.testing.assert_close(add(x, x), 3 * x)
    assert len(add.recordings) == 0  # which of a, b a launch meant is unknowable from one object
    torch.testing.assert_close(add(x, y), x + 2 * y)
    assert len(add.recordings) == 1
    torch.testing.assert_close(add(y, x), y + 2 * x)  # replayed: positions, not objects
    torch.testing.assert_close(add(x, x), 3 * x)  # replayed with both slots the same tensor


def test_unknown_tensor_uncacheable_call_and_switch_run_in_full(monkeypatch):
    @replay.replayable(uncacheable=lambda a: False)
    def foreign(a):
        out = torch.empty_like(a)  # not declared to the recorder
        replay.launch(FakeLauncher(lambda a, out: out.copy_(-a)), (1,), (a, out), {}, a)
        return out

    @replay.replayable(uncacheable=lambda a: False)
    def copied(a):
        t = replay.view(a.t().contiguous(), a)  # declared as a view, but a copy: a replay could not rebuild it
        out = replay.empty(3, 4, dtype=a.dtype, device=a.device)
        replay.launch(FakeLauncher(lambda t, out: out.copy_(t)), (1,), (t, out), {}, a)
        return out

    x, y = _inputs(0)
    torch.testing.assert_close(foreign(x), -x)
    torch.testing.assert_close(copied(x), x.t())
    assert len(foreign.recordings) == 0 and len(copied.recordings) == 0
    fake_op(x, y, -1.0)  # uncacheable
    assert len(fake_op.recordings) == 0
    monkeypatch.setenv(replay.ENV_REPLAY, "0")
    fake_op(x, y, 0.5)
    fake_op(x, y, 0.5)
    assert len(fake_op.recordings) == 0 and len(BODY_RUNS) == 3


def test_failed_call_records_nothing_and_leaves_no_recording_active():
    @replay.replayable(uncacheable=lambda a: False)
    def failing(a):
        replay.empty(2, dtype=a.dtype, device=a.device)
        raise RuntimeError("launch failed")

    x, y = _inputs(0)
    with pytest.raises(RuntimeError, match="launch failed"):
        failing(x)
    assert len(failing.recordings) == 0 and replay._recording() is None
    fake_op(x, y, 0.5)
    assert len(fake_op.recordings) == 1


def test_wrapped_call_inside_a_recording_belongs_to_it():
    @replay.replayable(uncacheable=lambda a: False)
    def outer(x, y):
        out, _ = fake_op(x, y, 0.5)
        return out

    x0, y0 = _inputs(0)
    outer(x0, y0)
    assert len(outer.recordings) == 1 and len(fake_op.recordings) == 0
    x1, y1 = _inputs(1)
    torch.testing.assert_close(outer(x1, y1), _expected(x1, y1, 0.5), rtol=0, atol=0)
    assert len(BODY_RUNS) == 1  # the inner body ran once, while the outer call was recorded


class BindingLauncher(FakeLauncher):
    """A launcher that binds, as DirectLauncher does on CUDA: its bound launches take the tensors as addresses."""

    def __init__(self, body):
        super().__init__(body)
        self.bound_calls, self.accept = [], True

    def bind(self, grid, args, constexprs, x):
        launcher = self

        class Bound:
            pointers = True

            def __call__(self, args, x):
                if not launcher.accept:
                    return False
                launcher.bound_calls.append(args)
                return True

        return Bound()


def test_replays_use_the_bound_launch_with_addresses_and_fall_back_when_it_declines():
    launcher = BindingLauncher(lambda a, out, n: out.copy_(a + 1))

    @replay.replayable(uncacheable=lambda a: False)
    def plus_one(a):
        out = replay.empty(4, 3, dtype=a.dtype, device=a.device)
        replay.launch(launcher, (1,), (a, out, 7), {}, a)
        return out

    x = _inputs(0)[0]
    plus_one(x)  # recorded (launched in full)
    plus_one(x)  # replayed in full once, then bound
    assert len(launcher.calls) == 2 and not launcher.bound_calls
    w = torch.randn(4, 3, dtype=torch.float64)
    out = plus_one(w)  # bound: the launch gets addresses, the same constants
    (args,) = launcher.bound_calls
    assert args == (w.data_ptr(), out.data_ptr(), 7)
    launcher.accept = False  # declined (e.g. a reset since): launched in full, bound again
    z = torch.randn(4, 3, dtype=torch.float64)
    torch.testing.assert_close(plus_one(z), z + 1)
    assert len(launcher.calls) == 3


# the chunk path: segmented, pre-pass pieces (views of k and v), h0 and dht (transposed views), saved states

chunk_plan = chunk.plan_segments  # the real plan, which the test below wraps to count its calls


def _call(q, k, v, slope, h0, do, dht):
    o, ht = la.lightning_attn(q, k, v, slope, initial_state=h0, output_final_state=True)
    return (o, ht, *torch.autograd.grad((o.double() * do).sum() + (ht * dht).sum(), (q, k, v, h0)))


def _chunk_inputs(seed, B=2, T=150, H=2, K=32, V=48, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, T, H, d, generator=g).to(DEVICE, dtype).requires_grad_() for d in (K, K, V))
    h0 = torch.randn(B, H, K, V, generator=g).to(DEVICE).requires_grad_()
    do = torch.randn(B, T, H, V, generator=g).to(DEVICE, torch.float64)
    dht = torch.randn(B, H, K, V, generator=g).to(DEVICE)
    slope = torch.tensor([0.05, 1.0], device=DEVICE)
    return q, k, v, slope, h0, do, dht


def test_chunk_calls_replay_and_match_float64_and_the_unreplayed_call(monkeypatch):
    monkeypatch.setenv("LIGHTNING_ATTENTION_BACKEND", "triton")
    monkeypatch.setenv("LIGHTNING_ATTENTION_SEGMENT_LEN", "64")
    monkeypatch.setenv("LIGHTNING_ATTENTION_PREPASS_LEN", "32")
    plans = []
    monkeypatch.setattr(chunk, "plan_segments", lambda *a, **kw: plans.append(1) or chunk_plan(*a, **kw))
    for seed in range(3):
        inputs = _chunk_inputs(seed)
        plans.clear()
        got = _call(*inputs)
        assert len(plans) == (2 if seed == 0 else 0), f"call {seed}: the plan ran {len(plans)} times"
        q, k, v, slope, h0, do, dht = inputs
        leaves = [x.detach().double().requires_grad_() for x in (q, k, v, h0)]
        o64, ht64 = naive.quadratic_lightning_attn(*leaves[:3], slope, initial_state=leaves[3])
        refs = (o64, ht64, *torch.autograd.grad((o64 * do).sum() + (ht64 * dht.double()).sum(), leaves))
        for name, x, ref in zip(("o", "final_state", "dq", "dk", "dv", "dh0"), got, refs):
            assert_close(name, x, ref, torch.bfloat16)
        monkeypatch.setenv(replay.ENV_REPLAY, "0")
        unreplayed = _call(*inputs)
        monkeypatch.delenv(replay.ENV_REPLAY)
        for x, y in zip(got, unreplayed):
            assert torch.equal(x, y)
    assert len(chunk.chunk_forward.recordings) == 1 and len(chunk.chunk_backward.recordings) == 1
    kinds = [step[0] for step in next(iter(chunk.chunk_backward.recordings.values())).steps]
    assert kinds.count("view") >= 4 and "free" in kinds  # h0ᵀ, dhtᵀ, saved statesᵀ, pieces; workspaces released

