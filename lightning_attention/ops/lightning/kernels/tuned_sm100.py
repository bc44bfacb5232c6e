"""Launch configurations for sm_100 (read through
:mod:`lightning_attention.ops.lightning.kernels.tuned`).

Not timed on an sm_100 GPU: each entry is the selector's first candidate for an autotuned launch of the K = 128
benchmark classes (bf16 grid (a), batch 1 at 128K, fp16, the split precision), planned for 148 SMs and entered for both
WAVES values, so that a first call compiles one configuration instead of timing two; tests/ops/test_aot.py compiles
every entry for sm_100. Written by ``python benchmarks/tune_table.py --first-candidates 100 --sms 148``; 36 entries.
"""

MEASURED = False  # timed on a GPU of this architecture (False: the selector's first candidates)

# key: (kind, dtype, INTER_PREC, *the kernel's autotuning key): walk ('DK', 'DV', 'VARLEN', 'REVERSE', 'HAS_DECAY',
# 'STATE_ONLY', 'SEG_IN', 'USE_H0', 'INTER_ONLY', 'USE_TMA', 'WAVES', 'SPLIT_OPERANDS', 'REV_STATES'), dk/dv walk
# ('DK', 'DV', 'VARLEN', 'HAS_DECAY', 'SEG_IN', 'USE_H0', 'INTER_ONLY', 'USE_TMA'); value: (BT, BV, num_warps,
# num_stages)
CONFIGS: dict[tuple, tuple[int, int, int, int]] = {
    ('walk', 'bfloat16', 'input', 128, 128, 0, False, True, False, False, False, False, True, 1, False, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'input', 128, 128, 0, False, True, False, False, False, False, True, 2, False, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'input', 128, 128, 0, False, True, False, True, False, False, True, 1, False, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'input', 128, 128, 0, False, True, False, True, False, False, True, 2, False, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'input', 128, 128, 0, False, True, True, False, False, False, True, 1, False, False):
        (64, 128, 8, 3),
    ('walk', 'bfloat16', 'input', 128, 128, 0, False, True, True, False, False, False, True, 2, False, False):
        (64, 128, 8, 3),
    ('walk', 'bfloat16', 'input', 128, 128, 0, True, True, False, False, False, False, True, 1, False, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'input', 128, 128, 0, True, True, False, False, False, False, True, 2, False, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'input', 128, 128, 0, True, True, False, True, False, False, True, 1, False, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'input', 128, 128, 0, True, True, False, True, False, False, True, 2, False, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'input', 128, 128, 0, True, True, True, False, False, False, True, 1, False, False):
        (64, 128, 8, 3),
    ('walk', 'bfloat16', 'input', 128, 128, 0, True, True, True, False, False, False, True, 2, False, False):
        (64, 128, 8, 3),
    ('walk', 'bfloat16', 'split', 128, 128, 0, False, True, False, False, False, False, True, 1, True, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'split', 128, 128, 0, False, True, False, False, False, False, True, 2, True, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'split', 128, 128, 0, False, True, False, True, False, False, True, 1, True, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'split', 128, 128, 0, False, True, False, True, False, False, True, 2, True, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'split', 128, 128, 0, False, True, True, False, False, False, True, 1, True, False):
        (64, 128, 8, 3),
    ('walk', 'bfloat16', 'split', 128, 128, 0, False, True, True, False, False, False, True, 2, True, False):
        (64, 128, 8, 3),
    ('walk', 'bfloat16', 'split', 128, 128, 0, True, True, False, False, False, False, True, 1, True, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'split', 128, 128, 0, True, True, False, False, False, False, True, 2, True, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'split', 128, 128, 0, True, True, False, True, False, False, True, 1, True, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'split', 128, 128, 0, True, True, False, True, False, False, True, 2, True, False):
        (64, 64, 4, 2),
    ('walk', 'bfloat16', 'split', 128, 128, 0, True, True, True, False, False, False, True, 1, True, False):
        (64, 128, 8, 3),
    ('walk', 'bfloat16', 'split', 128, 128, 0, True, True, True, False, False, False, True, 2, True, False):
        (64, 128, 8, 3),
    ('walk', 'float16', 'tf32', 128, 128, 0, False, True, False, False, False, False, True, 1, False, False):
        (64, 64, 4, 2),
    ('walk', 'float16', 'tf32', 128, 128, 0, False, True, False, False, False, False, True, 2, False, False):
        (64, 64, 4, 2),
    ('walk', 'float16', 'tf32', 128, 128, 0, False, True, False, True, False, False, True, 1, False, False):
        (64, 64, 4, 2),
    ('walk', 'float16', 'tf32', 128, 128, 0, False, True, False, True, False, False, True, 2, False, False):
        (64, 64, 4, 2),
    ('walk', 'float16', 'tf32', 128, 128, 0, False, True, True, False, False, False, True, 1, False, False):
        (64, 128, 8, 3),
    ('walk', 'float16', 'tf32', 128, 128, 0, False, True, True, False, False, False, True, 2, False, False):
        (64, 128, 8, 3),
    ('walk', 'float16', 'tf32', 128, 128, 0, True, True, False, False, False, False, True, 1, False, False):
        (64, 64, 4, 2),
    ('walk', 'float16', 'tf32', 128, 128, 0, True, True, False, False, False, False, True, 2, False, False):
        (64, 64, 4, 2),
    ('walk', 'float16', 'tf32', 128, 128, 0, True, True, False, True, False, False, True, 1, False, False):
        (64, 64, 4, 2),
    ('walk', 'float16', 'tf32', 128, 128, 0, True, True, False, True, False, False, True, 2, False, False):
        (64, 64, 4, 2),
    ('walk', 'float16', 'tf32', 128, 128, 0, True, True, True, False, False, False, True, 1, False, False):
        (64, 128, 8, 3),
    ('walk', 'float16', 'tf32', 128, 128, 0, True, True, True, False, False, False, True, 2, False, False):
        (64, 128, 8, 3),
}
