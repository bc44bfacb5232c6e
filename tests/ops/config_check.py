"""One unit of the configuration check (``tests/ops/test_configs_gpu.py``), in a process of its own: every launch
configuration the selector can pick for one kernel family, input dtype, precision, head dim and descriptor setting
on this GPU, pinned one at a time, forward and backward against float64.

Families and what a run of one pinned configuration ``c`` computes (B = 2 sequences of an odd length, initial and
final states, TNL decay):

- ``walk``: the main walk's candidates (``configs.walk_candidates``, ``state_only=False``); whole sequences, so the
  forward walk and the dq, dk and dv walks run with ``c``; where the backward's dq walk computes the reverse local
  states (``plan.dq_reverse_states``: 16-bit, head dims up to 64), also in segments of 256 tokens, so that walk runs
  with ``c`` too.
- ``prepass``: the segment pre-pass's candidates (``state_only=True``); segments of 256 tokens, so the pre-pass runs
  with ``c`` (and the scan and the segment-reading walks beside it).
- ``dkdv``: the fused dk/dv walk's candidates (``configs.dkdv_candidates``, with descriptors where the launch takes
  them) where the plan takes the walk (``plan.use_fused_dkdv``: padded head dims up to 128, not under the split
  precision); whole sequences with ``fused_dkdv`` on.

A pin replaces the tuning space, and the unit first checks that the selector keeps ``c`` as given (so the launch ran
``c``, not a fallback). The walks with one configuration (the inter-only walk, the two-warpgroup walk, the scan, the
recompute backward) are checked by ``test_chunk_gpu.py``; the two-warpgroup walk is switched off here so that K = 256
in bf16 runs the Triton walk's candidates, which any GPU without it picks.

A configuration that faults leaves the CUDA context unusable for the rest of its process (an illegal address is
sticky): a process per unit keeps one fault from failing every later check, and lets units compile side by side.

    python -m tests.ops.config_check --family walk --dtype bfloat16 --head-dim 128 --tma 1 [--precision split]

prints a line ``CANDIDATES [[BT, BV, num_warps, num_stages], ...]``, then per pinned configuration a line
``RUN {json}`` with the relative L2 error of o, the final state, dq, dk, dv and dh0 for each segment length it ran
at, and whether each is within the dtype's tolerance. Uninitialised outputs are NaN, as in the tests
(``tests/conftest.py``).
"""

import argparse
import json
import sys

import torch

import lightning_attention as la
from lightning_attention import settings
from lightning_attention.ops.lightning import naive, plan, run
from lightning_attention.ops.lightning.kernels.configs import (
    dkdv_candidates,
    state_operand_bytes,
    walk_candidates,
)
from lightning_attention.utils.testing import relative_error, tolerance
from tests import conftest  # the NaN-filling allocators (switched on in main)

FAMILIES = ("walk", "prepass", "dkdv")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
# segments of the prepass family: four per sequence of the default length, the last one ragged
SEGMENT_LEN = 256
OUTPUTS = ("o", "final_state", "dq", "dk", "dv", "dh0")


def shape_of(config) -> tuple[int, int, int, int]:
    """(BT, BV, num_warps, num_stages) of a walk's ``triton.Config``."""
    return (config.kwargs["BT"], config.kwargs["BV"], config.num_warps, config.num_stages)


def dkdv_shape(config, dv: int) -> tuple[int, int, int, int]:
    """A fused dk/dv walk's ``triton.Config`` (BT, warps, stages; its value tile is the whole padded V) as a pin."""
    return (config.kwargs["BT"], dv, config.num_warps, config.num_stages)


def unit_candidates(
    family: str, dtype: torch.dtype, D: int, tma_setting: bool, precision: str, device: torch.device,
    rev_states: bool = False,
) -> list[tuple[int, int, int, int]]:  # fmt: skip
    """The configurations (as pins, best first) of one unit on ``device`` (a CUDA device, or the CPU for the
    interpreter), as the plan decides them for a call with the settings its runs use, under the current pin if one
    is set: what the test expects a unit to run. Nothing for the fused dk/dv walk where the plan does not take it (head
    dims over 128, the split precision). ``rev_states``: those of the walk that also computes the reverse local states
    (the segmented dq walk, whose estimate counts its q tiles)."""
    with settings.override(**unit_settings(family, tma_setting, precision)):
        q = torch.empty(1, 1, 1, D, dtype=dtype, device=device)
        problem = run.problem_of(q, q, q, None, None, None, None, 1.0, False, 0)
        limit, state_bytes = problem.device.shared_per_block, state_operand_bytes(plan.inter_precision(problem))
        if family == "dkdv":
            if not plan.use_fused_dkdv(problem, D, D):
                return []
            tma = plan.dkdv_descriptors(problem, D, D)  # as launches.dkdv_launch decides for contiguous tensors
            found = dkdv_candidates(D, D, q.element_size(), state_bytes, limit, 0, plan.pin(problem), tma)
            return [dkdv_shape(c, D) for c in found]
        found = walk_candidates(
            D, D, q.element_size(), limit, state_only=family == "prepass",
            tma=plan.tma_enabled(problem.device, problem.settings), state_bytes=state_bytes, pin=plan.pin(problem),
            rev_states=rev_states,
        )  # fmt: skip
        return [shape_of(c) for c in found]


def unit_segment_lens(family: str, dtype: torch.dtype, D: int, tma_setting: bool, precision: str,
                      device: torch.device) -> tuple[int, ...]:  # fmt: skip
    """The segment lengths (0: whole sequences) a unit runs each configuration at: the pre-pass family's segments;
    the walk family's whole sequences, and segments too where the dq walk of a segmented backward computes the reverse
    local states (as the plan decides for a call of two segments)."""
    if family == "prepass":
        return (SEGMENT_LEN,)
    if family == "dkdv":
        return (0,)
    with settings.override(**unit_settings(family, tma_setting, precision), segment_len=SEGMENT_LEN):
        x = torch.empty(1, 2 * SEGMENT_LEN, 1, D, dtype=dtype, device=device)
        problem = run.problem_of(x, x, x, None, None, None, None, 1.0, False, 0, do=x)
        return (0, SEGMENT_LEN) if plan.dq_reverse_states(problem, plan.plan_segments(problem)) else (0,)


def unit_settings(family: str, tma_setting: bool, precision: str) -> dict:
    """The settings every run of a unit shares: the Triton kernels, the unit's precision and descriptor setting, the
    two-warpgroup walk off, and the fused dk/dv walk on for its family."""
    return dict(backend="triton", precision=precision, tma=tma_setting, gluon=False, fused_dkdv=family == "dkdv")


def inputs(B: int, T: int, H: int, D: int, dtype: torch.dtype, device: torch.device):
    """q, k, v [B, T, H, D] (dtype, requiring grad), h0 [B, H, D, D] fp32 (requiring grad), do [B, T, H, D] and
    dht [B, H, D, D] fp32: unscaled normal values, the same for every configuration (seed 0)."""
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, device=device, generator=g).to(dtype).requires_grad_() for _ in range(3))
    h0 = torch.randn(B, H, D, D, device=device, generator=g).requires_grad_()
    do = torch.randn(B, T, H, D, device=device, generator=g).to(dtype)
    dht = torch.randn(B, H, D, D, device=device, generator=g)
    return q, k, v, h0, do, dht


def forward_backward(q, k, v, h0, do, dht, slope, reference: bool = False) -> tuple[torch.Tensor, ...]:
    """(o, final state, dq, dk, dv, dh0) of the library's call, or of the float64 blockwise PyTorch form."""
    if reference:
        x = [t.detach().double().requires_grad_() for t in (q, k, v, h0)]
        o, ht = naive.chunk_lightning_attn(*x[:3], slope, initial_state=x[3], chunk_size=SEGMENT_LEN)
    else:
        x = [q, k, v, h0]
        o, ht = la.lightning_attn(q, k, v, slope, initial_state=h0, output_final_state=True)
    loss = (o.double() * do.double()).sum() + (ht.double() * dht.double()).sum()
    return (o, ht, *torch.autograd.grad(loss, x))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=FAMILIES, required=True)
    parser.add_argument("--dtype", choices=tuple(DTYPES), required=True)
    parser.add_argument("--head-dim", type=int, required=True, help="K = V")
    parser.add_argument("--tma", type=int, choices=(0, 1), required=True, help="the tensor-descriptor setting")
    parser.add_argument("--precision", choices=settings.PRECISIONS, default="input")
    parser.add_argument("--shape", default="2x1000x2", help="B x T x H (odd T: every token mask is exercised)")
    args = parser.parse_args(argv)
    B, T, H = (int(x) for x in args.shape.split("x"))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype, D = DTYPES[args.dtype], args.head_dim
    base = unit_settings(args.family, bool(args.tma), args.precision)
    pins = unit_candidates(args.family, dtype, D, bool(args.tma), args.precision, device)
    print("CANDIDATES " + json.dumps(pins), flush=True)
    slope = la.tnl_slopes(H, 0, 2).to(device, torch.float32)
    data = inputs(B, T, H, D, dtype, device)
    reference = forward_backward(*data, slope, reference=True)
    conftest._POISON_ACTIVE[0] = True  # outputs the library allocates start as NaN from here on
    segment_lens = unit_segment_lens(args.family, dtype, D, bool(args.tma), args.precision, device)
    for pin in pins:
        record = {"config": pin, "pinned_as_given": True, "runs": [], "ok": True}
        for segment_len in segment_lens:
            # the selector keeps a pin that fits as given: the launches ran this configuration, not a fallback (in the
            # walk family's segments, the dq walk that computes the reverse local states as well)
            for rev_states in (False, True) if args.family == "walk" and segment_len else (False,):
                with settings.override(**base, kernel_config=settings.KernelPin(*pin)):
                    kept = unit_candidates(args.family, dtype, D, bool(args.tma), args.precision, device, rev_states)
                record["pinned_as_given"] = record["pinned_as_given"] and kept == [pin]
            changes = dict(kernel_config=settings.KernelPin(*pin), segment_len=segment_len)
            try:
                with settings.override(**base, **changes):
                    got = forward_backward(*data, slope)
                errors = {name: relative_error(a, b) for name, a, b in zip(OUTPUTS, got, reference, strict=True)}
                finite = all(bool(torch.isfinite(a).all()) for a in got)
                ok = finite and all(e <= tolerance(dtype) for e in errors.values())
                record["runs"].append(dict(segment_len=segment_len, errors=errors, finite=finite, ok=ok))
            except Exception as e:  # noqa: BLE001 - a compile or launch error of this configuration: the next one runs
                ok = False
                record["runs"].append(dict(segment_len=segment_len, error=f"{type(e).__name__}: {str(e)[:400]}"))
            record["ok"] = record["ok"] and ok
        print("RUN " + json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
