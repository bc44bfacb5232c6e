"""Measures the tuned table of this GPU's architecture (``lightning_attention/ops/lightning/kernels/tuned.py``) and
writes it: the configuration each autotuned launch of the benchmark grids takes instead of autotuning.

For each shape class (bf16 grid (a) at K = V = 64, 128 and 256, batch 1 at 128K tokens, fp16 and the split
precision at K = 128; ``--classes`` for others), with the Triton walk (the ``gluon`` setting off: the two-warpgroup
walk has one configuration), the script plans and runs one fwd+bwd (compiling every candidate),
then, for each autotuned launch of the call (its key: ``kernels/tuned.table_key``), pins each candidate in turn
through a table of one entry (the call's other launches keep the autotuner's choice, made once per process) and
times the whole fwd+bwd by its kernels' CUDA time added up (``timed_calls.kernel_ms``, the median of ``--calls``
calls), ``--reps`` rounds with the candidates interleaved. Kernel time, not the wall time of plain calls: a K = 64
fwd+bwd takes about as long to enqueue on the host as its kernels take on the GPU, so wall times follow the host's
noise and chose a slower walk (docs/kernels.md, "The tuned table").
A key's times add up over the classes that launch it. The winner is the fastest candidate, unless the selector's
first candidate is within ``--tie`` of it: then the first, so that a choice the timings cannot tell apart follows the
selector's rule instead of the noise. Every candidate is one the GPU suite value-checks against float64
(tests/ops/test_configs_gpu.py), so no configuration enters the table unchecked.

    python benchmarks/tune_table.py                      # writes kernels/tuned_sm<NN>.py for this GPU
    python benchmarks/tune_table.py --classes bf16:4x16384x64,bf16:1x131072x128 --reps 5 --json tune.json
    python benchmarks/tune_table.py --first-candidates 80 --sms 108    # no GPU: kernels/tuned_sm80.py, untimed
    python benchmarks/tune_table.py --first-candidates 100 --sms 148   # no GPU: kernels/tuned_sm100.py, untimed

The written module names the GPU, the software, the commit measured and this command; the JSON (``--json``) holds
every timing.
"""

import argparse
import json
import pathlib
import pprint
import statistics
import sys
import textwrap

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
TABLE_FOLDER = ROOT / "lightning_attention" / "ops" / "lightning" / "kernels"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
GRID_A = tuple((65536 // T, T) for T in (1024, 2048, 4096, 8192, 16384, 32768, 65536))
# (dtype, B, T, D, precision): where the benchmarks and the training runs spend their time, the most used first (the
# table is rewritten after every class, so a run cut short keeps what it measured)
DEFAULT_CLASSES = (
    *(("bf16", B, T, D, "input") for D in (128, 64, 256) for B, T in GRID_A),
    *(("bf16", 1, 131072, D, "input") for D in (64, 128, 256)),
    *(("fp16", B, T, 128, "input") for B, T in GRID_A),
    *(("bf16", B, T, 128, "split") for B, T in GRID_A),
)


def parse_class(text: str) -> tuple[str, int, int, int, str]:
    """``"bf16:4x16384x64"`` or ``"bf16:4x16384x64:split"`` -> (dtype, B, T, D, precision)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or parts[0] not in DTYPES:
        raise ValueError(f"a class is DTYPE:BxTxD[:PRECISION] with DTYPE in {sorted(DTYPES)}, got {text!r}")
    B, T, D = (int(x) for x in parts[1].split("x"))
    return parts[0], B, T, D, parts[2] if len(parts) == 3 else "input"


def choose(times: dict, candidates: dict, tie: float) -> dict:
    """The table: per key, the candidate with the least total time, or the first candidate (the selector's order)
    where it is within ``tie`` (a fraction) of that.

    ``times``: key -> candidate -> list of times (ms) of the calls that ran it, one per class and round;
    ``candidates``: key -> the candidates in the selector's order."""
    table = {}
    for key, options in candidates.items():
        totals = {c: sum(times[key][c]) for c in options if times.get(key, {}).get(c)}
        if not totals:
            continue
        best = min(totals, key=totals.get)
        first = options[0]
        table[key] = first if first in totals and totals[first] <= totals[best] * (1 + tie) else best
    return table


def render(table: dict, provenance: str, title: str = "Launch configurations measured on this architecture",
           measured: bool = True) -> str:  # fmt: skip
    """The source of a ``tuned_sm<NN>.py`` module holding ``table`` (sorted, one entry a line, or two where a line
    would pass 120 characters) and whether it was ``measured`` on a GPU of that architecture."""
    from lightning_attention.ops.lightning.kernels import dkdv_walk, walk

    comment = textwrap.fill(
        f"key: (kind, dtype, INTER_PREC, *the kernel's autotuning key): walk {tuple(walk.AUTOTUNE_KEY)}, dk/dv walk "
        f"{tuple(dkdv_walk.AUTOTUNE_KEY)}; value: (BT, BV, num_warps, num_stages)",
        width=118, initial_indent="# ", subsequent_indent="# ", break_long_words=False)  # fmt: skip
    lines = (f"    {key!r}: {value!r},\n" for key, value in sorted(table.items(), key=repr))
    entries = "".join(line if len(line) <= 121 else line.replace(": (", ":\n        (", 1) for line in lines)
    paragraph = textwrap.fill(provenance, 120, break_on_hyphens=False, break_long_words=False)  # paths stay whole
    return (
        f'"""{title} (read through\n'
        f":mod:`lightning_attention.ops.lightning.kernels.tuned`).\n\n{paragraph}\n"
        f'"""\n\n'
        f"MEASURED = {measured}  # timed on a GPU of this architecture (False: the selector's first candidates)\n\n"
        f"{comment}\n"
        f"CONFIGS: dict[tuple, tuple[int, int, int, int]] = {{\n{entries}}}\n"
    )


def measure(classes, reps: int, calls: int, log=print, after_class=None) -> tuple[dict, dict]:
    """(times, candidates) over ``classes`` on this GPU (see :func:`choose`); ``after_class(times, candidates)`` is
    called as each class finishes."""
    from timed_calls import kernel_ms, make_problem

    from lightning_attention import settings
    from lightning_attention.ops.lightning import launches, run
    from lightning_attention.ops.lightning.kernels import tuned

    times: dict = {}
    candidates: dict = {}
    # the table is the Triton walk's: the two-warpgroup walk (bf16 at K = 128 and 256 on sm_90) has one configuration,
    # and with it on these classes would leave the Triton launches it replaces untimed (they still serve the gluon
    # setting off and the grids under half the SMs)
    for dtype, B, T, D, precision in classes:
        with settings.override(precision=precision, tuned_table=True, gluon=False), tuned.override({}):
            run.clear_programs()
            problem = make_problem(B, T, D=D, dtype=DTYPES[dtype])
            problem.fwd_bwd()  # plans, compiles every candidate, autotunes
            keys = launches.autotuned_launches()
            log(f"{dtype} {B}x{T}x{D} {precision}: {len(keys)} autotuned launches")
        for key, options in keys.items():
            candidates.setdefault(key, options)
            for _ in range(reps):
                for option in options:
                    with settings.override(precision=precision, gluon=False), tuned.override({key: option}):
                        run.clear_programs()
                        ms = kernel_ms(problem.fwd_bwd, calls=calls)
                    times.setdefault(key, {}).setdefault(option, []).append(ms)
            medians = {o: statistics.median(times[key][o][-reps:]) for o in options}
            log(f"  {key}: " + ", ".join(f"{o} {ms:.3f} ms" for o, ms in medians.items()))
        run.clear_programs()
        del problem
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if after_class is not None:
            after_class(times, candidates)
    return times, candidates


# the classes an architecture without a GPU here ships entries for: the K = 128 ones (bf16 grid (a), batch 1 at 128K,
# fp16, the split precision). K = 64 keeps autotuning there: on sm_90 its selector's first candidate (two stages) ran
# 6-29% slower than the second (docs/kernels.md, "The tuned table")
FIRST_CANDIDATE_CLASSES = tuple(c for c in DEFAULT_CLASSES if c[3] == 128)


def first_candidates(capability: int, sm_count: int, classes=FIRST_CANDIDATE_CLASSES) -> dict:
    """The table of an architecture no GPU here can time: for every autotuned launch that a fwd+bwd of ``classes``
    plans on a GPU of ``capability`` with ``sm_count`` SMs (no GPU needed), the selector's first candidate, entered
    for both values of the key's WAVES field (other GPUs of the architecture have other SM counts; the candidates do
    not depend on it). Every entry is then a configuration tests/ops/test_aot.py compiles for that target."""
    from lightning_attention import settings
    from lightning_attention.ops.lightning import launches, plan, run
    from lightning_attention.ops.lightning.device import DeviceInfo
    from lightning_attention.ops.lightning.kernels import tuned, walk

    device = DeviceInfo.of_capability(capability, sm_count)
    waves = 3 + walk.AUTOTUNE_KEY.index("WAVES")  # after (kind, dtype, INTER_PREC): tuned.table_key
    table = {}
    for dtype, B, T, D, precision in classes:
        fwd = _planned_problem(device, DTYPES[dtype], B, T, D, settings.Settings(precision=precision))
        segments = plan.plan_segments(fwd)
        states = segments.total if segments.segmented else None
        bwd = _planned_problem(device, DTYPES[dtype], B, T, D, fwd.settings, backward=True, fwd_states=states)
        with tuned.override({}):
            run.clear_programs()
            run.forward_program(fwd)
            run.backward_program(bwd)
            keys = launches.autotuned_launches()
            run.clear_programs()
        for key, options in keys.items():
            for w in (1, 2):
                table[(*key[:waves], w, *key[waves + 1 :]) if key[0] == "walk" else key] = options[0]
    return table


def _planned_problem(device, dtype, B, T, D, config, backward=False, fwd_states=None):
    """The :class:`ChunkProblem` of a call on contiguous ``[B, T, 16, D]`` tensors with TNL slopes, as ``device`` would
    plan it; ``backward``: its backward, which receives ``fwd_states`` segment states (None: unsegmented)."""
    from lightning_attention.ops.lightning.plan import ChunkProblem, TensorSpec

    qk = TensorSpec.contiguous((B, T, 16, D), dtype)
    return ChunkProblem(
        q=qk, k=qk, v=qk, num_seqs=B, varlen=False, offsets=None, has_slope=True, h0=None, final_state=False,
        scale=1.0, inter_chunk=0, device=device, settings=config, do=qk if backward else None,
        fwd_states=None if fwd_states is None else TensorSpec.contiguous((fwd_states, 16, D, D), torch.float32),
    )  # fmt: skip


def write_first_candidates(capability: int, sm_count: int, out: str | None) -> None:
    """Writes :func:`first_candidates` as ``kernels/tuned_sm<capability>.py`` (or ``out``)."""
    table = first_candidates(capability, sm_count)
    provenance = (
        f"Not timed on an sm_{capability} GPU: each entry is the selector's first candidate for an "
        f"autotuned launch of the K = 128 benchmark classes (bf16 grid (a), batch 1 at 128K, fp16, the split "
        f"precision), planned for {sm_count} SMs and entered for both WAVES values, so that a first "
        f"call compiles one configuration instead of timing two; tests/ops/test_aot.py compiles every entry for "
        f"sm_{capability}. Written by ``python benchmarks/tune_table.py --first-candidates {capability} --sms "
        f"{sm_count}``; {len(table)} entries."
    )
    path = pathlib.Path(out) if out else TABLE_FOLDER / f"tuned_sm{capability}.py"
    path.write_text(render(table, provenance, title=f"Launch configurations for sm_{capability}", measured=False))
    print(f"wrote {path}: {len(table)} entries")


def gpu_line(info: dict) -> str:
    """The GPU and the software that set its timings, e.g. ``NVIDIA H200 | driver 580.159.04 | CUDA 13.0 | torch
    2.11.0+cu130 | triton 3.6.0``: the first five fields of a GPU's
    :func:`~lightning_attention.bench.machine.machine_line`, without the baselines and the time of the run (the
    table's docstring holds only what its entries depend on)."""
    from lightning_attention.bench.machine import machine_line

    return " | ".join(machine_line(info).split(" | ")[:5])


def measuring_command(argv: list[str]) -> str:
    """The command line that measured the table, without the options that only name where its outputs go."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in ("--out", "--json", "--results"):
            skip = True
        elif not arg.startswith(("--out=", "--json=", "--results=")):
            kept.append(arg)
    return " ".join(["python benchmarks/tune_table.py", *kept])


def results_folder(gpu: str) -> str:
    """The folder of benchmarks/results/ a GPU's runs are kept in: its model, e.g. ``h200`` for "NVIDIA H200" and
    ``h100`` for "NVIDIA H100 80GB HBM3"."""
    words = gpu.split()
    return (words[1] if words[0] == "NVIDIA" and len(words) > 1 else words[0]).lower()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--classes", default=None, help="comma-separated DTYPE:BxTxD[:PRECISION] (default: the grids)")
    parser.add_argument("--reps", type=int, default=3, help="rounds of each candidate per class")
    parser.add_argument("--tie", type=float, default=0.01, help="keep the first candidate within this fraction")
    parser.add_argument("--calls", type=int, default=10, help="profiled calls per timing (their median)")
    parser.add_argument("--out", default=None, help="the module to write (default: kernels/tuned_sm<NN>.py)")
    parser.add_argument("--json", default=None, help="also write every timing here")
    parser.add_argument("--results", default=None,
                        help="where that JSON is kept in the repository, as the module's docstring names it (default: "
                             "benchmarks/results/<gpu>/tune/tune_table.json)")  # fmt: skip
    parser.add_argument("--first-candidates", type=int, default=None, metavar="CC",
                        help="no timing, no GPU: write the table of compute capability CC from the selector's first "
                             "candidates (an architecture that cannot be tuned here)")  # fmt: skip
    parser.add_argument("--sms", type=int, default=108, help="with --first-candidates: the SM count planned for")
    args = parser.parse_args(argv)
    if args.first_candidates is not None:
        write_first_candidates(args.first_candidates, args.sms, args.out)
        return
    if not torch.cuda.is_available():
        sys.exit("tune_table.py measures on a CUDA GPU")
    from lightning_attention.bench.machine import machine_info

    classes = [parse_class(c) for c in args.classes.split(",")] if args.classes else list(DEFAULT_CLASSES)
    major, minor = torch.cuda.get_device_capability()
    capability = major * 10 + minor
    info = machine_info("cuda")  # before the table changes the package's sources
    command = measuring_command(sys.argv[1:] if argv is None else argv)
    results = args.results or f"benchmarks/results/{results_folder(info['gpu'])}/tune/tune_table.json"
    out = pathlib.Path(args.out) if args.out else TABLE_FOLDER / f"tuned_sm{capability}.py"
    tables = []  # the table as written after each class

    def write(times: dict, candidates: dict) -> None:
        table = choose(times, candidates, args.tie)
        tables.append(table)
        provenance = (
            f"Measured on {gpu_line(info)}, the package of {info.get('git')} (source {info.get('source_sha256')}): "
            f"``{command}``, each candidate timed by its call's kernels, {len(table)} entries from {len(tables)} of "
            f"{len(classes)} shape classes; every timing in {results}."
        )
        out.write_text(render(table, provenance, title=f"Launch configurations measured on sm_{capability}"))
        if args.json:
            rows = [{"key": list(k), "candidate": list(c), "ms": v} for k, by in times.items() for c, v in by.items()]
            pathlib.Path(args.json).write_text(json.dumps(
                {"machine": info, "table": [[list(k), list(v)] for k, v in table.items()], "times": rows}, indent=1))

    measure(classes, args.reps, args.calls, after_class=write)
    table = tables[-1] if tables else {}
    print(f"wrote {out}: {len(table)} entries")
    pprint.pprint(table, width=200)


if __name__ == "__main__":
    main()
