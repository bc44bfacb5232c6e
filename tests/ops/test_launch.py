"""The direct launch (``ops/lightning/launch.py``) on CPU: keyword constexprs, an autotuned kernel whose chosen
configuration becomes part of the direct call, grids that are functions of the constexprs, bound launches, and the
fall-backs. The decode step's use of it is covered by tests/ops/test_decode_launch.py.

No GPU here: a fake autotuner over a fake kernel behaves like triton 3.8's ``Autotuner.run`` -> ``JITFunction.run``
on NVIDIA (specialise, pick or reuse a compiled kernel, call its launcher with every argument in signature order) and
its launcher computes ``out = A · x`` over the first ``n`` elements, so every path gives checkable numbers. The real
launchers run on the GPU (tests/ops/test_chunk_gpu.py).
"""

import warnings

import pytest
import torch
import triton

from lightning_attention import settings
from lightning_attention.ops.lightning import launch as klaunch

STREAM = 0xC0FFEE
ARG_NAMES = ["x", "out", "n", "A", "BLOCK"]  # the fake kernel's signature: 3 run-time arguments, 2 constexprs


class FakeCompiled:
    handles = iter(range(0x1000, 0x2000))

    def __init__(self):
        self.function, self.packed_metadata = next(FakeCompiled.handles), (4, 1, 0)
        self.calls = self.direct_calls = 0
        self.seen_grids = []
        self._run = self._launch

    def _launch(self, g0, g1, g2, stream, function, packed, launch_metadata, enter_hook, exit_hook, *args):
        assert (stream, function, packed) == (STREAM, self.function, self.packed_metadata)
        x, out, n, A, BLOCK = args
        assert g0 == triton.cdiv(n, BLOCK) and (g1, g2) == (1, 1)
        self.calls += 1
        self.direct_calls += enter_hook is None  # Triton passes its (empty) HookChain; the direct path passes None
        out[:n] = A * x[:n]

    @property
    def run(self):
        return self._run


def _specialise(a):
    if isinstance(a, torch.Tensor):
        return (str(a.dtype), a.data_ptr() % 16 == 0)
    return ("constexpr", 1) if a == 1 else ("i32", a % 16 == 0)


class FakeJIT:
    """``JITFunction.run`` with keyword constexprs: binds by name, specialises, compiles once per key, launches."""

    arg_names = ARG_NAMES

    def __init__(self):
        self.compiled, self.normal_launches = {}, 0

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.normal_launches += 1
            bound = dict(zip(ARG_NAMES, args)) | {k: v for k, v in kwargs.items() if k in ARG_NAMES}
            ordered = [bound[n] for n in ARG_NAMES]
            spec = (*map(_specialise, ordered[:3]), *ordered[3:], kwargs.get("num_warps", 4))
            compiled = self.compiled.setdefault(spec, FakeCompiled())
            g = grid(bound) if callable(grid) else grid
            rt = triton.knobs.runtime
            compiled.run(g[0], 1, 1, STREAM, compiled.function, compiled.packed_metadata, object(),
                         rt.launch_enter_hook, rt.launch_exit_hook, *ordered)  # fmt: skip
            return compiled

        return run


class FakeAutotuner:
    """``Autotuner.run``: the configuration's kwargs join the caller's, ``best_config`` is set, the JIT launches."""

    def __init__(self, block=64, pre_hook=None):
        self.fn = FakeJIT()
        self.best_config = None
        self.block, self.pre_hook = block, pre_hook

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.best_config = triton.Config({"BLOCK": self.block}, num_warps=4, pre_hook=self.pre_hook)
            return self.fn[grid](*args, **kwargs, **self.best_config.all_kwargs())

        return run


class CpuLauncher(klaunch.Launcher):
    """A Launcher over a fake kernel on CPU tensors, with a fake driver (device -1 = CPU)."""

    cuda_only = False

    def reset(self):
        super().reset()
        self.disabled = None  # the fake kernel stands for a compiled one

    def _bind_driver(self):
        self.get_device, self.get_stream, self._runtime = (lambda: -1), (lambda device: STREAM), triton.knobs.runtime
        return True


def _launcher(kernel):
    return CpuLauncher(kernel, "fake")


def _call(launcher, x, out, A=2.0):
    n = x.numel()
    launcher(lambda meta: (triton.cdiv(n, meta["BLOCK"]),), (x, out, n), {"A": A}, x)


def _compiled(kernel):
    return list(kernel.fn.compiled.values())


def test_specialization_key_sees_what_triton_sees():
    x = torch.zeros(64)
    key = klaunch.specialization_key
    assert key((x, 16, 1, 0.5)) == ((torch.float32, True), (False, True, True), (True, False, True), float)
    assert key((x[1:],))[0] == (torch.float32, False)  # 4 bytes past a 16-byte boundary
    assert key((2**31,)) != key((2**31 - 16,))  # int32 vs int64 range
    assert key((x.to(torch.bfloat16),)) != key((x,))
    # a tuple argument (a kernel's stride group) is specialised element by element, as Triton does
    assert key(((32, 16, 1),)) == (((False, True, True), (False, True, True), (True, False, True)),)
    assert key(((32, 17, 128),)) != key(((32, 16, 128),)) and key(((0, 0),)) != key(((0, 1),))


def test_autotuned_kernel_learns_verifies_then_launches_directly():
    kernel = FakeAutotuner(block=32)
    launcher = _launcher(kernel)
    for step in range(5):
        x, out = torch.randn(100), torch.full((100,), float("nan"))  # poisoned output
        _call(launcher, x, out)
        torch.testing.assert_close(out, 2.0 * x)
    (compiled,) = _compiled(kernel)
    assert kernel.fn.normal_launches == 2  # learn, verify; then direct
    assert compiled.calls == 5 and compiled.direct_calls == 3
    (entry,) = launcher.entries.values()
    assert entry.tail == (2.0, 32) and entry.config["BLOCK"] == 32  # the chosen BLOCK is in the direct call


def test_one_entry_serves_every_length_and_new_specialisations_get_their_own():
    kernel = FakeAutotuner()
    launcher = _launcher(kernel)
    for n in (48, 4096, 80, 4096 + 16):  # all divisible by 16, != 1: one key
        for _ in range(3):
            x, out = torch.randn(n), torch.zeros(n)
            _call(launcher, x, out)
            torch.testing.assert_close(out, 2.0 * x)
    assert len(launcher.entries) == 1 and kernel.fn.normal_launches == 2
    x, out = torch.randn(33), torch.zeros(33)  # n % 16 != 0: another key, learnt again
    for _ in range(3):
        _call(launcher, x, out)
    assert len(launcher.entries) == 2 and kernel.fn.normal_launches == 4
    for _ in range(3):  # another constexpr value: another key
        _call(launcher, x, out, A=3.0)
    torch.testing.assert_close(out, 3.0 * x)
    assert len(launcher.entries) == 3 and kernel.fn.normal_launches == 6


def test_exact_keys_alias_the_entry_of_their_specialisation():
    """Repeated shapes find their entry by the exact key (no specialisation key built); lengths that specialise the
    same share one entry through their own aliases; the aliases stay bounded and go with a reset."""
    kernel = FakeAutotuner()
    launcher = _launcher(kernel)
    calls = []
    real_key = klaunch.specialization_key
    klaunch.specialization_key = lambda args: calls.append(1) or real_key(args)
    try:
        for n in (48, 4096, 48, 4096, 48):
            x, out = torch.randn(n), torch.full((n,), float("nan"))
            _call(launcher, x, out)
            torch.testing.assert_close(out, 2.0 * x)
    finally:
        klaunch.specialization_key = real_key
    cache = launcher
    assert len(calls) == 2  # one per new exact key (n = 48, 4096), none for the repeats
    assert len(cache.entries) == 1 and len(cache.aliases) == 2
    assert len({id(e) for e in cache.aliases.values()}) == 1
    assert launcher.num_tensors == 2  # (x, out) lead the arguments
    assert kernel.fn.normal_launches == 2  # learn, verify; then direct whatever the length
    cache.max_entries = 2
    for n in range(16, 16 * 12, 16):  # more exact keys than 4 x max_entries: the aliases start over
        _call(launcher, torch.randn(n), torch.zeros(n))
    assert len(cache.aliases) <= 4 * cache.max_entries
    cache.reset()
    assert not cache.aliases and not cache.entries


def test_bound_launch_skips_the_key_and_stops_after_a_reset_or_with_a_hook():
    """Launcher.bind (what cached programs use): nothing to bind until the entry is verified; then a bound call
    launches the compiled kernel directly with new tensors of the same dtypes and alignments; after a reset, a
    disable or with a launch hook set it declines (returns False, launches nothing) and the caller launches in full."""
    kernel = FakeAutotuner(block=32)
    launcher = _launcher(kernel)
    n = 64
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)  # noqa: E731

    def bind(x, out):
        return launcher.bind(grid, (x, out, n), {"A": 2.0}, x)

    x, out = torch.randn(n), torch.zeros(n)
    assert bind(x, out) is None  # never launched: no entry
    _call(launcher, x, out)
    assert bind(x, out) is None  # learnt, not yet verified
    _call(launcher, x, out)
    bound = bind(x, out)
    assert bound is not None and bound.grid == (2, 1, 1) and not bound.pointers  # CPU fake: tensors, not ints
    (compiled,) = _compiled(kernel)
    direct = compiled.direct_calls
    x2, out2 = torch.randn(n), torch.full((n,), float("nan"))
    assert bound((x2, out2, n), x2)
    torch.testing.assert_close(out2, 2.0 * x2)
    assert compiled.direct_calls == direct + 1 and kernel.fn.normal_launches == 2

    rt = triton.knobs.runtime
    saved = rt.launch_enter_hook
    rt.launch_enter_hook = lambda *a: None
    try:
        assert not bound((x2, out2, n), x2)
    finally:
        rt.launch_enter_hook = saved
    launcher.reset()
    out3 = torch.full((n,), float("nan"))
    assert not bound((x2, out3, n), x2) and torch.isnan(out3).all()
    assert compiled.direct_calls == direct + 1


def test_config_pre_hook_disables_for_good():
    kernel = FakeAutotuner(pre_hook=lambda nargs: None)
    launcher = _launcher(kernel)
    with pytest.warns(RuntimeWarning, match="hooks around the launch"):
        _call(launcher, torch.randn(16), torch.zeros(16))
    for _ in range(3):
        x, out = torch.randn(16), torch.zeros(16)
        _call(launcher, x, out)
        torch.testing.assert_close(out, 2.0 * x)
    assert launcher.disabled and sum(c.direct_calls for c in _compiled(kernel)) == 0


def test_signature_default_not_passed_disables():
    """A constexpr left to its default is not in the call: the direct call could not pass it, so no fast path."""
    kernel = FakeAutotuner()
    kernel.fn.arg_names = [*ARG_NAMES, "UNSEEN"]
    launcher = _launcher(kernel)
    with pytest.warns(RuntimeWarning, match="UNSEEN"):
        _call(launcher, torch.randn(16), torch.zeros(16))
    assert launcher.disabled


def test_hidden_specialisation_disables_for_good():
    """If Triton picks another compiled kernel under the same key, the verification catches it before any direct
    launch."""
    kernel = FakeAutotuner()
    launcher = _launcher(kernel)
    x, out = torch.randn(16), torch.zeros(16)
    _call(launcher, x, out)
    kernel.fn.compiled.clear()  # the next normal launch "compiles" a new kernel for the same key
    with pytest.warns(RuntimeWarning, match="another compiled kernel"):
        _call(launcher, x, out)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _call(launcher, x, out)
    torch.testing.assert_close(out, 2.0 * x)
    assert launcher.disabled and sum(c.direct_calls for c in _compiled(kernel)) == 0


def test_plain_kernel_with_keyword_constexprs_and_fixed_grid():
    """A plain (not autotuned) kernel launched with keyword constexprs and num_warps, as the scan is."""
    kernel = FakeJIT()
    launcher = _launcher(kernel)
    for _ in range(4):
        x, out = torch.randn(64), torch.zeros(64)
        launcher((4,), (x, out, 64), {"A": 0.5, "BLOCK": 16, "num_warps": 4}, x)
        torch.testing.assert_close(out, 0.5 * x)
    (compiled,) = kernel.compiled.values()
    assert kernel.normal_launches == 2 and compiled.direct_calls == 2
    (entry,) = launcher.entries.values()
    assert entry.tail == (0.5, 16)  # num_warps is a launch option, not an argument


def test_interpreter_and_cpu_tensors_take_tritons_launch():
    """The real launchers under TRITON_INTERPRET=1 (CI): never a direct launch. (The Gluon kernels have no
    interpreter: they are only ever launched on an sm_90 GPU.)"""
    from lightning_attention.ops.lightning import launches

    for launcher in launches.launchers():
        if "two warpgroups" in launcher.name:
            continue
        if isinstance(launcher.jit, klaunch.JITFunction):
            pytest.skip("compiled Triton (no interpreter) in this process")
        assert launcher.disabled is not None
        assert launcher.device_for(torch.zeros(1)) is None


def test_setting_turns_the_fast_path_off():
    """direct_launch=False: every launch goes through Triton, and a bound launch declines."""
    kernel = FakeAutotuner()
    launcher = _launcher(kernel)
    x, out = torch.randn(16), torch.zeros(16)
    for _ in range(2):
        _call(launcher, x, out)
    bound = launcher.bind(lambda meta: (triton.cdiv(16, meta["BLOCK"]),), (x, out, 16), {"A": 2.0}, x)
    assert bound is not None
    with settings.override(direct_launch=False):
        for _ in range(2):
            _call(launcher, x, out)
        assert not bound((x, out, 16), x)
    assert kernel.fn.normal_launches == 4 and sum(c.direct_calls for c in _compiled(kernel)) == 0
    _call(launcher, x, out)
    assert sum(c.direct_calls for c in _compiled(kernel)) == 1
