"""The bf16 forward walk's rounding, emulated in float64 on the CPU: how far each way of feeding its three float32
intermediates to the tensor cores puts the output from the exact result, and what it costs in tensor-core time.

The walk (docs/kernels.md, "The chunk walk") rounds three float32 tiles to an operand type before a product: the
scores A before ``A·V``, the state S before ``q·S`` and the decayed values ``λ^x·V`` before the state update
``Kᵀ·(λV)``; q, k and v are inputs, exact in their dtype, and everything else accumulates in float32 (here float64).
Each intermediate can be fed as:

- ``bf16``: rounded to bf16 (the default for bf16 inputs);
- ``tf32``: rounded to tf32 (10 explicit significand bits), the product at half the bf16 rate;
- ``split``: two bf16 halves hi + lo, two products (the ``split`` precision);
- ``fp16s``: scaled by a power of two per row of the product's left operand or per column of its right one (the
  scores per row, the state and the decayed values per column), rounded to fp16 (10 explicit significand bits, as
  tf32) and scaled back, the product at the bf16 rate: fp16 operands need both sides in fp16, so the input operand of
  the same product (v for ``A·V``, q for ``q·S``, k for ``Kᵀ·(λV)``) is converted the same way, which is exact for
  bf16 inputs within 2²⁴ of their row's or column's largest entry. The scales cost no tensor-core time, but each is a
  reduction over a row or column of a tile in registers: a kernel pays them elsewhere;
- ``exact``: not rounded (a bound, not a kernel: no product time).

Per combination the script prints the relative L2 error of o (rounded to the output dtype, as the kernel stores it)
against the float64 result over that of the float64 result rounded to the output dtype (the floor), and the
tensor-core time of a chunk's products relative to the default (bf16 products count 1 per FLOP, tf32 and split 2).
It predicts which precision reaches the 1.1× accuracy target for how much product time; whether that time hides
behind the loads is for a GPU to measure (docs/kernels.md, "Split operands").

    python benchmarks/precision_model.py                            # bf16, K = V = 128, T = 1024, chunks of 64
    python benchmarks/precision_model.py --dim 64 --inputs vllm     # unscaled inputs, decay U(0, 1) per head
"""

import argparse
import itertools
import json

import torch

from lightning_attention.utils.testing import relative_error

MODES = ("bf16", "tf32", "split", "fp16s", "exact")
PRODUCT_COST = {"bf16": 1, "tf32": 2, "split": 2, "fp16s": 1}  # tensor-core time per FLOP against one bf16 product
FP16_TOP = 14  # fp16s scales a row or column so that its largest magnitude lies in [2^14, 2^15), below fp16's 65504


def fp16_scaled(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` (float64) through fp16 with a power-of-two scale per slice along ``dim`` (the reduced dimension: -1 scales
    each row, -2 each column), back in float64; an all-zero slice keeps scale 1."""
    top = x.abs().amax(dim=dim, keepdim=True)
    exponent = torch.where(top > 0, torch.floor(torch.log2(top.clamp(min=1e-300))), torch.zeros_like(top))
    scale = torch.exp2(FP16_TOP - exponent)
    return (x * scale).to(torch.float16).double() / scale


def round_to(x: torch.Tensor, mode: str, dim: int = -1) -> torch.Tensor:
    """``x`` (float64) as the tensor cores would see it fed as ``mode`` (module docstring); ``dim``: the dimension
    ``fp16s`` reduces for its scales (-1 for a left operand, -2 for a right one)."""
    if mode == "exact":
        return x
    if mode == "fp16s":
        return fp16_scaled(x, dim)
    if mode == "bf16":
        return x.to(torch.bfloat16).double()
    if mode == "split":
        hi = x.to(torch.bfloat16).double()
        return hi + (x - hi).to(torch.bfloat16).double()
    if mode == "tf32":  # round the float32 significand to 10 bits, to nearest (ties away, as cvt.rna.tf32)
        bits = x.float().view(torch.int32)
        return ((bits + 0x1000) & ~0x1FFF).view(torch.float32).double()
    raise ValueError(f"mode is one of {MODES}, got {mode!r}")


def walk_output(q, k, v, slope, chunk: int, scores: str, state: str, values: str) -> torch.Tensor:
    """o ``[B, H, T, V]`` (float64) of the chunked forward from a zero state with the three intermediates fed as
    ``scores``, ``state`` and ``values``; q, k: ``[B, H, T, K]``, v: ``[B, H, T, V]`` (float64 holding the inputs'
    values); slope: ``[H]``, λ = exp(-slope); T a multiple of ``chunk``."""
    B, H, T, K = q.shape
    V = v.shape[-1]
    lam = torch.exp(-slope.double())[:, None, None]  # [H, 1, 1]
    pos = torch.arange(chunk, dtype=torch.float64)
    gap = pos[:, None] - pos[None, :]
    decay = torch.where(gap >= 0, lam ** gap.clamp(min=0), 0.0)  # [H, C, C]: selected, never multiplied by a mask
    q_decay = lam ** (pos[:, None] + 1)  # [H, C, 1]: λ^(t+1) for the inter product
    v_decay = lam ** (chunk - 1 - pos[:, None])  # [H, C, 1]: λ^(C-1-t) for the state update
    S = q.new_zeros(B, H, K, V)
    out = []
    for c in range(0, T, chunk):
        qc, kc, vc = q[:, :, c : c + chunk], k[:, :, c : c + chunk], v[:, :, c : c + chunk]
        A = (qc @ kc.transpose(-1, -2)) * decay
        # fp16s also converts the input operand of the same product (exact for bf16 values within range)
        v_in = fp16_scaled(vc, -2) if scores == "fp16s" else vc
        q_in = fp16_scaled(qc, -1) if state == "fp16s" else qc
        k_in = fp16_scaled(kc, -2) if values == "fp16s" else kc
        o = round_to(A, scores, -1) @ v_in + q_decay * (q_in @ round_to(S, state, -2))
        S = lam**chunk * S + k_in.transpose(-1, -2) @ round_to(v_decay * vc, values, -2)
        out.append(o)
    return torch.cat(out, dim=2)


def product_time(K: int, chunk: int, value_tile: int, scores: str, state: str, values: str) -> float | None:
    """Tensor-core time of one chunk's products per value tile over that of the default (every product in bf16):
    q·kᵀ (recomputed per value tile, an input product), A·V, q·S and Kᵀ·(λV); None where a mode is ``exact``."""
    if "exact" in (scores, state, values):
        return None
    qk = 2 * chunk * chunk * K
    av, qs, update = 2 * chunk * chunk * value_tile, 2 * chunk * K * value_tile, 2 * chunk * K * value_tile
    default = qk + av + qs + update
    return (qk + PRODUCT_COST[scores] * av + PRODUCT_COST[state] * qs + PRODUCT_COST[values] * update) / default


def inputs(kind: str, B: int, H: int, T: int, K: int, V: int, dtype=torch.bfloat16, seed: int = 0):
    """(q, k, v, slope): q, k ``[B, H, T, K]``, v ``[B, H, T, V]`` rounded to ``dtype`` and held in float64; slope
    ``[H]``. ``"tnl"``: N(0, 1) inputs and the TNL
    slopes of layer 0 of 12 (what the benchmarks measure); ``"vllm"``: N(0, 1) inputs and a decay U(0, 1) per head
    (the peer's test matrix, docs/performance.md, "Accuracy")."""
    import lightning_attention as la

    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, H, T, K, generator=gen).to(dtype).double() for _ in range(2))
    v = torch.randn(B, H, T, V, generator=gen).to(dtype).double()
    slope = la.tnl_slopes(H, 0, 12) if kind == "tnl" else torch.rand(H, generator=gen)
    return q, k, v, slope.double()


def model(dim: int, T: int, H: int, chunk: int, value_tile: int, kind: str, modes=("bf16", "tf32", "split")) -> list:
    """One row per combination of ``modes`` for the three intermediates of a bf16 walk (B = 2, H heads, T tokens,
    K = V = ``dim``): the default (all bf16) first, then by product time."""
    q, k, v, slope = inputs(kind, 2, H, T, dim, dim, torch.bfloat16)
    exact = walk_output(q, k, v, slope, chunk, "exact", "exact", "exact")
    floor = relative_error(exact.to(torch.bfloat16), exact)
    rows = []
    for scores, state, values in itertools.product(modes, repeat=3):
        o = walk_output(q, k, v, slope, chunk, scores, state, values).to(torch.bfloat16).double()
        error = relative_error(o, exact)
        rows.append({"scores": scores, "state": state, "values": values, "error": error, "vs_floor": error / floor,
                     "product_time": product_time(dim, chunk, value_tile, scores, state, values)})  # fmt: skip
    default = ("bf16", "bf16", "bf16")
    return sorted(rows, key=lambda r: ((r["scores"], r["state"], r["values"]) != default,
                                       r["product_time"] or 0.0, r["vs_floor"]))  # fmt: skip


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=128, help="K = V")
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--chunk", type=int, default=64, help="the walk's BT")
    parser.add_argument("--value-tile", type=int, default=64, help="the walk's BV")
    parser.add_argument("--inputs", choices=("tnl", "vllm"), default="tnl")
    parser.add_argument("--modes", default="bf16,tf32,split", help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    rows = model(args.dim, args.seqlen, args.heads, args.chunk, args.value_tile, args.inputs,
                 tuple(args.modes.split(",")))  # fmt: skip
    print(f"{'scores':>6} {'state':>6} {'values':>6}  error ÷ floor  product time")
    for r in rows:
        time = "-" if r["product_time"] is None else f"{r['product_time']:.2f}"
        print(f"{r['scores']:>6} {r['state']:>6} {r['values']:>6}  {r['vs_floor']:12.3f}  {time:>11}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
