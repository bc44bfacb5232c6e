"""What the Triton backend runs on CPU tensors, under Triton's interpreter (``TRITON_INTERPRET=1``, README).

float32, float16 and float64 run every op as on a GPU: the kernels are the same (Triton's interpreter computes a
float32 product exactly where the GPU runs tf32 or three tf32 products; the test suite's shims compute those as the
GPU does), and a launch the GPU would autotune takes its first candidate configuration (``run._launch_tuned``: the
autotuner's benchmark needs a GPU driver). bfloat16 depends on the interpreter: Triton's (3.8) keeps bfloat16 values
as raw 16-bit patterns and computes products and sums on those integers, so the chunk kernels would return garbage.
The decode step converts its inputs to float32 as it loads them and runs. So the first bfloat16 chunk call on the
interpreter runs a probe kernel once (a 16×16 bfloat16 product and an element-wise product): where the interpreter
computes them right (a Triton that fixed it, or the test suite's shims in tests/interpreter/), bfloat16 runs; where
not, :func:`check_interpreter_dtype` raises NotImplementedError instead of returning garbage.
"""

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

from lightning_attention import settings
from lightning_attention.utils.dtypes import dtype_name

_PROBE_N = 16
_BF16_WORKS: bool | None = None  # the probe's answer, once asked (a plain global: torch.compile warns on caches)


@triton.jit
def _bf16_probe_kernel(a, b, out, N: tl.constexpr):
    i = tl.arange(0, N)
    tile = i[:, None] * N + i[None, :]
    x = tl.load(a + tile)
    y = tl.load(b + tile)
    tl.store(out + tile, tl.dot(x, y, out_dtype=tl.float32) + (x * y).to(tl.float32))


def interpreter_bf16_works() -> bool:
    """Whether this process's Triton interpreter computes bfloat16 products and sums right (probed once)."""
    global _BF16_WORKS
    if _BF16_WORKS is None:
        g = torch.Generator().manual_seed(0)
        a, b = (torch.randn(_PROBE_N, _PROBE_N, generator=g).bfloat16() for _ in range(2))
        out = torch.zeros(_PROBE_N, _PROBE_N)
        try:
            _bf16_probe_kernel[(1,)](a, b, out, N=_PROBE_N)
            want = a.float() @ b.float() + (a * b).float()
            _BF16_WORKS = bool(torch.allclose(out, want, rtol=2e-2, atol=2e-2))
        except Exception:  # an interpreter that cannot run the probe cannot run the kernels either
            _BF16_WORKS = False
    return _BF16_WORKS


def require_interpreter() -> None:
    """Kernels on CPU tensors need Triton's interpreter, which ``TRITON_INTERPRET=1`` turns on when Triton is first
    imported; NotImplementedError saying so otherwise (instead of Triton's "0 active drivers")."""
    if not isinstance(_bf16_probe_kernel, InterpretedFunction):
        raise NotImplementedError(
            "the Triton backend got CPU tensors but Triton's interpreter is off: set TRITON_INTERPRET=1 before "
            "importing lightning_attention (or Triton) to run the kernels on the CPU, or use the PyTorch path for "
            "CPU tensors (LIGHTNING_ATTENTION_BACKEND=auto or torch)"
        )


def check_interpreter_dtype(q: torch.Tensor) -> None:
    """A chunk call on CPU tensors runs under the interpreter, in a dtype it computes right; NotImplementedError
    otherwise (float16 under the split precision computes in bfloat16 too). Nothing to check on CUDA tensors."""
    if q.is_cuda:
        return
    require_interpreter()
    uses_bf16 = q.dtype == torch.bfloat16 or (q.dtype == torch.float16 and settings.current().precision == "split")
    if uses_bf16 and not interpreter_bf16_works():
        raise NotImplementedError(
            f"q is {dtype_name(q.dtype)} on the Triton backend with CPU tensors (computed in bfloat16 "
            "there), and this Triton's interpreter computes bfloat16 arithmetic on raw bit patterns (garbage). There, "
            "use float32 or float16 with the default precision (float64 for references), or the PyTorch path for CPU "
            "tensors (LIGHTNING_ATTENTION_BACKEND=auto or torch)"
        )
