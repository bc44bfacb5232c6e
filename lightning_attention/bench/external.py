"""Timing functions that other parts of the library provide, found at run time.

``bench decode``, ``bench model`` and ``bench hybrid`` time code that lives beside this harness and is written with
the kernels, the TNL model and the hybrid attention (``decode_timing.py``, ``model_timing.py``, ``hybrid_timing.py``).
When a module or function is not there yet, the harness says so and skips that part instead of failing.
"""

import importlib
import importlib.util
import inspect
from collections.abc import Callable


def find_function(module: str, names: tuple[str, ...]) -> tuple[Callable | None, str]:
    """The first of ``names`` defined in ``module``, or ``(None, reason)``."""
    try:
        missing = importlib.util.find_spec(module) is None
    except ModuleNotFoundError:
        missing = True
    if missing:
        return None, f"{module} does not exist yet"
    try:
        mod = importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - a broken module is reported, not fatal
        return None, f"{module} failed to import: {type(exc).__name__}: {exc}"
    for name in names:
        fn = getattr(mod, name, None)
        if callable(fn):
            return fn, f"{module}.{name}"
    return None, f"{module} defines none of {', '.join(names)}"


def call_with_supported(fn: Callable, *args, **kwargs):
    """Call ``fn`` passing only the keyword arguments its signature accepts (the rest are optional hints)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(*args, **kwargs)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(*args, **kwargs)
    return fn(*args, **{k: v for k, v in kwargs.items() if k in params})


def numbers(result, prefix: str = "") -> dict[str, float]:
    """Flatten a (nested) result dict to ``{"a.b": number}`` for tables and classification."""
    out: dict[str, float] = {}
    if isinstance(result, dict):
        for key, value in result.items():
            out.update(numbers(value, f"{prefix}{key}."))
    elif isinstance(result, (int, float)) and not isinstance(result, bool):
        out[prefix.rstrip(".")] = float(result)
    return out
