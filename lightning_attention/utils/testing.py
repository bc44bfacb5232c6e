"""Accuracy helpers shared by the tests and the benchmarks (docs/design.md, "Testing discipline").

One tolerance table, relative L2 error against float64 computed from the same (rounded) inputs.
Two low-precision results are never compared with each other: each is compared with float64.
"""

import torch

TOLERANCES = {
    torch.float64: 1e-10,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 5e-3,
}


def tolerance(dtype: torch.dtype) -> float:
    """Relative-L2 tolerance for results computed from inputs of ``dtype``."""
    return TOLERANCES[dtype]


def relative_error(actual: torch.Tensor, reference: torch.Tensor) -> float:
    """‖actual - reference‖₂ / ‖reference‖₂ in float64 (0 when both are exactly zero)."""
    a = actual.detach().to(torch.float64).cpu()
    r = reference.detach().to(torch.float64).cpu()
    den = torch.linalg.vector_norm(r).item()
    num = torch.linalg.vector_norm(a - r).item()
    if den == 0.0:
        return num
    return num / den


def error_over_rounding_floor(actual: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype) -> float:
    """:func:`relative_error` of ``actual`` over that of ``reference`` merely rounded to ``dtype``: 1.0 is the
    smallest error a result returned in ``dtype`` can have (docs/design.md, "Precision")."""
    return relative_error(actual, reference) / relative_error(reference.to(dtype), reference)


def assert_close(name: str, actual: torch.Tensor, reference: torch.Tensor, tol: float | torch.dtype) -> float:
    """Asserts shapes match, ``actual`` has no NaN/inf, and relative L2 error <= ``tol``; returns the error.

    ``tol`` is a number or an input dtype (looked up in :data:`TOLERANCES`).
    """
    if isinstance(tol, torch.dtype):
        tol = tolerance(tol)
    assert actual.shape == reference.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(reference.shape)}"
    finite = torch.isfinite(actual.detach())
    assert bool(finite.all()), f"{name}: {int((~finite).sum())} non-finite values (NaN/inf) in the result"
    err = relative_error(actual, reference)
    assert err <= tol, f"{name}: relative L2 error {err:.3e} > tolerance {tol:.1e}"
    return err
