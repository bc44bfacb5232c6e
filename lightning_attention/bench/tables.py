"""The tables of a recorded benchmark run, in markdown, and where it stands against the targets.

    python -m lightning_attention.bench.tables benchmarks/results/<run folder> [--out FILE]

Reads every JSON document a benchmark wrote under the folder (:mod:`.run_folder`: ``kernels`` — grid (a), grid (b)
and other head dims, in one document or several —, ``decode``, ``hybrid``, ``sp_check``, ``sp_scaling``) and prints:
the machine line, versions, commands and copy bandwidth; per grid the fwd / fwd+bwd medians of every provider
present, the HBM floor, ours ÷ floor, the speedup over FLA and the workspace; grid (b) tokens/s and their flatness;
accuracy; cold start; the decode, hybrid and sequence-parallel tables; notes (skips, failures); then the targets and
the further goals (:mod:`.targets`), each met, met where measured, not met or not measured. What a run lacks is
left out. These are the tables of ``docs/performance.md``.

"Ours" in a ratio column is our first Triton provider that ran in the grid (the chunk backward, else the recompute
one; the PyTorch path in a CPU smoke run). Needs no matplotlib: it runs on the GPU machine too (the ``tables``
stage of ``benchmarks/gpu_suite.sh``).
"""

import argparse
import json
import pathlib
import sys

from lightning_attention.bench import targets as targets_
from lightning_attention.bench.providers import GRID_B_SEQLENS
from lightning_attention.bench.registry import head_class_of
from lightning_attention.bench.results import md_table, num, sci, times
from lightning_attention.bench.run_folder import (
    GRAPH,
    PLAIN,
    PROVIDERS,
    Kernels,
    Run,
    flatness,
    grid_kind,
    load_run,
    merge_kernels,
    primary,
    providers_in,
    seqlens_of,
)


def pair(a, b) -> str:
    return "-" if a is None and b is None else f"{num(a)} / {num(b)}"


def cell(r: dict | None) -> str:
    """fwd / fwd+bwd ms of one record, its status when it did not run, '-' when absent."""
    if r is None:
        return "-"
    if r.get("status") != "ok":
        return str(r.get("status", "?")).upper()
    return pair(r.get("fwd_ms"), r.get("fwdbwd_ms"))


def header(run: Run) -> list[str]:
    out = [f"### {run.folder.name}", ""]
    lines, versions, bandwidths, commands, files = {}, {}, [], [], []
    for bench, docs in run.docs.items():
        for rel, doc in docs:
            files.append(rel)
            line = doc.get("machine_line", "")
            lines.setdefault(line.rsplit(" | ", 1)[0] if line.count(" | ") > 1 else line, line)
            m = doc.get("machine", {})
            versions.setdefault(
                ", ".join(f"{k} {m.get(k) or 'n/a'}" for k in ("torch", "triton", "cuda", "driver", "fla",
                                                              "lightning_attn", "lightning_attention"))
                + (f" (git `{m['git']}`)" if m.get("git") else ""),
                None,
            )
            bw = doc.get("copy_bandwidth", {}).get("bytes_per_s")
            if bw:
                bandwidths.append(f"{bw / 1e12:.2f} TB/s ({rel})")
            argv = doc.get("config", {}).get("argv")
            if argv:
                script = pathlib.Path(argv[0]).name
                if script == "__main__.py":
                    launcher = "python -m lightning_attention.bench"
                elif not script.endswith(".py"):
                    launcher = script  # the lightning-attention console script
                elif "world_size" in doc:
                    launcher = f"torchrun --standalone --nproc_per_node {doc['world_size']} benchmarks/{script}"
                else:
                    launcher = f"python benchmarks/{script}"
                commands.append(f"`{' '.join([launcher, *argv[1:]])}`")
            elif doc.get("config"):
                commands.append(f"{bench}: `{json.dumps(doc['config'], separators=(',', ':'))}`")
    for full in lines.values():
        out.append(f"- Machine line: `{full}`")
    for v in versions:
        out.append(f"- Versions: {v}")
    if run.machine_txt:
        out.append(f"- machine.txt: {' ; '.join(run.machine_txt.splitlines())}")
    out += [f"- Command: {c}" for c in commands]
    out.append(f"- JSON: {', '.join(f'`{f}`' for f in files)}" if files else "- JSON: none found")
    if bandwidths:
        out.append(f"- Copy bandwidth: {'; '.join(bandwidths)}")
    return out


def grid_a_table(kern: Kernels, grid: str) -> list[str]:
    names = providers_in(kern, grid)
    ours = primary(kern, grid)
    headers = ["T", "batch", *(PROVIDERS.get(p, p) for p in names), "floor", "ours ÷ floor", "vs FLA",
               "workspace ÷ q"]
    rows = []
    for t in seqlens_of(kern, grid):
        at = {p: kern.rows.get((grid, p, t)) for p in names}
        first = next(r for r in at.values() if r is not None)
        me = at.get(ours) if ours else None
        ok = me is not None and me.get("status") == "ok"
        fla = kern.speedups.get((grid, t, ours, "fla"))
        rows.append(
            [
                str(t),
                str(first.get("batch", "-")),
                *(cell(at[p]) for p in names),
                pair(first.get("floor_fwd_ms"), first.get("floor_fwdbwd_ms")),
                pair(me.get("floor_ratio_fwd"), me.get("floor_ratio_fwdbwd")) if ok else "-",
                f"{times(fla['fwd'])} / {times(fla['fwdbwd'])}" if fla else "-",
                num(me.get("workspace_ratio")) if ok else "-",
            ]
        )
    out = [f"{kern.grids[grid]} — median ms (fwd / fwd+bwd); ours = {ours}", "", md_table(headers, rows)]
    clock = clock_line(kern, grid)
    return out + ["", clock] if clock else out


# the timers whose SM clock a run records (``bench.kernels.clock_fields``), as a clock line names them
CLOCK_TIMERS = (("fwd", "fwd"), ("fwdbwd", "fwd+bwd"), ("fwdbwd_graph", "fwd+bwd graph"))


def clock_line(kern: Kernels, grid: str) -> str | None:
    """Per provider and timer, the range of the SM clock's mean over each T's measurement and the mean share of it
    under the power cap: a call bound by its arithmetic slows where the cap lowers the clock (docs/kernels.md, "The
    power cap"). None when the run recorded no clock."""
    parts = []
    for p in providers_in(kern, grid):
        at = [r for t in seqlens_of(kern, grid) if (r := kern.rows.get((grid, p, t))) is not None]
        for timer, label in CLOCK_TIMERS:
            mhz = [r[f"{timer}_sm_mhz"] for r in at if r.get(f"{timer}_sm_mhz") is not None]
            if mhz:
                capped = sum(r[f"{timer}_capped_share"] for r in at if r.get(f"{timer}_sm_mhz") is not None) / len(mhz)
                parts.append(f"{PROVIDERS.get(p, p)} {label} {min(mhz):,.0f}–{max(mhz):,.0f} MHz "
                             f"({100 * capped:.0f}% capped)")  # fmt: skip
    if not parts:
        return None
    return f"SM clock over each measurement (its mean; the share of samples under the power cap): {' ; '.join(parts)}."


def grid_b_table(kern: Kernels, grid: str) -> list[str]:
    names = providers_in(kern, grid)
    ours = primary(kern, grid)
    rows = []
    for t in seqlens_of(kern, grid):
        cells = []
        for p in names:
            r = kern.rows.get((grid, p, t))
            if r is None:
                cells.append("-")
            elif r.get("status") != "ok":
                cells.append(str(r.get("status", "?")).upper())
            else:
                cell = f"{r['tokens_per_s_fwdbwd'] / 1e6:.1f} M ({num(r['fwdbwd_ms'])} ms)"
                if r.get("fwdbwd_graph_ms") is not None:  # --cuda-graphs: the replay beside the plain call
                    cell += f"; graph {r['tokens_per_s_fwdbwd_graph'] / 1e6:.1f} M ({num(r['fwdbwd_graph_ms'])} ms)"
                cells.append(cell)
        fla = kern.speedups.get((grid, t, ours, "fla"))
        rows.append([str(t), *cells, times(fla["fwdbwd"]) if fla else "-"])
    headers = ["T", *(PROVIDERS.get(p, p) for p in names), "vs FLA (fwd+bwd)"]
    out = [f"{kern.grids[grid]} — tokens/s fwd+bwd (median ms); ours = {ours}", "", md_table(headers, rows), ""]
    flat = []
    for p in names:
        for key, how in ((PLAIN, ""), (GRAPH, " as CUDA-graph replays")):
            f, n = flatness(kern, grid, p, key)
            if f is not None:
                flat.append(f"{PROVIDERS.get(p, p)}{how} ±{100 * f:.1f}% ({n} of {len(GRID_B_SEQLENS)} T)")
    out.append(f"Flatness (max deviation from the mean, 32K → 1M): {' ; '.join(flat) or 'not measured'}.")
    out.append("")
    out += grid_a_table(kern, grid)  # the same run's fwd / fwd+bwd, floor and workspace at these T
    return out


def accuracy_section(kern: Kernels) -> list[str]:
    if not kern.accuracy:
        return []

    def by_doc_dim(provider):
        return {(a["doc"], a["k_dim"]): a.get("err_max") for a in kern.accuracy if a["provider"] == provider}

    fla, floor = by_doc_dim("fla"), by_doc_dim("rounding-floor")

    def ratio(a, refs):
        ref = refs.get((a["doc"], a["k_dim"]))
        return times(a["err_max"] / ref) if a.get("err_max") is not None and ref else "-"

    rows, by_dim = [], {}
    for a in kern.accuracy:
        status = a.get("status", "?")
        rows.append([PROVIDERS.get(a["provider"], a["provider"]), str(a["k_dim"]),
                     *(sci(a.get(f"err_{n}")) for n in ("o", "dq", "dk", "dv", "max")),
                     ratio(a, fla) if a["provider"] != "fla" else "-", ratio(a, floor), status])  # fmt: skip
        if status == "ok":
            by_dim.setdefault(a["k_dim"], []).append(f"{PROVIDERS.get(a['provider'], a['provider'])} "
                                                    f"{sci(a['err_max'])}")
    out = ["Accuracy (relative L2 vs float64 from the same rounded inputs; the float64 result rounded to the inputs' "
           "dtype is the floor):", "",
           md_table(["provider", "K = V", "o", "dq", "dk", "dv", "max", "÷ FLA", "÷ floor", "status"], rows), ""]
    for dim, parts in sorted(by_dim.items()):
        out.append(f"Accuracy (relative L2 vs float64, max over o, dq, dk, dv), K = V = {dim}: {' ; '.join(parts)}.")
    return out


def cold_section(kern: Kernels) -> list[str]:
    cold = [r for r in kern.rows.values() if r.get("cold_start_s") is not None]
    if not cold:
        return []
    rows = [[PROVIDERS.get(r["provider"], r["provider"]), head_class_of(r), r["grid"],
             str(r["seqlen"]), f"{r['cold_start_s']:.1f}", r["doc"]] for r in cold]
    worst = {}
    for r in cold:
        worst[r["provider"]] = max(worst.get(r["provider"], 0.0), r["cold_start_s"])
    line = " ; ".join(f"{PROVIDERS.get(p, p)} {s:.1f} s" for p, s in worst.items())
    return ["Cold start (first fwd+bwd call of a shape class in a process: compile + autotune):", "",
            md_table(["provider", "class", "grid", "T", "s", "JSON"], rows), "",
            f"Cold start (first fwd+bwd of a shape class, worst): {line}."]


def decode_section(run: Run) -> list[str]:
    out = []
    for rel, doc in run.of("decode"):
        shape = doc.get("decode_shape", {})
        rows = []
        for r in doc.get("latency", []):
            res = r.get("result", {}) if r.get("status") == "ok" else {}
            if not res:
                rows.append([str(r["batch"]), str(r.get("status", "?")).upper(), *["-"] * 9])
                continue
            rows.append([
                str(r["batch"]), num(res.get("ours_us")), num(res.get("ours_gpu_us")), num(res.get("ours_graph_us")),
                num(res.get("fla_us")), num(res.get("fla_graph_us")), times(res.get("speedup_vs_fla")),
                times(res.get("graph_speedup_vs_fla")), num(res.get("floor_us")), num(r.get("floor_run_us")),
                num(res.get("gpu_vs_floor")),
            ])
        if rows:
            title = (f"Decode step (H = {shape.get('heads')}, K = {shape.get('k_dim')}, V = {shape.get('v_dim')}, "
                     f"{shape.get('dtype')} q/k/v, fp32 state; FLA `fused_recurrent_simple_gla` T = 1; `{rel}`):")
            out += [
                title, "",
                md_table(["batch", "ours eager µs (host incl.)", "ours GPU µs", "ours graph µs", "FLA eager µs",
                          "FLA graph µs", "eager speedup", "graph speedup", "floor µs (state r+w, 3.0 TB/s)",
                          "floor µs (this run)", "GPU ÷ floor"], rows), "",
            ]
        memory = doc.get("memory")
        if memory:
            if memory.get("status") != "ok":
                out.append(f"Decode memory: {memory.get('status')}: {memory.get('error')}")
            else:
                res = memory["result"]
                runs = ", ".join(f"{r['tokens']:,} tokens peak {r['peak_bytes'] / 2**20:.3f} MiB "
                                 f"(start {r['start_bytes'] / 2**20:.3f} MiB)" for r in res.get("runs", []))
                out.append(f"Decode memory ({res.get('metric')}): {runs}; flat = {res.get('flat')}.")
            out.append("")
    return out


def hybrid_section(run: Run) -> list[str]:
    out = []
    for rel, doc in run.of("hybrid"):
        rows = []
        for r in doc.get("results", []):
            res = r.get("result", {})
            if r.get("status") != "ok":
                rows.append([str(r["seqlen"]), str(r.get("status", "?")).upper(), "-", "-"])
                continue
            rows.append([str(r["seqlen"]), pair(res.get("hybrid_fwd_ms"), res.get("hybrid_fwdbwd_ms")),
                         pair(res.get("sdpa_fwd_ms"), res.get("sdpa_fwdbwd_ms")),
                         f"{times(res.get('speedup_fwd'))} / {times(res.get('speedup_fwdbwd'))}"])
        if rows:
            first = next((r["result"] for r in doc["results"] if r.get("status") == "ok"), {})
            what = ", ".join(f"{k} = {first[k]}" for k in ("batch", "num_heads", "head_dim", "chunk_size", "dtype")
                             if k in first)
            out += [f"Hybrid chunk attention vs SDPA causal ({what}; `{rel}`) — median ms (fwd / fwd+bwd):", "",
                    md_table(["T", "hybrid", "SDPA causal", "speedup (SDPA ÷ hybrid)"], rows), ""]
    return out


def sp_section(run: Run) -> list[str]:
    out = []
    for rel, doc in run.of("sp_check"):
        s = doc.get("shape", {})
        out.append(f"Sequence-parallel correctness (`{rel}`): T = {s.get('seq_len')}, B = {s.get('batch')}, "
                   f"H = {s.get('heads')}, K = V = {s.get('dim_k')}, {s.get('dtype')}, {doc.get('world_size')} ranks "
                   f"({doc.get('backend', '?')}): passed = {doc.get('passed')}")
        for c in doc.get("cases", []):
            sp = max(e["rel_l2"] for e in c["errors"].values())
            single = c.get("single_process_errors")
            ref = f" (single-process op: {sci(max(e['rel_l2'] for e in single.values()))})" if single else ""
            out.append(f"- decay {c['decay']}: max rel. L2 over o, dq, dk, dv, final, dh0 {sci(sp)}{ref}, "
                       f"tolerance {c['tolerance']:.0e}: {'passed' if c['passed'] else 'FAILED'}")
        out.append("")
    for rel, doc in run.of("sp_scaling"):
        p = doc.get("world_size")
        layer = doc.get("layer", {})
        out.append(f"Sequence-parallel scaling (`{rel}`): {layer.get('what', 'one layer')}, H = {layer.get('heads')}, "
                   f"K = V = {layer.get('dim_k')}, {layer.get('dtype')}, {p} ranks ({doc.get('backend', '?')})")
        rows = []
        for r in doc.get("tokens_per_second", []):
            rates = [r.get(key, {}) for key in ("gpus_1", f"gpus_{p}")]
            cells = [f"{x['tokens_per_second'] / 1e6:.2f} M" if x.get("status") == "ok" else str(x.get("status"))
                     for x in rates]
            rows.append([str(r["seq_len"]), *cells, times(r.get("speedup")), num(r.get("efficiency"))])
        if rows:
            out += ["", md_table(["T", "1 GPU tokens/s", f"{p} GPUs tokens/s", "speedup", "efficiency"], rows), ""]
        longest = doc.get("longest_seq_len")
        if longest:
            out.append(f"- Longest T that trains (fwd+bwd): 1 GPU {longest.get('gpus_1')} (stopped: "
                       f"{longest.get('stopped_gpus_1')}); {p} GPUs {longest.get(f'gpus_{p}')} (stopped: "
                       f"{longest.get(f'stopped_gpus_{p}')})")
        comm = doc.get("communication")
        if comm:
            sends = ", ".join(f"T = {r['seq_len']}: {r['send_bytes_per_layer']:,} B"
                              for r in comm.get("measured_rank0", []))
            out.append(f"- Bytes sent per rank per layer (fwd + bwd): {sends}; predicted "
                       f"{comm['predicted']['total_send']:,} B; independent of T: {comm.get('independent_of_seq_len')}")
        out.append("")
    return out


def notes_section(run: Run, kern: Kernels) -> list[str]:
    notes = []
    for docs in run.docs.values():
        for rel, doc in docs:
            notes += [f"{rel}: skipped {s['what']}: {s['reason']}" for s in doc.get("skipped", [])]
            if "elapsed_s" not in doc and doc.get("bench") in ("kernels", "decode", "hybrid"):
                notes.append(f"{rel}: no elapsed_s — the run did not finish (time limit?)")
    for r in kern.rows.values():
        if r.get("status") not in ("ok", "skipped"):
            notes.append(f"{r['provider']} {r['grid']} T={r['seqlen']}: {r.get('status')}: {r.get('error')}")
    notes += [f"measured twice (first success kept): {d}" for d in kern.duplicates]
    notes += [f"ignored {i}" for i in run.ignored]
    return ["Notes (skips, failures, anything unexpected):", ""] + [f"- {n}" for n in notes] if notes else []


def targets_section(run: Run, kern: Kernels) -> list[str]:
    def table(verdicts: list[targets_.Verdict]) -> str:
        rows = [[v.area, v.target, v.status, v.detail] for v in verdicts]
        return md_table(["area", "target", "status", "detail"], rows)

    held = 'Targets (docs/design.md, "Numbers we hold ourselves to"; sequence parallelism as performance.md has it):'
    further = "Further goals (every head dim well ahead of FLA, K = 128 near the HBM floor):"
    return [held, "", table(targets_.targets(run, kern)), "", further, "", table(targets_.goals(kern))]


# ---------------------------------------------------------------------------------------------------- main


def render(run: Run) -> str:
    """The markdown of a run folder (module docstring)."""
    kern = merge_kernels(run.of("kernels"))
    sections = [header(run)]
    grids = sorted(kern.grids, key=lambda g: (grid_kind(g)[2], grid_kind(g)[1] != 128, grid_kind(g)[0],
                                              grid_kind(g)[1] or 0))
    for g in grids:
        if not seqlens_of(kern, g):
            continue
        sections.append(grid_b_table(kern, g) if grid_kind(g)[0] == "b" else grid_a_table(kern, g))
    for part in (accuracy_section(kern), cold_section(kern), decode_section(run), hybrid_section(run),
                 sp_section(run), notes_section(run, kern), targets_section(run, kern)):
        if part:
            sections.append(part)
    return "\n\n".join("\n".join(s).rstrip() for s in sections) + "\n"


def missing_folders(*folders: pathlib.Path) -> bool:
    """Whether any of ``folders`` is not a folder (each such one named on stderr): a report's arguments."""
    missing = [f for f in folders if not f.is_dir()]
    for folder in missing:
        print(f"error: {folder} is not a folder", file=sys.stderr)
    return bool(missing)


def emit(text: str, out: pathlib.Path | None) -> None:
    """Prints a report's markdown and, with ``out``, writes it there too."""
    print(text, end="")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", type=pathlib.Path, help="a run folder (e.g. one under benchmarks/results/)")
    p.add_argument("--out", type=pathlib.Path, default=None, help="also write the markdown to this file")
    args = p.parse_args(argv)
    if missing_folders(args.folder):
        return 2
    emit(render(load_run(args.folder)), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
