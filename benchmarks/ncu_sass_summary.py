"""Where a kernel's warps wait and where its shared memory conflicts, from Nsight Compute's SASS page.

Reads the CSV that ``ncu --import REPORT --page source --print-source sass --csv`` prints (the ``ncu`` stage of
``benchmarks/gpu_suite.sh`` writes it as ``ncu_sass.csv``; gzipped files are read too) and prints, per profiled launch
whose kernel name matches ``--kernel``: its stall samples by reason, the instructions with the most stall samples
(with their main reason), and the instructions with the most excess shared-memory wavefronts (bank conflicts), beside
their wavefronts and the ideal count::

    python benchmarks/ncu_sass_summary.py ncu_sass.csv.gz --kernel dkdv --top 12

A report profiled with ``--set full`` has these columns; sampling counts are per launch, so launches of one kernel
at two shapes are reported apart (``#1``, ``#2`` in profiling order). Warps that never issue (e.g. the unused warps that
pad a warp-specialised partition to a warpgroup) show as barrier samples on one instruction: read the top list
before the reason totals.
"""

import argparse
import csv
import gzip
import io
import json
import sys

STALL_PREFIX = "stall_"
SAMPLES = "Warp Stall Sampling (All Samples)"
EXCESS = "L1 Wavefronts Shared Excessive"
WAVEFRONTS = "L1 Wavefronts Shared"
IDEAL = "L1 Wavefronts Shared Ideal"


def read_launches(text: str) -> list[tuple[str, list[dict]]]:
    """The launches of a SASS page: (kernel name, rows), a row per instruction as {column: text}. A page is a run of
    blocks, each a ``"Kernel Name",NAME`` line followed by a header line and one line per instruction."""
    launches = []
    for block in text.split('"Kernel Name",')[1:]:
        first, _, body = block.partition("\n")
        name = next(csv.reader([first]))[0]
        rows = list(csv.DictReader(io.StringIO(body)))
        launches.append((name, rows))
    return launches


def number(row: dict, column: str) -> float:
    """A counter of ``row`` (0 where the column is missing or not a number, e.g. "-")."""
    try:
        return float(row.get(column) or 0)
    except ValueError:
        return 0.0


def summarise(rows: list[dict], top: int) -> dict:
    """One launch's stall samples by reason, its ``top`` instructions by samples and by excess shared wavefronts."""
    reasons = [c for c in (rows[0] if rows else {}) if c.startswith(STALL_PREFIX) and "Not Issued" not in c]
    samples = sum(number(r, SAMPLES) for r in rows)
    by_reason = {c.removeprefix(STALL_PREFIX): sum(number(r, c) for r in rows) for c in reasons}
    waits = sorted(rows, key=lambda r: -number(r, SAMPLES))[:top]
    conflicts = sorted((r for r in rows if number(r, EXCESS) > 0), key=lambda r: -number(r, EXCESS))[:top]
    return {
        "samples": samples,
        "reasons": dict(sorted(by_reason.items(), key=lambda kv: -kv[1])),
        "waits": [
            {
                "address": r.get("Address", ""), "source": (r.get("Source") or "").strip(),
                "samples": number(r, SAMPLES),
                "reason": max(reasons, key=lambda c: number(r, c)).removeprefix(STALL_PREFIX) if reasons else "",
            }
            for r in waits
        ],
        "excess_wavefronts": sum(number(r, EXCESS) for r in rows),
        "wavefronts": sum(number(r, WAVEFRONTS) for r in rows),
        "conflicts": [
            {
                "address": r.get("Address", ""), "source": (r.get("Source") or "").strip(),
                "excess": number(r, EXCESS), "wavefronts": number(r, WAVEFRONTS), "ideal": number(r, IDEAL),
            }
            for r in conflicts
        ],
    }  # fmt: skip


def format_summary(name: str, s: dict) -> str:
    share = (lambda x: 100 * x / s["samples"]) if s["samples"] else (lambda x: 0.0)
    lines = [f"== {name}: {s['samples']:.0f} stall samples"]
    lines.append("  by reason: " + ", ".join(f"{k} {share(v):.1f}%" for k, v in s["reasons"].items() if v))
    lines.append("  most samples:")
    lines += [f"    {share(w['samples']):5.1f}%  {w['reason']:<16} {w['source'][:90]}" for w in s["waits"]]
    wave = s["wavefronts"]
    excess = s["excess_wavefronts"]
    excess_share = 100 * excess / wave if wave else 0.0
    lines.append(f"  shared memory: {excess:.0f} excess wavefronts of {wave:.0f} ({excess_share:.1f}%)")
    lines += [
        f"    {c['excess']:>10.0f} excess, {c['wavefronts']:.0f} for an ideal {c['ideal']:.0f}  {c['source'][:80]}"
        for c in s["conflicts"]
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csv", help="the SASS page as CSV (.csv or .csv.gz)")
    parser.add_argument("--kernel", default="", help="only launches whose kernel name contains this")
    parser.add_argument("--top", type=int, default=10, help="instructions listed per table")
    parser.add_argument("--json", help="also write the summaries here")
    args = parser.parse_args()
    opener = gzip.open if args.csv.endswith(".gz") else open
    with opener(args.csv, "rt") as f:
        launches = read_launches(f.read())
    seen: dict[str, int] = {}
    out = []
    for name, rows in launches:
        seen[name] = seen.get(name, 0) + 1
        if args.kernel in name:
            out.append({"kernel": name, "launch": seen[name], **summarise(rows, args.top)})
    if not out:
        print(f"no launch of a kernel matching {args.kernel!r} in {args.csv}", file=sys.stderr)
        return 1
    print("\n".join(format_summary(f"{s['kernel']} #{s['launch']}", s) for s in out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
