"""Launch configurations measured on sm_90 (read through :mod:`lightning_attention.ops.lightning.kernels.tuned`).

Written by ``benchmarks/tune_table.py``; empty until a run on an sm_90 GPU fills it: every launch autotunes.
"""

CONFIGS: dict[tuple, tuple[int, int, int, int]] = {}
