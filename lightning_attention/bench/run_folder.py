"""A recorded benchmark run as data: every JSON document a benchmark wrote under one folder, by kind, and the
``lightning_attn`` kernel records of all of them merged into one view (what :mod:`.tables` prints and :mod:`.targets`
checks).

A run folder is what ``benchmarks/gpu_suite.sh`` packs (one sub-folder per stage, each with the JSON of
``lightning-attention bench ...`` or of a benchmark script) or any folder of such documents. A document is any JSON
object with a string ``"bench"`` field (``kernels``, ``decode``, ``hybrid``, ``sp_check``, ``sp_scaling``); other
files are listed as ignored.

Speedups are formed only between providers of one document (one process on one GPU: ratios between runs are never
taken), and a ratio belongs to the document whose time of ours the tables show.
"""

import dataclasses
import json
import pathlib
import re

from lightning_attention.bench import metrics
from lightning_attention.bench.kernels import compute_speedups

# provider -> column label, in the tables' order; providers not listed follow under their own names
PROVIDERS = {
    "ours-chunk": "ours (chunk)",
    "ours-recompute": "ours (recompute)",
    "ours-split": "ours (split precision)",
    "rounding-floor": "float64 rounded",
    "fla": "FLA",
    "official": "official",
    "sdpa": "SDPA",
    "torch": "torch path",
}
TRITON_OURS = ("ours-chunk", "ours-recompute", "ours-split")
FLAT_RANGE = (32768, 1048576)  # grid (b)'s "constant speed" span
# grid (b) tokens/s: plain calls, and CUDA-graph replays (``bench kernels --cuda-graphs``)
PLAIN, GRAPH = "tokens_per_s_fwdbwd", "tokens_per_s_fwdbwd_graph"


@dataclasses.dataclass
class Run:
    """The benchmark documents of one run folder, by kind, each as ``(path relative to the folder, document)``."""

    folder: pathlib.Path
    docs: dict[str, list[tuple[str, dict]]]
    ignored: list[str]
    machine_txt: str | None

    def of(self, bench: str) -> list[tuple[str, dict]]:
        return self.docs.get(bench, [])


def load_run(folder: pathlib.Path) -> Run:
    """Every benchmark document under ``folder`` (recursively) and its ``machine.txt`` (the suite's GPU line)."""
    docs: dict[str, list] = {}
    ignored = []
    for path in sorted(folder.rglob("*.json")):
        rel = str(path.relative_to(folder))
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            ignored.append(f"{rel} (unreadable: {exc})")
            continue
        if isinstance(doc, dict) and isinstance(doc.get("bench"), str):
            docs.setdefault(doc["bench"], []).append((rel, doc))
        else:
            ignored.append(f"{rel} (not a benchmark document)")
    machine = folder / "machine.txt"
    return Run(folder, docs, ignored, machine.read_text().strip() if machine.is_file() else None)


@dataclasses.dataclass
class Kernels:
    """Every kernels record of a run, merged over its documents."""

    rows: dict[tuple[str, str, int], dict]  # (grid, provider, T) -> record (+ "doc": its file)
    speedups: dict[tuple[str, int, str, str], dict]  # (grid, T, ours, baseline) -> compute_speedups row
    accuracy: list[dict]  # + "doc"
    grids: dict[str, str]  # grid name -> description
    duplicates: list[str]


def merge_kernels(docs: list[tuple[str, dict]]) -> Kernels:
    """The records of several ``kernels`` documents as one: a (grid, provider, T) measured twice keeps its first
    successful record (the repeat is listed in ``duplicates``)."""
    rows, per_doc, accuracy, grids, duplicates = {}, [], [], {}, []
    for rel, doc in docs:
        results = doc.get("results", [])
        for name, grid in doc.get("grids", {}).items():
            grids.setdefault(name, grid.get("description", name))
        for r in results:
            grids.setdefault(r["grid"], r["grid"])
            key = (r["grid"], r["provider"], r["seqlen"])
            old = rows.get(key)
            if old is not None:
                duplicates.append(f"{r['provider']} {r['grid']} T={r['seqlen']} in {old['doc']} and {rel}")
                if old.get("status") == "ok" or r.get("status") != "ok":
                    continue  # keep the first successful measurement
            rows[key] = {**r, "doc": rel}
        # recomputed here: a run stopped by its time limit has results but no "speedups" yet
        per_doc += [(rel, s) for s in compute_speedups(results)]
        accuracy += [{**a, "doc": rel} for a in doc.get("accuracy", [])]
    # a ratio belongs to the document whose time of ours the tables show
    speedups = {
        (s["grid"], s["seqlen"], s["ours"], s["baseline"]): s
        for rel, s in per_doc
        if rows[(s["grid"], s["ours"], s["seqlen"])]["doc"] == rel
    }
    return Kernels(rows, speedups, accuracy, grids, duplicates)


def grid_kind(name: str) -> tuple[str, int | None, bool]:
    """``"a-d128"`` -> ("a", 128, False); ``"quick-b-d32"`` -> ("b", 32, True)."""
    m = re.fullmatch(r"(quick-)?([ab])-d(\d+)", name)
    return (m.group(2), int(m.group(3)), bool(m.group(1))) if m else ("a", None, False)


def providers_in(kern: Kernels, grid: str) -> list[str]:
    present = {p for g, p, _ in kern.rows if g == grid}
    return [p for p in PROVIDERS if p in present] + sorted(present - set(PROVIDERS))


def primary(kern: Kernels, grid: str) -> str | None:
    """Our provider the ratio columns describe: the first Triton one that ran, else the PyTorch path."""
    for p in (*TRITON_OURS, "torch"):
        if any(r.get("status") == "ok" for (g, q, _), r in kern.rows.items() if g == grid and q == p):
            return p
    return None


def seqlens_of(kern: Kernels, grid: str) -> list[int]:
    return sorted({t for g, _, t in kern.rows if g == grid})


def flatness(kern: Kernels, grid: str, provider: str, key: str = PLAIN) -> tuple[float | None, int]:
    """Max deviation from the mean of ``key`` over grid (b)'s lengths, and how many lengths had it."""
    lo, hi = FLAT_RANGE
    values = [
        r[key]
        for (g, p, t), r in kern.rows.items()
        if g == grid and p == provider and lo <= t <= hi and r.get("status") == "ok" and r.get(key) is not None
    ]
    return (metrics.flatness(values) if len(values) >= 2 else None), len(values)
