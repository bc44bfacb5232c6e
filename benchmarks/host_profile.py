"""Where the host time of a ``lightning_attn`` fwd+bwd goes (cProfile over many calls, after warm-up).

``host_overhead.py`` shows whether a shape is host-bound; this names the Python functions that cost the time
(validation, torch.library dispatch, the segment plan, Triton's autotuner and JIT launch path). cProfile sees one
thread: the autograd engine runs the backward on the calling thread here
(``torch.autograd.set_multithreading_enabled(False)``) so that it is in the profile.

    python benchmarks/host_profile.py --shape 32x2048 --calls 100 --out benchmarks/results/host_profile.txt
"""

import argparse
import cProfile
import io
import pstats

import torch
from kernel_problem import make_problem, parse_shape


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="32x2048", help="BxT or BxTxD (H = 16, K = V = D = 128 by default, bf16)")
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--out", default=None, help="text file for the two profiles")
    args = parser.parse_args()
    B, T, D = parse_shape(args.shape)
    fwd_bwd = make_problem(B, T, D=D).fwd_bwd

    with torch.autograd.set_multithreading_enabled(False):
        for _ in range(5):
            fwd_bwd()
        torch.cuda.synchronize()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            fwd_bwd()
        prof.disable()
        torch.cuda.synchronize()
    text = io.StringIO()
    for key in ("tottime", "cumulative"):
        stats = pstats.Stats(prof, stream=text)
        stats.sort_stats(key).print_stats(35)
    print(text.getvalue())
    if args.out:
        with open(args.out, "w") as f:
            f.write(text.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
