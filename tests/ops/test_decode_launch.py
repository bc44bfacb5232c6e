"""The eager decode step's low-overhead host path, on CPU: the cached structural checks of
`check_decode_inputs`, the launch key, and the `Launcher` state machine as the decode step uses it (learn through
Triton's launch, verify the recorded call, then launch directly; fall back for good on any surprise).

No GPU here, so the `Launcher` drives a fake kernel that behaves like a triton 3.8 `JITFunction` on NVIDIA: it
specialises on dtypes, 16-byte alignment, integers equal to 1 / divisible by 16 and constexpr values, "compiles" one
fake `CompiledKernel` per specialisation and launches it the way `JITFunction.run` does,
`compiled.run(grid0, grid1, grid2, stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook, *args)`.
The fake launcher computes the step with the PyTorch reference, so every path gives checkable numbers. The real
launcher is exercised on the GPU (tests/ops/test_decode_gpu.py).
"""

import warnings

import pytest
import torch
import triton
from triton.runtime.jit import JITFunction

import lightning_attention as la
from lightning_attention.ops.lightning import decode_triton
from lightning_attention.ops.lightning import decode_validation as validation
from lightning_attention.ops.lightning.decode import decode_step_torch
from lightning_attention.ops.lightning.launch import Launcher, specialization_key
from lightning_attention.utils.testing import assert_close

STREAM = 0x5EED  # the "current stream" of the fake driver
B, H, K, V, P = 3, 2, 16, 32, 5


def _specialise(a):
    """Triton 3.8's per-argument specialisation on NVIDIA (native_specialize_impl), for run-time arguments."""
    if isinstance(a, torch.Tensor):
        return (str(a.dtype), a.data_ptr() % 16 == 0)
    if isinstance(a, float):
        return ("fp32",)
    if a == 1:
        return ("constexpr", 1)
    return ("i32" if -(2**31) <= a < 2**31 else "i64", a % 16 == 0)


# the kernel's constexprs in signature order, after its 25 run-time arguments
META = ("H", "K", "V", "BK", "BV", "HAS_DECAY", "HAS_INDICES")


def _reference_launch(args):
    """Runs the step the kernel would run for ``args`` (run-time arguments, then META) with the PyTorch path."""
    q, k, v, state, slope, idx, out = args[:7]
    scale, has_decay, has_indices = args[23], args[30], args[31]  # scale; HAS_DECAY, HAS_INDICES (after H..BV)
    decode_step_torch(q, k, v, state, slope if has_decay else None, scale, idx if has_indices else None, out)


class FakeLauncher:
    def __init__(self, compiled):
        self.compiled, self.calls, self.direct_calls, self.reject_direct = compiled, 0, 0, False

    def __call__(self, g0, g1, g2, stream, function, packed, launch_metadata, enter_hook, exit_hook, *args):
        direct = enter_hook is None  # Triton passes its (empty) HookChain objects; the direct path passes None
        if direct and self.reject_direct:
            raise TypeError("launcher(): argument 8 must be a HookChain")  # what a changed C signature raises
        assert (g1, g2, stream) == (1, 1, STREAM)
        assert (function, packed) == (self.compiled.function, self.compiled.packed_metadata)
        self.calls += 1
        self.direct_calls += direct
        _reference_launch(args)


class FakeCompiled:
    """A CompiledKernel as triton 3.4-3.8 have it: ``run`` is a property over ``_run``."""

    handles = iter(range(0xF000, 0xFFFF))

    def __init__(self, num_warps):
        self.function = next(FakeCompiled.handles)
        self.packed_metadata = (num_warps, 1, 0)
        self._run = FakeLauncher(self)
        self.launcher = self._run

    @property
    def run(self):
        return self._run


class FakeJIT:
    """``kernel[grid](*args, num_warps=..., **constexprs)`` as ``JITFunction.run``: bind the constexprs in signature
    order, specialise, look up or compile, launch."""

    arg_names = [f"arg{i}" for i in range(25)] + list(META)

    def __init__(self):
        self.compiled = {}
        self.normal_launches = 0
        self.hidden = lambda: ()  # a specialisation the launcher cannot see (tests make it change)
        self.extra_args = ()  # a calling convention with more arguments (tests set it)

    def __getitem__(self, grid):
        def run(*args, num_warps, **constexprs):
            self.normal_launches += 1
            args = (*args, *(constexprs[name] for name in META))
            spec = (*map(_specialise, args[:25]), *args[25:], num_warps, *self.hidden())
            compiled = self.compiled.get(spec)
            if compiled is None:
                compiled = self.compiled[spec] = FakeCompiled(num_warps)
            rt = triton.knobs.runtime
            compiled.run(
                grid[0], 1, 1, STREAM, compiled.function, compiled.packed_metadata, object(),
                rt.launch_enter_hook, rt.launch_exit_hook, *args, *self.extra_args,
            )  # fmt: skip
            return compiled

        return run

    def direct_launches(self):
        return sum(c.launcher.direct_calls for c in self.compiled.values())


class CpuLauncher(Launcher):
    """A Launcher over the fake kernel, taking CPU tensors; the driver is faked too (device -1 = CPU)."""

    cuda_only = False

    def reset(self):
        super().reset()
        self.disabled = None  # the fake kernel is not a JITFunction, but it is the compiled kernel here

    def _bind_driver(self):
        self.get_device, self.get_stream, self._runtime = (lambda: -1), (lambda device: STREAM), triton.knobs.runtime
        return True


@pytest.fixture
def fake(monkeypatch, configure):
    """(launcher, kernel): the decode step's launcher replaced by one over a fake kernel, Triton backend on CPU, so
    these tests never need the real kernel. Steps the launcher declines go through the fake's normal launch."""
    jit = FakeJIT()
    launcher = CpuLauncher(jit, "fake decode")
    monkeypatch.setattr(decode_triton, "_LAUNCHER", launcher)
    configure(backend="triton")
    return launcher, jit


def _inputs(dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, K, generator=g).to(dtype) for _ in range(2))
    return q, k, torch.randn(B, H, V, generator=g).to(dtype)


def _unaligned(x):
    """The same values in a view whose data pointer is one element past a 16-byte boundary (same strides)."""
    buf = torch.empty(x.numel() + 1, dtype=x.dtype)
    view = buf[1:].view(x.shape)
    view.copy_(x)
    assert view.data_ptr() % 16 != 0 and view.stride() == x.stride()
    return view


class Reference:
    """float64 decode of the same steps: pool [P, H, K, V], slope [H] or None, idx [B] or None."""

    def __init__(self, pool, slope, idx):
        self.s, self.slope, self.idx = pool.double().clone(), slope, idx

    def step(self, q, k, v, scale):
        rows = torch.arange(B) if self.idx is None else self.idx
        live = (rows >= 0).nonzero().squeeze(1)
        r = rows[live]
        s = self.s[r]
        if self.slope is not None:
            s = torch.exp(-self.slope.double())[None, :, None, None] * s
        s = s + torch.einsum("bhk,bhv->bhkv", k[live].double(), v[live].double())
        self.s[r] = s
        o = torch.zeros(B, H, V, dtype=torch.float64)
        o[live] = scale * torch.einsum("bhk,bhkv->bhv", q[live].double(), s)
        return o


def _run_steps(n, pool, slope, idx, ref, *, dtype=torch.float32, transform=lambda x: x, out=None, seed=0):
    for t in range(n):
        q, k, v = (transform(x) for x in _inputs(dtype, seed=seed + t))
        o = la.lightning_attn_decode(q, k, v, pool, slope, scale=0.5, state_indices=idx, out=out)
        assert_close(f"o step {t}", o, ref.step(q, k, v, 0.5), dtype)
    assert_close("state", pool, ref.s, torch.float32)


def test_interpreter_kernel_is_never_launched_directly():
    """Under TRITON_INTERPRET=1 the kernel is an InterpretedFunction: the launcher starts disabled (CPU CI)."""
    if isinstance(decode_triton._LAUNCHER.jit, JITFunction):
        pytest.skip("compiled Triton (no interpreter) in this process")
    assert decode_triton._LAUNCHER.disabled is not None


def test_launch_key_follows_triton_specialisation(fake, monkeypatch):
    """A step's keys: the exact key is equal for a new step of the same signature (new data), and the
    specialisation key (which picks the compiled kernel) differs for every change Triton specialises on; a change
    Triton does not specialise on (another stride divisible by 16, another batch) gets its own exact key but the
    same kernel."""
    launcher, _ = fake
    slope, idx = torch.rand(H), torch.tensor([4, -1, 0], dtype=torch.int32)
    pool, out = torch.zeros(P, H, K, V), torch.zeros(B, H, V)
    monkeypatch.setattr(launcher, "_launch", lambda entry, grid, args, device: None)  # keys only, no launch

    def key(q, k, v, slope=slope, idx=idx, pool=pool, out=out, device=0):
        """(exact key, specialisation key) of the step, as the launcher builds them on ``device``."""
        seen = []
        real = launcher._exact_key

        def exact(dev, args, constants):
            seen.append((device, specialization_key(args), constants))
            return real(device, args, constants)

        launcher._exact_key = exact
        try:
            decode_triton.launch_decode_step(q, k, v, pool, slope, 0.5, idx, out)
        finally:
            launcher._exact_key = real
        (spec,) = seen
        args = (q, k, v, pool, slope if slope is not None else q, idx if idx is not None else q, out)
        strides = (*q.stride(), *k.stride(), *v.stride(), *pool.stride(), *out.stride(), 0.5)
        return real(device, (*args, *strides), spec[2]), spec

    base_exact, base_spec = key(*_inputs(seed=0))
    assert key(*_inputs(seed=1))[0] == base_exact, "a new step of the same signature must reuse the entry"
    q, k, v = _inputs()
    variants = {
        "unaligned q": key(_unaligned(q), k, v),
        "unaligned out": key(q, k, v, out=_unaligned(out)),
        "bf16": key(*_inputs(torch.bfloat16), out=out.bfloat16()),
        "pool [P, H, V, K] transposed": key(q, k, v, pool=torch.zeros(P, H, V, K).transpose(-1, -2)),
        "no slope": key(q, k, v, slope=None),  # q is fp32 like slope: the flag, not the dtype, tells them apart
        "no indices": key(q, k, v, idx=None),
        "int64 indices": key(q, k, v, idx=idx.long()),
        "other device": key(q, k, v, device=1),
    }
    same = [name for name, (_, spec) in variants.items() if spec == base_spec]
    assert not same, same
    specs = [spec for _, spec in variants.values()]
    assert len(set(specs)) == len(specs)
    # v's strides 128, 64 (still multiples of 16): its own exact key, the same compiled kernel
    strided_exact, strided_spec = key(q, k, torch.randn(B, H, 2 * V)[..., :V])
    assert strided_exact != base_exact and strided_spec == base_spec
    # another batch changes only the grid, which the launch passes on every call: the same keys
    assert key(*(x[:2] for x in (q, k, v)), idx=idx[:2], out=out[:2]) == (base_exact, base_spec)


def test_learns_verifies_then_launches_directly(fake):
    """Step 1 launches through Triton (compile), step 2 through Triton with the recorder (verify), then direct; the
    numbers match float64 at every step, padding slot included."""
    cache, jit = fake
    pool, slope, idx = torch.randn(P, H, K, V), torch.tensor([0.1, 2.0]), torch.tensor([4, -1, 0])
    ref = Reference(pool, slope, idx)
    out = torch.empty(B, H, V)
    _run_steps(1, pool, slope, idx, ref, out=out)
    (entry,) = cache.entries.values()
    assert entry.compiled is not None and entry.launcher is None and jit.normal_launches == 1
    _run_steps(1, pool, slope, idx, ref, out=out, seed=1)
    assert entry.launcher is not None and jit.normal_launches == 2
    _run_steps(4, pool, slope, idx, ref, out=out, seed=2)
    assert jit.normal_launches == 2 and jit.direct_launches() == 4
    assert cache.disabled is None and len(jit.compiled) == 1
    assert torch.equal(out[1], torch.zeros(H, V)), "padding slot output must be zero"


def test_repeated_steps_take_their_structures_bound_launch(fake):
    """Once verified, a step whose structure passed the checks before launches through the bound launch its
    structure keeps per (scale, pointer alignment): one record per structure, one bound launch per alignment, right
    numbers at every step. A launcher reset makes the kept bound launch decline: it is dropped, the step launches in
    full (learn, verify) and binds again."""
    launcher, jit = fake
    pool, slope, idx = torch.randn(P, H, K, V), torch.tensor([0.1, 2.0]), torch.tensor([4, -1, 0])
    ref = Reference(pool, slope, idx)
    out = torch.empty(B, H, V)
    decode_triton._STRUCTURE_LAUNCHES.clear()
    _run_steps(4, pool, slope, idx, ref, out=out)
    (launch,) = decode_triton._STRUCTURE_LAUNCHES.values()
    assert list(launch.bound) == [(0.5, True)] and jit.normal_launches == 2 and jit.direct_launches() == 2
    _run_steps(3, pool, slope, idx, ref, out=out, transform=_unaligned, seed=10)  # same structure, unaligned q, k, v
    assert len(decode_triton._STRUCTURE_LAUNCHES) == 1 and len(launch.bound) == 2
    assert jit.normal_launches == 4 and jit.direct_launches() == 3
    launcher.reset()
    _run_steps(3, pool, slope, idx, ref, out=out, seed=20)
    assert jit.normal_launches == 6 and jit.direct_launches() == 4 and launcher.disabled is None


def test_a_replaced_launcher_gets_new_structure_launches(fake, monkeypatch):
    """The kept launch of a structure belongs to the launcher it was made for: another launcher (a test's, or
    one made after a reload) is never bypassed by a bound launch of the old one."""
    _, first_jit = fake
    pool, slope, idx = torch.randn(P, H, K, V), torch.tensor([0.1, 2.0]), torch.tensor([4, -1, 0])
    ref = Reference(pool, slope, idx)
    _run_steps(3, pool, slope, idx, ref)
    second_jit = FakeJIT()
    monkeypatch.setattr(decode_triton, "_LAUNCHER", CpuLauncher(second_jit, "second fake decode"))
    _run_steps(3, pool, slope, idx, ref, seed=5)
    assert first_jit.normal_launches == 2 and first_jit.direct_launches() == 1
    assert second_jit.normal_launches == 2 and second_jit.direct_launches() == 1


def test_alignment_dtype_and_layout_changes_take_their_own_kernel(fake):
    """A view one element off 16 bytes, another dtype, no slope / indices: each is a new key that starts with
    Triton's launch, gets its own compiled kernel, and is launched directly once verified; alternating between
    them later stays direct."""
    cache, jit = fake
    pool, slope, idx = torch.randn(P, H, K, V), torch.tensor([0.3, 1.0]), torch.tensor([2, 0, -1])
    ref = Reference(pool, slope, idx)
    _run_steps(3, pool, slope, idx, ref)
    _run_steps(3, pool, slope, idx, ref, transform=_unaligned, seed=10)
    _run_steps(3, pool, slope, idx, ref, dtype=torch.bfloat16, seed=20)
    assert len(cache.entries) == 3 and len(jit.compiled) == 3 and jit.normal_launches == 6
    for seed in (30, 40):
        _run_steps(1, pool, slope, idx, ref, transform=_unaligned, seed=seed)
        _run_steps(1, pool, slope, idx, ref, seed=seed + 1)
    assert jit.normal_launches == 6 and jit.direct_launches() == 3 + 4

    pool2 = torch.randn(B, H, K, V)
    ref2 = Reference(pool2, None, None)
    _run_steps(3, pool2, None, None, ref2)  # HAS_DECAY = HAS_INDICES = False: another kernel
    assert len(jit.compiled) == 4 and all(e.launcher is not None for e in cache.entries.values())


def test_calling_convention_mismatch_disables_for_good(fake):
    """A Triton that passes its launcher other arguments than the direct path would: the verification sees it,
    warns once, and every step (that one included) goes through Triton's launch, with right numbers."""
    cache, jit = fake
    jit.extra_args = (None,)  # e.g. a new trailing launcher argument
    pool, slope, idx = torch.randn(P, H, K, V), torch.tensor([0.1, 2.0]), torch.tensor([4, -1, 0])
    ref = Reference(pool, slope, idx)
    _run_steps(1, pool, slope, idx, ref)
    with pytest.warns(RuntimeWarning, match="direct kernel launch disabled.*positional arguments"):
        _run_steps(1, pool, slope, idx, ref, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one warning, not one per step
        _run_steps(3, pool, slope, idx, ref, seed=2)
    assert cache.disabled and not cache.entries and jit.direct_launches() == 0 and jit.normal_launches == 5


def test_hidden_specialisation_disables_for_good(fake):
    """If Triton picks another compiled kernel for the same launch key (the key missed something it specialises
    on), the verification fails and the direct path is never used: no stale specialisation is launched."""
    cache, jit = fake
    flips = iter(range(1000))
    jit.hidden = lambda: (next(flips),)  # every launch specialises differently
    pool, slope, idx = torch.randn(P, H, K, V), torch.tensor([0.1, 2.0]), torch.tensor([4, -1, 0])
    ref = Reference(pool, slope, idx)
    with pytest.warns(RuntimeWarning, match="another compiled kernel"):
        _run_steps(2, pool, slope, idx, ref)
    _run_steps(2, pool, slope, idx, ref, seed=5)
    assert cache.disabled and jit.direct_launches() == 0 and jit.normal_launches == 4


def test_launcher_type_error_falls_back_once(fake):
    """The direct call raises TypeError (the launcher parses its arguments before launching): the fast path is
    disabled, and that step runs exactly once through Triton's launch (the state shows one update, not two)."""
    cache, jit = fake
    pool, slope, idx = torch.randn(P, H, K, V), torch.tensor([0.1, 2.0]), torch.tensor([4, -1, 0])
    ref = Reference(pool, slope, idx)
    _run_steps(2, pool, slope, idx, ref)
    (compiled,) = jit.compiled.values()
    compiled.launcher.reject_direct = True
    with pytest.warns(RuntimeWarning, match="rejected the direct call: TypeError"):
        _run_steps(1, pool, slope, idx, ref, seed=2)
    _run_steps(2, pool, slope, idx, ref, seed=3)
    assert cache.disabled and jit.direct_launches() == 0 and jit.normal_launches == 2 + 1 + 2


class SealedCompiled(FakeCompiled):
    """A compiled kernel whose launcher attribute cannot be replaced (the recorder cannot be installed)."""

    def __setattr__(self, name, value):
        if name == "_run" and hasattr(self, "_run"):
            raise AttributeError("can't set attribute '_run'")
        super().__setattr__(name, value)


def test_unrecordable_launch_disables_and_launches_once(fake):
    """If the recorder cannot be put in place, the step launches once through Triton and the direct path is off."""
    cache, jit = fake
    pool, slope, idx = torch.randn(P, H, K, V), torch.tensor([0.1, 2.0]), torch.tensor([4, -1, 0])
    ref = Reference(pool, slope, idx)
    _run_steps(1, pool, slope, idx, ref)
    (compiled,) = jit.compiled.values()
    compiled.__class__ = SealedCompiled
    with pytest.warns(RuntimeWarning, match="cannot record Triton's launch"):
        _run_steps(1, pool, slope, idx, ref, seed=1)
    _run_steps(1, pool, slope, idx, ref, seed=2)
    assert cache.disabled and jit.normal_launches == 3 and jit.direct_launches() == 0


def test_launch_hooks_take_tritons_launch(fake):
    """While a launch hook is set (a profiler), steps go through Triton's launch; once the hook is removed the direct
    launch resumes."""
    cache, jit = fake
    pool, slope, idx = torch.randn(P, H, K, V), torch.tensor([0.1, 2.0]), torch.tensor([4, -1, 0])
    ref = Reference(pool, slope, idx)
    _run_steps(3, pool, slope, idx, ref)
    assert jit.direct_launches() == 1

    def hook(metadata):
        pass

    triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        q = _inputs()[0]
        assert cache.device_for(q) is None
        _run_steps(2, pool, slope, idx, ref, seed=3)
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    assert jit.direct_launches() == 1 and jit.normal_launches == 4
    assert cache.device_for(q) == -1
    _run_steps(1, pool, slope, idx, ref, seed=6)
    assert jit.direct_launches() == 2 and cache.disabled is None


def test_bounded_entries_start_over(fake):
    cache, _ = fake
    cache.max_entries = 2
    pool, slope, idx = torch.randn(P, H, K, V), torch.tensor([0.1, 2.0]), torch.tensor([4, -1, 0])
    ref = Reference(pool, slope, idx)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        _run_steps(1, pool, slope, idx, ref, dtype=dtype)
    assert len(cache.entries) == 1


def test_decode_signature_cache_keeps_every_check(configure):
    """A remembered signature skips only the structural checks; a call that differs in anything they read is
    checked in full, and the value checks (CPU tensors: always) run on every call."""
    configure(backend="torch")
    validation._DECODE_PASSED.clear()
    pool, slope, idx = torch.zeros(P, H, K, V), torch.rand(H), torch.tensor([4, -1, 0])
    q, k, v = _inputs()
    la.lightning_attn_decode(q, k, v, pool, slope, state_indices=idx)
    assert len(validation._DECODE_PASSED) == 1
    la.lightning_attn_decode(*_inputs(seed=1), pool, slope, state_indices=idx)
    assert len(validation._DECODE_PASSED) == 1, "same signature, new tensors: one entry"
    before = pool.clone()
    with pytest.raises(ValueError, match="must not repeat"):
        la.lightning_attn_decode(q, k, v, pool, slope, state_indices=torch.tensor([4, 4, 0]))
    with pytest.raises(ValueError, match="must be in"):
        la.lightning_attn_decode(q, k, v, pool, slope, state_indices=torch.tensor([4, 5, 0]))
    with pytest.raises(ValueError, match="slope must be >= 0"):
        la.lightning_attn_decode(q, k, v, pool, -slope, state_indices=idx)
    with pytest.raises(TypeError, match="out must have the dtype"):
        la.lightning_attn_decode(q, k, v, pool, slope, state_indices=idx, out=torch.zeros(B, H, V).half())
    with pytest.raises(TypeError, match="scale must be a Python float"):
        la.lightning_attn_decode(q, k, v, pool, slope, scale=True, state_indices=idx)
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        la.lightning_attn_decode(q.numpy(), k, v, pool, slope, state_indices=idx)
    with pytest.raises(ValueError, match="state must have shape"):
        la.lightning_attn_decode(q, k, v, pool[..., :-1], slope, state_indices=idx)
    assert torch.equal(pool, before), "rejected calls must not touch the pool"
    assert len(validation._DECODE_PASSED) == 1, "failed signatures are not remembered"
    assert validation.decode_signature(q, k, v, pool, slope, 1.0, idx, None) != validation.decode_signature(
        q, k, v, pool, slope, 1, idx, None
    ), "the type of scale is part of the signature"


def test_decode_signature_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(validation, "_DECODE_PASSED_MAX", 3)
    validation._DECODE_PASSED.clear()
    for b in range(1, 6):
        x = torch.zeros(b, H, K)
        validation.check_decode_inputs(x, x, torch.zeros(b, H, V), torch.zeros(b, H, K, V), None, scale=1.0,
                                       state_indices=None, out=None)  # fmt: skip
    assert len(validation._DECODE_PASSED) <= 3
