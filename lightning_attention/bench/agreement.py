"""Whether two recorded runs of ``bench kernels`` agree point by point: the stability target's check (two runs on two
fresh machines within 5% at every point).

    python -m lightning_attention.bench.agreement FOLDER_A FOLDER_B [--bound 5] [--out FILE]

For every (grid, provider, T) that both runs measured and every timer both timed (the forward and fwd+bwd medians, and
the fwd+bwd as CUDA-graph replays): the second run's median against the first's, in percent, and the same for their
20th percentiles, which tell a median that fell on another power state of the GPU from a slower call
(docs/kernels.md, "The power cap"). Per grid a table of those differences; then per (grid, provider, timer) the
largest and whether every point lies within the bound; the points past it with both runs' mean SM clock over their
measurements, where sampled. The two runs' commands are printed too: runs timed differently (``--settle-s``, another
``--rep-ms``) measure different things.
"""

import argparse
import dataclasses
import pathlib

from lightning_attention.bench.results import md_table
from lightning_attention.bench.run_folder import PROVIDERS, Kernels, load_run, merge_kernels
from lightning_attention.bench.tables import CLOCK_TIMERS, emit, header, missing_folders

DEFAULT_BOUND_PCT = 5.0


@dataclasses.dataclass(frozen=True)
class Point:
    """One (grid, provider, T, timer) of both runs: the second's median and 20th percentile against the first's, in
    percent (None where either lacks it), and each run's mean SM clock over the measurement (None where unsampled)."""

    grid: str
    provider: str
    seqlen: int
    timer: str
    median_pct: float
    p20_pct: float | None
    mhz_a: float | None
    mhz_b: float | None


def _pct(a, b) -> float | None:
    return None if not a or b is None else (b / a - 1.0) * 100.0


def compare(a: Kernels, b: Kernels) -> list[Point]:
    """Every point both runs measured successfully, in (grid, provider, T, timer) order."""
    points = []
    for key in sorted(a.rows.keys() & b.rows.keys()):
        ra, rb = a.rows[key], b.rows[key]
        if ra.get("status") != "ok" or rb.get("status") != "ok":
            continue
        grid, provider, seqlen = key
        for timer, _ in CLOCK_TIMERS:
            median = _pct(ra.get(f"{timer}_ms"), rb.get(f"{timer}_ms"))
            if median is None:
                continue
            p20 = _pct(ra.get(f"{timer}_p20_ms"), rb.get(f"{timer}_p20_ms"))
            mhz_a, mhz_b = ra.get(f"{timer}_sm_mhz"), rb.get(f"{timer}_sm_mhz")
            points.append(Point(grid, provider, seqlen, timer, median, p20, mhz_a, mhz_b))
    return points


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The points of one (grid, provider, timer): how many, how many within the bound, the largest difference."""

    grid: str
    provider: str
    timer: str
    points: int
    within: int
    largest_pct: float

    @property
    def met(self) -> bool:
        return self.within == self.points


def verdicts(points: list[Point], bound_pct: float = DEFAULT_BOUND_PCT) -> list[Verdict]:
    groups: dict[tuple[str, str, str], list[float]] = {}
    for p in points:
        groups.setdefault((p.grid, p.provider, p.timer), []).append(p.median_pct)
    return [
        Verdict(grid, provider, timer, len(pcts), sum(abs(x) <= bound_pct for x in pcts), max(pcts, key=abs))
        for (grid, provider, timer), pcts in sorted(groups.items(), key=lambda g: (g[0][0], *_order(*g[0][1:])))
    ]


def _signed(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f}%"


def _label(timer: str) -> str:
    return dict(CLOCK_TIMERS)[timer]


def _order(provider: str, timer: str) -> tuple:
    """The tables' order: providers as :data:`.run_folder.PROVIDERS` lists them (others after, by name), then timers."""
    rank = list(PROVIDERS).index(provider) if provider in PROVIDERS else len(PROVIDERS)
    return rank, provider, [t for t, _ in CLOCK_TIMERS].index(timer)


def grid_table(points: list[Point], grid: str) -> list[str]:
    """Rows T, a column per (provider, timer): the medians' difference, the 20th percentiles' in brackets."""
    mine = [p for p in points if p.grid == grid]
    columns = sorted({(p.provider, p.timer) for p in mine}, key=lambda c: _order(*c))
    at = {(p.seqlen, p.provider, p.timer): p for p in mine}
    rows = []
    for t in sorted({p.seqlen for p in mine}):
        cells = []
        for provider, timer in columns:
            p = at.get((t, provider, timer))
            cells.append("-" if p is None else f"{_signed(p.median_pct)} ({_signed(p.p20_pct)})")
        rows.append([str(t), *cells])
    headers = ["T", *(f"{PROVIDERS.get(p, p)} {_label(t)}" for p, t in columns)]
    return [f"{grid} — second run against the first: median (20th percentile)", "", md_table(headers, rows)]


def render(folder_a: pathlib.Path, folder_b: pathlib.Path, bound_pct: float = DEFAULT_BOUND_PCT) -> str:
    run_a, run_b = load_run(folder_a), load_run(folder_b)
    points = compare(merge_kernels(run_a.of("kernels")), merge_kernels(run_b.of("kernels")))
    sections = [[f"First run: `{folder_a}`", *header(run_a)[2:]], [f"Second run: `{folder_b}`", *header(run_b)[2:]]]
    if not points:
        return "\n\n".join("\n".join(s) for s in sections) + "\n\nNo point was measured in both runs.\n"
    sections += [grid_table(points, g) for g in sorted({p.grid for p in points})]
    lines = [f"Within {bound_pct:g}% at every point:", ""]
    for v in verdicts(points, bound_pct):
        status = "met" if v.met else "not met"
        lines.append(f"- {v.grid} {PROVIDERS.get(v.provider, v.provider)} {_label(v.timer)}: {status}, "
                     f"{v.within} of {v.points} points, largest {_signed(v.largest_pct)}")  # fmt: skip
    past = [p for p in points if abs(p.median_pct) > bound_pct]
    if past:
        lines += ["", "Past the bound, with the mean SM clock of each run's measurement (MHz):", ""]
        for p in past:
            clocks = "" if p.mhz_a is None or p.mhz_b is None else f", {p.mhz_a:.0f} against {p.mhz_b:.0f} MHz"
            lines.append(f"- {p.grid} {PROVIDERS.get(p.provider, p.provider)} {_label(p.timer)} T={p.seqlen}: "
                         f"{_signed(p.median_pct)} (20th percentile {_signed(p.p20_pct)}){clocks}")  # fmt: skip
    sections.append(lines)
    return "\n\n".join("\n".join(s).rstrip() for s in sections) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("first", type=pathlib.Path, help="a run folder (e.g. one under benchmarks/results/)")
    p.add_argument("second", type=pathlib.Path, help="another run folder of the same grids")
    p.add_argument("--bound", type=float, default=DEFAULT_BOUND_PCT, help="the agreement bound in percent")
    p.add_argument("--out", type=pathlib.Path, default=None, help="also write the markdown to this file")
    args = p.parse_args(argv)
    if missing_folders(args.first, args.second):
        return 2
    emit(render(args.first, args.second, args.bound), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
