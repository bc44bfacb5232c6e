"""Launch configurations measured on sm_90 (read through
:mod:`lightning_attention.ops.lightning.kernels.tuned`).

Measured on NVIDIA H200 | driver 580.159.04 | CUDA 13.0 | torch 2.11.0+cu130 | triton 3.6.0 by ``python
benchmarks/tune_table.py``, each candidate timed by its call's kernels, in two runs. The K = 128 walks of one wave
(WAVES = 1, 12 entries: four stages, timed against three) come from the package of be357e7 (source c056696802cebddd),
whose segment plans this package's equal (one program per SM at K = 128); every timing in
benchmarks/results/h200/tune-one-wave/tune_table.json. The other 25 entries (two stages against four at K = 128) come
from the package of c03d893 (source aa6141cfbaf77cb8), 38 of 38 shape classes, whose plans counted two programs per SM
at K = 128 and so launched no one-wave walk there; every timing in benchmarks/results/h200/tune/tune_table.json. The K =
64 dq walk that also computes the reverse local states (REV_STATES, one entry: three stages, its fwd+bwd 3.3-3.7% faster
than with two) was timed with ``--classes bf16:4x16384x64,bf16:2x32768x64,bf16:1x65536x64 --reps 2``; every timing in
benchmarks/results/h200-k64-reverse-states/tune_rev.json.
"""

MEASURED = True  # timed on a GPU of this architecture (False: the selector's first candidates)

# key: (kind, dtype, INTER_PREC, *the kernel's autotuning key): walk ('DK', 'DV', 'VARLEN', 'REVERSE', 'HAS_DECAY',
# 'STATE_ONLY', 'SEG_IN', 'USE_H0', 'INTER_ONLY', 'USE_TMA', 'WAVES', 'SPLIT_OPERANDS', 'REV_STATES'), dk/dv walk
# ('DK', 'DV', 'VARLEN', 'HAS_DECAY', 'SEG_IN', 'USE_H0', 'INTER_ONLY', 'USE_TMA'); value: (BT, BV, num_warps,
# num_stages)
CONFIGS: dict[tuple, tuple[int, int, int, int]] = {
    ('walk', 'bfloat16', 'input', 128, 128, 0, False, True, False, False, False, False, True, 1, False, False):
        (64, 64, 4, 4),
    ('walk', 'bfloat16', 'input', 128, 128, 0, False, True, False, False, False, False, True, 2, False, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'input', 128, 128, 0, False, True, False, True, False, False, True, 1, False, False):
        (64, 64, 4, 4),
    ('walk', 'bfloat16', 'input', 128, 128, 0, False, True, False, True, False, False, True, 2, False, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'input', 128, 128, 0, False, True, True, False, False, False, True, 2, False, False):
        (64, 128, 8, 3),
    ('walk', 'bfloat16', 'input', 128, 128, 0, True, True, False, False, False, False, True, 1, False, False):
        (64, 64, 4, 4),
    ('walk', 'bfloat16', 'input', 128, 128, 0, True, True, False, False, False, False, True, 2, False, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'input', 128, 128, 0, True, True, False, True, False, False, True, 1, False, False):
        (64, 64, 4, 4),
    ('walk', 'bfloat16', 'input', 128, 128, 0, True, True, False, True, False, False, True, 2, False, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'input', 128, 128, 0, True, True, True, False, False, False, True, 2, False, False):
        (64, 128, 8, 3),
    ('walk', 'bfloat16', 'input', 64, 64, 0, False, True, False, False, False, False, True, 1, False, False):
        (64, 64, 4, 3),
    ('walk', 'bfloat16', 'input', 64, 64, 0, False, True, False, False, False, False, True, 2, False, False):
        (64, 64, 4, 3),
    ('walk', 'bfloat16', 'input', 64, 64, 0, False, True, False, True, False, False, True, 2, False, False):
        (64, 64, 4, 3),
    ('walk', 'bfloat16', 'input', 64, 64, 0, False, True, False, True, False, False, True, 2, False, True):
        (64, 64, 4, 3),
    ('walk', 'bfloat16', 'input', 64, 64, 0, False, True, True, False, False, False, True, 2, False, False):
        (64, 64, 8, 3),
    ('walk', 'bfloat16', 'input', 64, 64, 0, True, True, False, False, False, False, True, 1, False, False):
        (64, 64, 4, 3),
    ('walk', 'bfloat16', 'input', 64, 64, 0, True, True, False, False, False, False, True, 2, False, False):
        (64, 64, 4, 3),
    ('walk', 'bfloat16', 'input', 64, 64, 0, True, True, False, True, False, False, True, 2, False, False):
        (64, 64, 4, 3),
    ('walk', 'bfloat16', 'split', 128, 128, 0, False, True, False, False, False, False, True, 1, True, False):
        (64, 64, 4, 4),
    ('walk', 'bfloat16', 'split', 128, 128, 0, False, True, False, False, False, False, True, 2, True, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'split', 128, 128, 0, False, True, False, True, False, False, True, 1, True, False):
        (64, 64, 4, 4),
    ('walk', 'bfloat16', 'split', 128, 128, 0, False, True, False, True, False, False, True, 2, True, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'split', 128, 128, 0, False, True, True, False, False, False, True, 2, True, False):
        (64, 128, 8, 3),
    ('walk', 'bfloat16', 'split', 128, 128, 0, True, True, False, False, False, False, True, 1, True, False):
        (64, 64, 4, 4),
    ('walk', 'bfloat16', 'split', 128, 128, 0, True, True, False, False, False, False, True, 2, True, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'split', 128, 128, 0, True, True, False, True, False, False, True, 1, True, False):
        (64, 64, 4, 4),
    ('walk', 'bfloat16', 'split', 128, 128, 0, True, True, False, True, False, False, True, 2, True, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'split', 128, 128, 0, True, True, True, False, False, False, True, 2, True, False):
        (64, 128, 8, 3),
    ('walk', 'float16', 'tf32', 128, 128, 0, False, True, False, False, False, False, True, 1, False, False):
        (64, 64, 4, 4),
    ('walk', 'float16', 'tf32', 128, 128, 0, False, True, False, False, False, False, True, 2, False, False):
        (64, 64, 4, 2),
    ('walk', 'float16', 'tf32', 128, 128, 0, False, True, False, True, False, False, True, 1, False, False):
        (64, 64, 4, 4),
    ('walk', 'float16', 'tf32', 128, 128, 0, False, True, False, True, False, False, True, 2, False, False):
        (64, 64, 4, 2),
    ('walk', 'float16', 'tf32', 128, 128, 0, False, True, True, False, False, False, True, 2, False, False):
        (64, 128, 8, 3),
    ('walk', 'float16', 'tf32', 128, 128, 0, True, True, False, False, False, False, True, 1, False, False):
        (64, 64, 4, 4),
    ('walk', 'float16', 'tf32', 128, 128, 0, True, True, False, False, False, False, True, 2, False, False):
        (64, 64, 4, 2),
    ('walk', 'float16', 'tf32', 128, 128, 0, True, True, False, True, False, False, True, 1, False, False):
        (64, 64, 4, 4),
    ('walk', 'float16', 'tf32', 128, 128, 0, True, True, False, True, False, False, True, 2, False, False):
        (64, 64, 4, 2),
    ('walk', 'float16', 'tf32', 128, 128, 0, True, True, True, False, False, False, True, 2, False, False):
        (64, 128, 8, 3),
}
