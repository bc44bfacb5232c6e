"""Does a call's device time follow where its tensors lie in memory, or the process it runs in?

Per shape (bf16, H = 16, TNL slopes, ``timed_calls.make_problem``), one process makes ``--placements`` problems in
turn, each after a pad allocation of a fixed size (``PADS_MB``, then 4 KiB more per placement), keeping every earlier
problem and pad alive so that each lands somewhere new; each problem's forward is timed by ``do_bench``
(``timed_calls.device_ms``), and with ``--fwd-bwd`` its forward + backward too. Every row records the placement:
the address of q modulo 2 MiB and the offsets of k, v, do and the output o from q, in MiB. ``--processes`` fresh
processes repeat the same sequence of allocations.

Times that repeat placement by placement across processes come from where the tensors lie; times that move with the
process, from the process. ``summary`` gives, per shape and timer, the spread over the placements (each placement's
median over the processes) and the largest spread of one placement over the processes
(:func:`summarise`). docs/kernels.md ("Open leads", K = 256 stability) cites what it found.

    python benchmarks/placement.py --shapes 2x32768x256,8x8192x256,2x32768x128 --out placement.json
"""

import argparse
import json
import statistics
import sys

import torch
from timed_calls import child_runs, device_ms, make_problem, parse_shape, write_json

PADS_MB = (0, 1, 2, 3, 5, 8, 13, 21, 34, 0, 55, 89)  # each placement's pad; the sequence is the same in every process
MIB = 1 << 20


def placement_of(problem, out: torch.Tensor) -> dict:
    """Where a problem's tensors lie: q's address modulo 2 MiB and the offsets of k, v, do and o from q in MiB."""
    q = problem.q.data_ptr()
    row = {"q_mod_2mib": q % (2 * MIB)}
    for name, t in (("k", problem.k), ("v", problem.v), ("do", problem.do), ("o", out)):
        row[f"{name}_minus_q_mib"] = round((t.data_ptr() - q) / MIB, 3)
    return row


def measure(shapes: list[str], placements: int, fwd_bwd: bool) -> dict:
    """One process's rows: ``{shape: [row per placement]}``, every earlier allocation kept alive (``placements``: at
    most ``len(PADS_MB)``, which :func:`main` checks)."""
    out = {}
    for shape in shapes:
        B, T, D = parse_shape(shape)
        kept, rows = [], []
        for i in range(placements):
            pad = torch.empty(PADS_MB[i] * MIB + i * 4096, dtype=torch.uint8, device="cuda")
            problem = make_problem(B, T, D=D)  # the same values every time: only the placement changes
            o, _ = problem.fwd()  # compiles once per shape; its output's placement is recorded
            row = {"placement": i, "pad_mib": PADS_MB[i], **placement_of(problem, o), "fwd_ms": device_ms(problem.fwd)}
            if fwd_bwd:
                row["fwd_bwd_ms"] = device_ms(problem.fwd_bwd)
            rows.append(row)
            kept.append((pad, problem))
        out[shape] = rows
        del kept
        torch.cuda.empty_cache()
    return out


def summarise(runs: list[dict]) -> dict:
    """Per shape and timer, over processes (``runs``: one :func:`measure` result each): the median time of each
    placement, the spread of those medians (largest ÷ smallest − 1: what the placement does) and the largest spread of
    one placement over the processes (what the process does)."""
    summary = {}
    for shape in runs[0]:
        per_shape = {}
        for key in ("fwd_ms", "fwd_bwd_ms"):
            if key not in runs[0][shape][0]:
                continue
            times = [[run[shape][i][key] for run in runs] for i in range(len(runs[0][shape]))]
            medians = [statistics.median(t) for t in times]
            per_shape[key] = {
                "per_placement": [round(m, 4) for m in medians],
                "placement_spread": round(max(medians) / min(medians) - 1, 4),
                "process_spread": round(max(max(t) / min(t) - 1 for t in times), 4),
            }
        summary[shape] = per_shape
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="2x32768x256,8x8192x256,2x32768x128",
                        help="BxT or BxTxD (D = 128 unless given), comma-separated")  # fmt: skip
    parser.add_argument("--placements", type=int, default=10, help=f"problems per process (at most {len(PADS_MB)})")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--fwd-bwd", action="store_true", help="also time the forward + backward of each placement")
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one process's measurement
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    if not 1 <= args.placements <= len(PADS_MB):
        parser.error(f"--placements must be 1 to {len(PADS_MB)}")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    if args.child:
        print(json.dumps(measure(shapes, args.placements, args.fwd_bwd)))
        return 0
    argv = ["--shapes", args.shapes, "--placements", str(args.placements)] + (["--fwd-bwd"] if args.fwd_bwd else [])
    runs = child_runs(__file__, argv, args.processes)
    summary = summarise(runs)
    for shape, row in summary.items():
        print(shape, json.dumps(row), flush=True)

    from lightning_attention.bench.machine import machine_info, machine_line, source_digest

    write_json(args.out, {
        "machine_line": machine_line(machine_info(torch.device("cuda"))), "command": "python " + " ".join(sys.argv),
        "source": source_digest(), "pads_mib": list(PADS_MB[: args.placements]), "shapes": shapes,
        "summary": summary, "runs": runs,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
