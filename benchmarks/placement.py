"""Does a call's device time follow where its tensors lie in memory, or the process it runs in?

Per shape (bf16, H = 16, TNL slopes, ``timed_calls.make_problem``), one process makes ``--placements`` problems in
turn, each after a pad allocation of a fixed size (``PADS_MB``, then 4 KiB more per placement), keeping every earlier
problem and pad alive so that each lands somewhere new; each problem's forward is timed by ``do_bench``
(``timed_calls.device_ms``), and with ``--fwd-bwd`` its forward + backward too. Every row records the placement:
the address of q modulo 2 MiB and the offsets of k, v, do and the output o from q, in MiB. ``--processes`` fresh
processes repeat the same sequence of allocations.

Times that repeat placement by placement across processes come from where the tensors lie, or from the point of the
sequence where they are measured (the GPU's clock falls under its power cap the same way in every process:
``benchmarks/clocks.py`` records it); times that move with the process, from the process. ``summary`` gives, per
shape and timer, the spread over the placements (each placement's median over the processes) and the largest spread
of one placement over the processes (:func:`summarise`).

``--shift`` asks which tensor's place matters: q, k and v are carved from one buffer, each with room to move, and one
tensor at a time is moved by each offset of ``--offsets-kib`` (the others stay) before the forward is timed
(:func:`measure_shifts`); every process repeats the same offsets in the same buffer layout. docs/kernels.md ("The
power cap") cites what it found: the time followed the GPU's clock, not the placement (``benchmarks/clocks.py``).

    python benchmarks/placement.py --shapes 2x32768x256,8x8192x256,2x32768x128 --out placement.json
    python benchmarks/placement.py --shapes 2x32768x256 --shift q,k,v --processes 2 --out shifts.json
"""

import argparse
import json
import statistics
import sys

import torch
from timed_calls import child_runs, device_ms, make_problem, parse_shape, write_json

from lightning_attention import lightning_attn

PADS_MB = (0, 1, 2, 3, 5, 8, 13, 21, 34, 0, 55, 89)  # each placement's pad; the sequence is the same in every process
MIB = 1 << 20
# --shift's default offsets: 64 KiB steps within one 2 MiB page, then 2 MiB steps to 62 MiB
SHIFT_OFFSETS_KIB = tuple(range(0, 2048, 64)) + tuple(range(2048, 64 * 1024, 2048))


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


def shifted_tensors(problem, room: int, shift: dict[str, int]) -> dict[str, torch.Tensor]:
    """Copies of the problem's q, k, v in one buffer (``room`` bytes of slack after each), tensor ``name`` starting
    ``shift[name]`` bytes (a multiple of 16) past its slot: the same values at a chosen distance from one another."""
    size = problem.q.numel() * problem.q.element_size()
    # one buffer per call: the caching allocator hands the same block back when the previous one is freed
    buf = torch.empty(3 * (size + room), dtype=torch.uint8, device=problem.q.device)
    out = {}
    for slot, name in enumerate(("q", "k", "v")):
        src = getattr(problem, name).detach()
        start = slot * (size + room) + shift.get(name, 0)
        view = buf[start : start + size].view(src.dtype).view(src.shape)
        view.copy_(src)
        out[name] = view
    return out


def measure_shifts(shapes: list[str], tensors: list[str], offsets_kib: list[int]) -> dict:
    """One process's forward times with one of ``tensors`` moved by each offset in turn (the others at offset 0):
    ``{shape: {name: [ms per offset]}}``, plus ``"unshifted"``: offset 0 of every tensor timed before and after each
    tensor's sweep (the run's own noise)."""
    out = {}
    room = (max(offsets_kib) << 10) + MIB
    for shape in shapes:
        B, T, D = parse_shape(shape)
        problem = make_problem(B, T, D=D)
        rows = {"unshifted": []}

        def timed(shift):
            x = shifted_tensors(problem, room, shift)

            def fwd():
                with torch.no_grad():
                    return lightning_attn(x["q"], x["k"], x["v"], problem.slope)

            fwd()
            return device_ms(fwd)

        for name in tensors:
            rows["unshifted"].append(timed({}))
            rows[name] = [timed({name: kib << 10}) for kib in offsets_kib]
        rows["unshifted"].append(timed({}))
        out[shape] = rows
        torch.cuda.empty_cache()
    return out


def summarise_shifts(runs: list[dict]) -> dict:
    """Per shape and moved tensor, over processes: the median time at each offset, the spread of those medians and of
    the unshifted repeats (largest ÷ smallest − 1), and the offsets of the fastest and slowest medians."""
    summary = {}
    for shape, rows in runs[0].items():
        per_shape = {}
        for name in rows:
            medians = [statistics.median(run[shape][name][i] for run in runs) for i in range(len(rows[name]))]
            per_shape[name] = {
                "per_offset": [round(m, 4) for m in medians],
                "spread": round(max(medians) / min(medians) - 1, 4),
                "fastest_at": medians.index(min(medians)),
                "slowest_at": medians.index(max(medians)),
            }
        summary[shape] = per_shape
    return summary


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
    parser.add_argument("--shift", default=None, help="move these of q, k, v one at a time instead (comma-separated)")
    parser.add_argument("--offsets-kib", default=",".join(map(str, SHIFT_OFFSETS_KIB)),
                        help="--shift's offsets in KiB, comma-separated")  # fmt: skip
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one process's measurement
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    if not 1 <= args.placements <= len(PADS_MB):
        parser.error(f"--placements must be 1 to {len(PADS_MB)}")
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    tensors = args.shift.split(",") if args.shift else []
    offsets_kib = [int(x) for x in args.offsets_kib.split(",")]
    if set(tensors) - {"q", "k", "v"}:
        parser.error("--shift takes q, k and v")
    if any(kib < 0 or kib % 4 for kib in offsets_kib):
        parser.error("--offsets-kib must be multiples of 4")
    if args.child:
        if tensors:
            print(json.dumps(measure_shifts(shapes, tensors, offsets_kib)))
        else:
            print(json.dumps(measure(shapes, args.placements, args.fwd_bwd)))
        return 0
    argv = ["--shapes", args.shapes, "--placements", str(args.placements)] + (["--fwd-bwd"] if args.fwd_bwd else [])
    if tensors:
        argv += ["--shift", args.shift, "--offsets-kib", args.offsets_kib]
    runs = child_runs(__file__, argv, args.processes)
    summary = summarise_shifts(runs) if tensors else summarise(runs)
    for shape, row in summary.items():
        print(shape, json.dumps(row), flush=True)

    from lightning_attention.bench.machine import machine_info, machine_line, source_digest

    write_json(args.out, {
        "machine_line": machine_line(machine_info(torch.device("cuda"))), "command": "python " + " ".join(sys.argv),
        "source": source_digest(), "shapes": shapes,
        **({"shift": tensors, "offsets_kib": offsets_kib} if tensors else {"pads_mib": PADS_MB[: args.placements]}),
        "summary": summary, "runs": runs,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
