"""Test configuration.

- Without CUDA, Triton kernels run under the interpreter: TRITON_INTERPRET=1 is set here, before anything imports
  a ``@triton.jit`` function, and the test-only interpreter shims are installed. With CUDA the interpreter stays off,
  so the same tests run compiled (``pytest -m gpu`` adds the real-size cases).
- Every ``torch.empty*`` allocation made from inside the package is filled with NaN (integers with a large sentinel),
  so an output element that a kernel forgets to write fails the test instead of passing by luck.
"""

import os
import sys

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if os.environ["TRITON_INTERPRET"] == "1":
        try:
            import tests.interpreter.autotune  # noqa: F401
            import tests.interpreter.bf16  # noqa: F401
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


@pytest.fixture(autouse=True)
def poison_empty(monkeypatch):
    """Fill uninitialised allocations made inside the package with NaN for the duration of each test."""
    originals = {
        "empty": torch.empty,
        "empty_like": torch.empty_like,
        "empty_strided": torch.empty_strided,
        "new_empty": torch.Tensor.new_empty,
    }

    def wrap(fn):
        def poisoned(*args, **kwargs):
            t = fn(*args, **kwargs)
            if _called_from_package() and not torch.compiler.is_compiling():
                _poison(t)
            return t

        return poisoned

    monkeypatch.setattr(torch, "empty", wrap(originals["empty"]))
    monkeypatch.setattr(torch, "empty_like", wrap(originals["empty_like"]))
    monkeypatch.setattr(torch, "empty_strided", wrap(originals["empty_strided"]))
    monkeypatch.setattr(torch.Tensor, "new_empty", wrap(originals["new_empty"]))
    yield


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
