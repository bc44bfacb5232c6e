"""Compiling a problem's kernels before its first launch (``ops/lightning/compile_ahead.py``), on CPU.

- A forward whose inputs need gradients hands its backward's program to the same block, and that is the program the
  backward then runs (the expected backward key matches the real one): fixed-length, segmented (with the forward's
  segment states), with an initial and a final state, packed sequences. Where the backward will not be the chunk
  backward in the input dtype (no gradient, a learned slope on 16-bit inputs), the forward hands over only its own.
- The stand-in tensors of :meth:`Program.compile_ahead` specialise every launch as the call's own tensors do (dtype
  and 16-byte alignment per argument), so the kernels built ahead are the ones launched.
- Builds inside :func:`compile_together` run at once in threads (Triton's ``AsyncCompileMode``) and the block returns
  when every one has finished.
- :meth:`Launcher.compile_ahead` warms up the kernel (an autotuner: every candidate) and adds nothing for a key whose
  compiled kernel it already holds.

The compiles themselves need a GPU: tests/ops/test_chunk_gpu.py counts the kernels built from an empty cache.
"""

import threading

import pytest
import torch

import lightning_attention as la
from lightning_attention.ops.decay import tnl_slopes
from lightning_attention.ops.lightning import compile_ahead, launch, run
from tests.ops.test_launch import CpuLauncher, FakeAutotuner, _call, _compiled

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _record_blocks(monkeypatch) -> list[list]:
    """Every ``compile_together`` call's programs, in order (the real one still runs: on CPU it builds nothing)."""
    blocks = []
    real = run.compile_together

    def recording(programs, device):
        blocks.append(list(programs))
        real(programs, device)

    monkeypatch.setattr(run, "compile_together", recording)
    return blocks


def _inputs(B=1, T=40, H=2, K=16, V=16, dtype=torch.float32, grad=True):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(B, T, H, d, generator=g).to(DEVICE, dtype).requires_grad_(grad) for d in (K, K, V))


CASES = {
    "plain": dict(),
    "segmented": dict(seg=16),
    "initial-and-final-state": dict(h0=True, final=True),
    "packed": dict(cu=(0, 7, 40)),
    "packed-segmented": dict(cu=(0, 7, 40), seg=16),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_forward_builds_its_backward_program_with_its_own(triton_backend, monkeypatch, case):
    opts = CASES[case]
    if "seg" in opts:
        triton_backend(segment_len=opts["seg"])
    blocks = _record_blocks(monkeypatch)
    q, k, v = _inputs()
    kwargs = {}
    if opts.get("h0"):
        kwargs.update(
            initial_state=torch.randn(1, 2, 16, 16, device=DEVICE, requires_grad=True), output_final_state=True
        )
    if "cu" in opts:
        cu = torch.tensor(opts["cu"], dtype=torch.int32)
        kwargs.update(cu_seqlens=cu.to(DEVICE), cu_seqlens_cpu=cu)

    def loss(o, ht):
        return o.float().square().sum() + (ht.square().sum() if ht is not None else 0)

    o, ht = la.lightning_attn(q, k, v, tnl_slopes(2, 0, 2).to(DEVICE), **kwargs)
    assert len(blocks) == 1 and len(blocks[0]) == 2  # the forward's program and the expected backward's
    forward, backward = blocks[0]
    assert forward.compiled_ahead and backward.compiled_ahead
    loss(o, ht).backward()
    assert len(blocks) == 1  # the backward found its program already built ahead: no block of its own
    assert run._backward_program.cache_info().currsize == 1  # and it is the one the forward built
    if "seg" in opts and "cu" not in opts:
        assert forward.output_spec(2) is not None  # segmented: the guess carried the forward's segment states
    # a second call of the same shapes builds nothing more
    loss(*la.lightning_attn(q, k, v, tnl_slopes(2, 0, 2).to(DEVICE), **kwargs)).backward()
    assert len(blocks) == 1


def test_forward_alone_and_learned_slope_hand_over_only_their_own(triton_backend, monkeypatch):
    blocks = _record_blocks(monkeypatch)
    q, k, v = _inputs(grad=False)
    la.lightning_attn(q, k, v, tnl_slopes(2, 0, 2).to(DEVICE))
    assert [len(b) for b in blocks] == [1]  # no gradient: no backward to prepare

    # float16 inputs with a slope that needs its gradient: the backward runs in float32 (decay_grad.py), so the
    # forward does not guess it, and the backward builds its own program's kernels in a block of its own
    run.clear_programs()
    blocks.clear()
    q, k, v = _inputs(dtype=torch.float16)
    slope = tnl_slopes(2, 0, 2).to(DEVICE).requires_grad_(True)
    o, _ = la.lightning_attn(q, k, v, slope)
    assert [len(b) for b in blocks] == [1]
    o.float().sum().backward()
    assert [len(b) for b in blocks] == [1, 1]


def test_stand_ins_specialise_like_the_calls_tensors(triton_backend, monkeypatch):
    """Every launch of a segmented fwd+bwd with a misaligned input: the stand-ins' specialisation keys equal those of
    the arguments the call launches with."""
    triton_backend(segment_len=16)
    ahead, launched = [], []
    monkeypatch.setattr(launch.Launcher, "compile_ahead", lambda self, g, args, c, x: ahead.append(args))
    real_call = launch.Launcher.__call__

    def recording_call(self, grid, args, constexprs, x):
        launched.append(args)
        return real_call(self, grid, args, constexprs, x)

    monkeypatch.setattr(launch.Launcher, "__call__", recording_call)
    monkeypatch.setattr(compile_ahead, "enabled", lambda device: True)
    q, k, v = _inputs(T=48)
    # v one element past an aligned allocation: its launches specialise on a misaligned pointer
    v = torch.randn(1 * 48 * 2 * 16 + 1, device=DEVICE)[1:].view(1, 48, 2, 16).requires_grad_(True)
    assert v.data_ptr() % 16
    o, _ = la.lightning_attn(q, k, v, tnl_slopes(2, 0, 2).to(DEVICE))
    o.float().sum().backward()
    assert len(launched) >= 6 and len(ahead) == len(launched)  # every launch of both passes, built ahead
    assert [launch.specialization_key(a) for a in ahead] == [launch.specialization_key(a) for a in launched]
    assert any(t.data_ptr() % 16 for args in ahead for t in args if isinstance(t, torch.Tensor))  # a misaligned one


@pytest.mark.skipif(compile_ahead.AsyncCompileMode is None, reason="Triton before 3.4 has no AsyncCompileMode")
def test_builds_in_one_block_run_at_once_and_the_block_waits_for_them(monkeypatch):
    monkeypatch.setattr(compile_ahead, "enabled", lambda device: True)
    barrier = threading.Barrier(2, timeout=30)  # each build waits for the other: they must run at the same time
    finished = []

    class TwoBuilds:
        compiled_ahead = False

        def compile_ahead(self, device):
            mode = compile_ahead.active_mode.get()
            for name in ("forward", "backward"):
                mode.submit(name, lambda name=name: (barrier.wait(), name)[1], finished.append)

    program = TwoBuilds()
    compile_ahead.compile_together([program], torch.device("cuda"))
    assert sorted(finished) == ["backward", "forward"] and program.compiled_ahead
    assert compile_ahead.active_mode.get() is None


def test_not_enabled_on_cpu_or_with_the_setting_off(configure):
    assert not compile_ahead.enabled(torch.device("cpu"))
    configure(compile_ahead=False)
    assert not compile_ahead.enabled(torch.device("cuda"))


class WarmupAutotuner(FakeAutotuner):
    """The fake autotuner with Triton's ``warmup``: records each warm-up (what would be built)."""

    def __init__(self):
        super().__init__()
        self.warmups = []

    def warmup(self, *args, grid, **kwargs):
        self.warmups.append((args, kwargs))


class CompilingLauncher(CpuLauncher):
    def reset(self):
        super().reset()
        self.compiles = True  # the fake kernel stands for a compiled JITFunction


def test_launcher_warms_up_until_it_holds_the_compiled_kernel():
    kernel = WarmupAutotuner()
    launcher = CompilingLauncher(kernel, "fake")
    x, out = torch.randn(100), torch.empty(100)
    n = x.numel()
    grid = lambda meta: (n,)  # noqa: E731
    launcher.compile_ahead(grid, (x, out, n), {"A": 2.0}, x)
    assert kernel.warmups == [((x, out, n), {"A": 2.0})]
    _call(launcher, x, out)  # the first launch: the launcher now holds the compiled kernel of this key
    assert len(_compiled(kernel)) == 1
    launcher.compile_ahead(grid, (x, out, n), {"A": 2.0}, x)
    assert len(kernel.warmups) == 1  # nothing more to build for this key
    launcher.compile_ahead(grid, (x[1:], out[1:], n - 1), {"A": 2.0}, x)  # another specialisation: built ahead
    assert len(kernel.warmups) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter runs only without a GPU")
def test_interpreted_kernels_build_nothing():
    """Under the interpreter the Triton kernels have nothing to build (the Gluon ones, which the interpreter does not
    run, are launched on CUDA tensors only)."""
    from lightning_attention.ops.lightning.launches import launchers

    triton_kernels = [lch for lch in launchers() if "two warpgroups" not in lch.name]
    plain = [lch for lch in triton_kernels if "(tuned)" not in lch.name]  # autotuners: made by GPU plans of other tests
    assert len(plain) == 3 and not any(lch.compiles for lch in triton_kernels)
