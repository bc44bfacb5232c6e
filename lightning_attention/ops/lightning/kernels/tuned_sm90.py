"""Launch configurations measured on sm_90 (read through :mod:`lightning_attention.ops.lightning.kernels.tuned`).

Measured on NVIDIA H200 | driver 580.159.04 | CUDA 13.0 | torch 2.11.0+cu130 | triton 3.6.0, the package of
be357e7 (source c056696802cebddd): ``python benchmarks/tune_table.py``, each candidate timed by its call's kernels, 32
entries from 38 of 38 shape classes; every timing in benchmarks/results/h200/tune/tune_table.json. The K = 256
classes have no autotuned launch (the two-warpgroup walk).
"""

MEASURED = True  # timed on a GPU of this architecture (False: the selector's first candidates)

# key: (kind, dtype, INTER_PREC, *the kernel's autotuning key): walk ('DK', 'DV', 'VARLEN', 'REVERSE', 'HAS_DECAY',
# 'STATE_ONLY', 'SEG_IN', 'USE_H0', 'INTER_ONLY', 'USE_TMA', 'WAVES', 'SPLIT_OPERANDS'), dk/dv walk ('DK', 'DV',
# 'VARLEN', 'HAS_DECAY', 'SEG_IN', 'USE_H0', 'INTER_ONLY'); value: (BT, BV, num_warps, num_stages)
CONFIGS: dict[tuple, tuple[int, int, int, int]] = {
    ('walk', 'bfloat16', 'input', 128, 128, 0, False, True, False, False, False, False, True, 1, False): (64, 64, 4, 4),
    ('walk', 'bfloat16', 'input', 128, 128, 0, False, True, False, False, False, False, True, 2, False): (64, 64, 4, 4),
    ('walk', 'bfloat16', 'input', 128, 128, 0, False, True, False, True, False, False, True, 1, False): (64, 64, 4, 4),
    ('walk', 'bfloat16', 'input', 128, 128, 0, False, True, True, False, False, False, True, 2, False): (64, 128, 8, 3),
    ('walk', 'bfloat16', 'input', 128, 128, 0, True, True, False, False, False, False, True, 1, False): (64, 64, 4, 4),
    ('walk', 'bfloat16', 'input', 128, 128, 0, True, True, False, False, False, False, True, 2, False): (64, 64, 4, 4),
    ('walk', 'bfloat16', 'input', 128, 128, 0, True, True, False, True, False, False, True, 1, False): (64, 64, 4, 4),
    ('walk', 'bfloat16', 'input', 128, 128, 0, True, True, True, False, False, False, True, 2, False): (64, 128, 8, 3),
    ('walk', 'bfloat16', 'input', 64, 64, 0, False, True, False, False, False, False, True, 1, False): (64, 64, 4, 3),
    ('walk', 'bfloat16', 'input', 64, 64, 0, False, True, False, False, False, False, True, 2, False): (64, 64, 4, 3),
    ('walk', 'bfloat16', 'input', 64, 64, 0, False, True, False, True, False, False, True, 2, False): (64, 64, 4, 3),
    ('walk', 'bfloat16', 'input', 64, 64, 0, False, True, True, False, False, False, True, 2, False): (64, 64, 8, 3),
    ('walk', 'bfloat16', 'input', 64, 64, 0, True, True, False, False, False, False, True, 1, False): (64, 64, 4, 3),
    ('walk', 'bfloat16', 'input', 64, 64, 0, True, True, False, False, False, False, True, 2, False): (64, 64, 4, 3),
    ('walk', 'bfloat16', 'input', 64, 64, 0, True, True, False, True, False, False, True, 2, False): (64, 64, 4, 3),
    ('walk', 'bfloat16', 'input', 64, 64, 0, True, True, True, False, False, False, True, 2, False): (64, 64, 8, 3),
    ('walk', 'bfloat16', 'split', 128, 128, 0, False, True, False, False, False, False, True, 1, True): (64, 64, 4, 4),
    ('walk', 'bfloat16', 'split', 128, 128, 0, False, True, False, False, False, False, True, 2, True): (64, 64, 4, 4),
    ('walk', 'bfloat16', 'split', 128, 128, 0, False, True, False, True, False, False, True, 1, True): (64, 64, 4, 4),
    ('walk', 'bfloat16', 'split', 128, 128, 0, False, True, True, False, False, False, True, 2, True): (64, 128, 8, 3),
    ('walk', 'bfloat16', 'split', 128, 128, 0, True, True, False, False, False, False, True, 1, True): (64, 64, 4, 4),
    ('walk', 'bfloat16', 'split', 128, 128, 0, True, True, False, False, False, False, True, 2, True): (64, 64, 4, 4),
    ('walk', 'bfloat16', 'split', 128, 128, 0, True, True, False, True, False, False, True, 1, True): (64, 64, 4, 4),
    ('walk', 'bfloat16', 'split', 128, 128, 0, True, True, True, False, False, False, True, 2, True): (64, 128, 8, 3),
    ('walk', 'float16', 'tf32', 128, 128, 0, False, True, False, False, False, False, True, 1, False): (64, 64, 4, 4),
    ('walk', 'float16', 'tf32', 128, 128, 0, False, True, False, False, False, False, True, 2, False): (64, 64, 4, 4),
    ('walk', 'float16', 'tf32', 128, 128, 0, False, True, False, True, False, False, True, 1, False): (64, 64, 4, 4),
    ('walk', 'float16', 'tf32', 128, 128, 0, False, True, True, False, False, False, True, 2, False): (64, 128, 8, 3),
    ('walk', 'float16', 'tf32', 128, 128, 0, True, True, False, False, False, False, True, 1, False): (64, 64, 4, 4),
    ('walk', 'float16', 'tf32', 128, 128, 0, True, True, False, False, False, False, True, 2, False): (64, 64, 4, 4),
    ('walk', 'float16', 'tf32', 128, 128, 0, True, True, False, True, False, False, True, 1, False): (64, 64, 4, 4),
    ('walk', 'float16', 'tf32', 128, 128, 0, True, True, True, False, False, False, True, 2, False): (64, 128, 8, 3),
}
