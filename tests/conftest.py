"""Test configuration.

- Without CUDA, Triton kernels run under the interpreter: TRITON_INTERPRET=1 is set here, before anything imports
  a ``@triton.jit`` function, and the test-only interpreter shims are installed. With CUDA the interpreter stays off,
  so the same tests run compiled (``pytest -m gpu`` adds the real-size cases).
- Every ``torch.empty*`` allocation made from inside the package is filled with NaN (integers with a large sentinel),
  so an output element that a kernel forgets to write fails the test instead of passing by luck.
"""

import contextlib
import gc
import os
import sys

import pytest
import torch
import torch.utils._device as torch_device_context

from lightning_attention import settings

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if os.environ["TRITON_INTERPRET"] == "1":
        try:
            import tests.interpreter.autotune  # noqa: F401
            import tests.interpreter.bf16
            import tests.interpreter.tf32  # noqa: F401
        except ImportError:  # triton not installed: only the PyTorch path can be tested
            pass

PACKAGE = "lightning_attention"


def _called_from_package() -> bool:
    # frame 0 is this helper, 1 the patched allocator, 2 its caller
    module = sys._getframe(2).f_globals.get("__name__", "")
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def _poison(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype != torch.bool:
        t.fill_(torch.iinfo(t.dtype).max // 2 + 7)
    return t


# The allocators are wrapped once, at import, so torch.compile sees the same functions in every test (Dynamo caches
# its table of torch functions per process); the autouse fixture only switches the poisoning on and off.
_POISON_ACTIVE = [False]


def _poisoning(fn):
    def poisoned(*args, **kwargs):
        t = fn(*args, **kwargs)
        # is_compiling() first: while Dynamo traces, the frame inspection below must not be reached
        if torch.compiler.is_compiling() or not _POISON_ACTIVE[0]:
            return t
        if _called_from_package():
            _poison(t)
        return t

    return poisoned


# a `with torch.device(...)` block recognises the allocators it redirects by identity, from a set it builds once: built
# now, it holds the originals that the wrappers call, so meta-device builds stay on the meta device
torch_device_context._device_constructors()
torch.empty = _poisoning(torch.empty)
torch.empty_like = _poisoning(torch.empty_like)
torch.empty_strided = _poisoning(torch.empty_strided)
torch.Tensor.new_empty = _poisoning(torch.Tensor.new_empty)


@pytest.fixture(autouse=True)
def poison_empty():
    """Fill uninitialised allocations made inside the package with NaN for the duration of each test."""
    _POISON_ACTIVE[0] = True
    yield
    _POISON_ACTIVE[0] = False


@pytest.fixture(autouse=True)
def fresh_programs():
    """Every test starts without cached chunk programs (ops/lightning/run.py): tests replace planning functions and
    launchers that a program's key cannot see, so a program built by an earlier test must not serve a later one."""
    try:
        from lightning_attention.ops.lightning import run
    except ImportError:  # triton not installed
        yield
        return
    run.clear_programs()
    yield


@pytest.fixture(autouse=True)
def release_gpu_memory():
    """GPU tests run in several pytest-xdist workers on one GPU: each test hands its cached blocks back, so that
    memory one worker no longer uses is free for the others."""
    yield
    if torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()


@pytest.fixture
def fresh_dynamo():
    """A clean Dynamo for a compile test. The NaN poisoning above puts a new ``torch.empty`` wrapper in place for every
    test, while Dynamo reads its table of torch functions once per process (``functools.cache``): a compile test that
    is not the first to compile would meet a wrapper, and inside it a builtin, that the stale table does not know."""
    from torch._dynamo import trace_rules

    torch._dynamo.reset()
    trace_rules.get_torch_obj_rule_map.cache_clear()
    yield
    torch._dynamo.reset()
    trace_rules.get_torch_obj_rule_map.cache_clear()


@pytest.fixture
def configure():
    """``configure(**changes)``: library settings (``lightning_attention.settings.override``) for the rest of the
    test, e.g. ``configure(backend="triton", segment_len=32)``."""
    with contextlib.ExitStack() as stack:
        yield lambda **changes: stack.enter_context(settings.override(**changes))


@pytest.fixture
def triton_backend(configure):
    """The Triton kernels on every tensor (under the interpreter on CPU); returns ``configure`` for more settings."""
    configure(backend="triton")
    return configure


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        for item in items:  # the large ones share one xdist group: two of them never hold the GPU's memory at once
            if "gpu_memory" in item.keywords:
                item.add_marker(pytest.mark.xdist_group("gpu_memory"))
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
