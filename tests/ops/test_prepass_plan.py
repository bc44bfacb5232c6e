"""The pre-pass pieces (``ops/lightning/prepass_plan.py``) as values: their rules and the pieces of the benchmark
grids' segmented calls, without tensors or a GPU.

Problems name an H100 (``device.H100``) as in tests/ops/test_plan.py, so the pieces are the ones a GPU run would cut.
"""

import pytest
import torch

from lightning_attention.ops.lightning import plan, prepass_plan
from tests.ops.test_plan import problem


@pytest.mark.parametrize(
    "seg_len, programs, expected",
    [
        (16384, 32, 8),  # B = 2, T = 32K: 2 segments, the first walked, 16 heads -> 8 pieces of 2,048 (the bound)
        (16384, 48, 8),  # B = 1, T = 64K: 4 segments, 3 walked
        (8192, 1024, 1),  # enough programs already
        (8192, 128, 4),  # 528 / 128 -> 5 wanted, 4 allowed by the bound
        (2048, 16, 1),  # nothing shorter than the bound
        (3008, 16, 1),  # 47 chunks of 64: no divisor within the bound
        (8192, 131, 4),  # just under half the slots: still cut
        (8192, 132, 1),  # half the slots: whole segments
        (4096, 192, 1),  # K = 64, bf16, B = 4, T = 16K: 4K segments, 3 of 4 walked, 16 heads
        (4096, 224, 1),  # K = 64, bf16, B = 2, T = 32K: 7 of 8 walked
        (4096, 256, 1),  # K = 64, bf16, with a final state: every segment walked
    ],
)
def test_prepass_split_rule(seg_len, programs, expected):
    """Pre-pass pieces on a 132-SM GPU (264 pre-pass slots): up to twice that many programs, pieces of at least
    2,048 tokens (bf16, V = 128: their states within 12.5% of one input), and none once the segments fill half the
    slots."""
    split = prepass_plan.prepass_split(seg_len, programs, slots=264, min_piece=2048)
    assert split == expected
    assert (seg_len // 64) % split == 0


@pytest.mark.parametrize(
    "seg_len, programs, expected",
    [
        (8192, 64, 2),  # 64 programs fill under 70% of 132 SMs: two pieces each
        (8192, 96, 1),  # 96 fill 73%: whole segments
        (8192, 112, 1),
        (16384, 112, 1),
        (32768, 64, 2),  # K = 256: 64 programs -> 128 in pieces of 16,384
        (8192, 16, 4),  # never 70%: the most pieces the bound allows (2,048 tokens)
        (2048, 16, 1),  # nothing shorter than the bound
        (3008, 16, 1),  # 47 chunks of 64: no divisor within the bound
    ],
)
def test_prepass_split_by_fill(seg_len, programs, expected):
    """Pieces for the two-warpgroup pre-pass on a 132-SM GPU (one program per SM): the fewest whose programs fill 70%
    of the SMs, pieces of at least 2,048 tokens (4,096 at K = 256)."""
    min_piece = 2048 if seg_len < 32768 else 4096
    split = prepass_plan.prepass_split_by_fill(seg_len, programs, slots=132, min_piece=min_piece)
    assert split == expected
    assert (seg_len // 64) % split == 0


@pytest.mark.parametrize(
    "kwargs, seg_len, split",
    [
        (dict(B=4, T=16384, K=64, V=64), 4096, 1),  # 192 pre-pass programs: whole segments
        (dict(B=2, T=32768, K=64, V=64), 4096, 1),  # 224
        (dict(B=1, T=65536, K=64, V=64, final_state=True), 4096, 1),  # 256: every segment walked
        (dict(B=1, T=65536, gluon=False), 16384, 8),  # K = 128, Triton walk: 48 programs -> 8 pieces of 2,048
        (dict(B=1, T=131072, gluon=False), 32768, 16),  # grid (b) at 128K
        (dict(B=1, T=65536), 8192, 1),  # K = 128, two-warpgroup pre-pass: 112 programs, whole segments
        (dict(B=4, T=16384), 8192, 2),  # 64 programs: 128 pieces of 4,096
        (dict(B=2, T=32768), 8192, 1),  # 96 programs fill 73% of the SMs: whole segments
        (dict(B=1, T=131072), 16384, 1),  # 112 programs
        (dict(B=2, T=32768, K=64, V=64, dtype=torch.float32), 8192, 8),  # float32 K = 64: 96 programs
        (dict(B=1, T=65536, K=256, V=256), 32768, 2),  # K = 256: 64 programs (four per head) -> 128 in one round
    ],
)
def test_prepass_pieces_of_the_benchmark_grids(kwargs, seg_len, split):
    """The pre-pass of the segmented calls of grids (a) and (b) on an H100: the 16-bit K = 64 calls keep their 4K
    segments whole (they fill half the pre-pass slots), the Triton pre-pass with fewer programs is cut into pieces,
    and the two-warpgroup pre-pass (bf16 K = 128 and 256, one program per SM) into the fewest pieces whose programs
    fill 70% of the SMs."""
    p = problem(**kwargs)
    segments = plan.plan_segments(p)
    pieces = prepass_plan.prepass_pieces(p, segments, skip_final=not p.final_state, reverse=False)
    assert segments.segmented and segments.seg_len == seg_len
    assert (pieces.split, pieces.piece_len) == (split, seg_len // split)
