"""Launch configurations measured per shape class on a GPU architecture, launched instead of autotuning.

An autotuned launch (the chunk walk, the fused dk/dv walk) times its candidates on the first call of a shape class:
one compile per candidate, and a choice that can flip between processes where two candidates run within the
timing noise. A table entry fixes the configuration of one shape class on one architecture ahead of time: the
launch compiles only that one, and every process and machine of that architecture takes the same. A launch whose
class has no entry, or whose entry is not among the candidates the selector offers there (another shared-memory
limit, a pinned configuration), is autotuned as before; the ``tuned_table`` setting off autotunes every launch.

``benchmarks/tune_table.py`` measures the entries on a GPU (each candidate of each class pinned in turn, each call
timed by its kernels, ties within the noise left to the selector's order) and writes ``tuned_sm<NN>.py``; its
docstring names the GPU, the commit and the command. For an architecture no GPU here can time it writes the
selector's first candidates instead (``--first-candidates``), which tests/ops/test_aot.py compiles for that target.
A key is :func:`table_key`.
"""

import contextlib
from collections.abc import Iterator, Mapping

from lightning_attention.ops.lightning.kernels import tuned_sm80, tuned_sm90, tuned_sm100

_MODULES = {80: tuned_sm80, 90: tuned_sm90, 100: tuned_sm100}
# compute capability -> {key -> (BT, BV, num_warps, num_stages)}
TABLES: dict[int, Mapping[tuple, tuple[int, int, int, int]]] = {cc: m.CONFIGS for cc, m in _MODULES.items()}
# the architectures whose table was never timed on their GPU: the selector's first candidates, compile-checked
# (sm_80 and sm_100 at K = 128; docs/kernels.md, "The tuned table")
UNTIMED: frozenset[int] = frozenset(cc for cc, m in _MODULES.items() if not m.MEASURED)

_override: Mapping[tuple, tuple[int, int, int, int]] | None = None


def table_key(kind: str, dtype: str, values: Mapping, fields) -> tuple:
    """The key of one launch: ``kind`` ("walk" or "dkdv"), the input ``dtype`` name, the inter-product precision
    (``values["INTER_PREC"]``) and the values of the kernel's autotuning key ``fields`` (constexprs and the WAVES
    argument, as the launch passes them)."""
    return (kind, dtype, values["INTER_PREC"], *(values[name] for name in fields))


def tuned_config(capability: int, key: tuple) -> tuple[int, int, int, int] | None:
    """(BT, BV, num_warps, num_stages) measured for ``key`` on GPUs of ``capability``, or None."""
    table = _override if _override is not None else TABLES.get(capability, {})
    return table.get(key)


@contextlib.contextmanager
def override(table: Mapping[tuple, tuple[int, int, int, int]]) -> Iterator[None]:
    """Within the block, ``table`` replaces the shipped tables of every architecture (the measuring script and
    tests). Launch decisions are part of the cached programs: clear them (``run.clear_programs``) on entering and
    leaving."""
    global _override
    previous, _override = _override, dict(table)
    try:
        yield
    finally:
        _override = previous
