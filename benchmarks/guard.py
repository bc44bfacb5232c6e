"""Nothing lost: two versions of the package timed against each other in one GPU sitting, alternating, each point the
median of several runs under the same pinned configurations, and judged by one rule.

    mkdir -p .old && git archive <base> lightning_attention | tar x -C .old && git rev-parse <base> > .old/COMMIT
    python benchmarks/guard.py run --old .old --new . --reps 3 --out guard      # on the GPU machine: 4-7 min, H100
    python benchmarks/guard.py report guard                                        # the verdicts again, from the JSON
    python benchmarks/guard.py run --old .old --new . --dry-run                   # the planned processes (no GPU)

``run`` starts, for each repetition and each group of points, one process per package, old then new, so the two
measurements of a point are minutes apart at most: ``python3 -P benchmarks/guard.py measure --group G ...`` with
``PYTHONPATH=<package root>:<the inherited PYTHONPATH>``, no other ``LIGHTNING_ATTENTION_*`` variable and the
group's pin in ``LIGHTNING_ATTENTION_KERNEL_CONFIG``. ``-P`` keeps this folder off the front of ``sys.path``; the
process checks that ``lightning_attention`` came from the root it was given and records its file. The groups and
points are in ``guard_points.py``: grid (a) at K = V = 128 (T = 2K, 8K, 32K), 64 (8K) and 256 (4K) forward and
forward + backward, grid (b) at 128K, the host time per call of a small chunk forward and forward + backward, the
decode step at batch 1 and 64, and the TNL 40m training step's tokens/s (host-bound loops are timed by their
minimum within a process: ``guard_points.py`` says why). The Triton cache on disk is shared, so only the first
processes compile.

The host-time points and the K = 256 points form paired groups (``host``, ``k256``): each of their processes imports
both packages and interleaves their loops, the older one imported as ``lightning_attention_old`` from a copy under
``DIR/renamed/`` in which that name replaces ``lightning_attention`` (its modules, imports and op namespace). A
process that runs slow then slows both packages alike, and the point's ratio is the median of the per-process ratios
(``guard_points.py`` says why).

The rule (``report``, also run after every repetition): a point is launch-bound when, in either package, its host
time per call is above its device time; a launch-bound point passes when the new median is within 5% or 0.5 µs of
the old one, any other point when it is within 3% (slower by more fails; faster always passes). The verdict is PASS
when every point passes with at least ``--reps`` runs of each package, INCOMPLETE when a point lacks runs, else
FAIL. ``DIR/guard.json`` holds every run's raw numbers, the medians, the verdicts, the machine, the versions and
each package's commit (``--old-commit`` / ``--new-commit``, else a ``COMMIT`` file at the package root, else git);
``DIR/guard.md`` is the table.
"""

import argparse
import json
import os
import pathlib
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.append(str(HERE))  # appended, never first: this folder holds no package that could shadow the measured one

from guard_points import OLD_PACKAGE, PAIRED_GROUPS, PINS, POINTS  # noqa: E402 - after the sys.path entry above

PIN_VARIABLE = "LIGHTNING_ATTENTION_KERNEL_CONFIG"
DEVICE_TOLERANCE, LAUNCH_TOLERANCE, LAUNCH_ABSOLUTE_US = 0.03, 0.05, 0.5
# the estimate printed before a run (H100): a package's kernels compile once (the cache is shared by its processes),
# then a process takes about PROCESS_S; the budget check's guess for a group not timed yet is FIRST_GUESS_S
COMPILE_S, PROCESS_S, FIRST_GUESS_S = 90.0, 10.0, 60.0


# ---------------------------------------------------------------------------------------------------- measure


def measure(args) -> int:
    """One group in this process (``run`` starts it); writes ``args.out``."""
    import torch

    if not torch.cuda.is_available():
        print("guard measure: needs a CUDA GPU (it times kernels; nothing was measured)", file=sys.stderr)
        return 2
    import importlib

    import triton
    from guard_points import measure_group, measure_pair

    import lightning_attention as la

    paired = args.group in PAIRED_GROUPS
    expected = [("lightning_attention", args.expect_root)] + ([(OLD_PACKAGE, args.expect_old_root)] if paired else [])
    files = {}
    for name, root in expected:
        files[name] = pathlib.Path(importlib.import_module(name).__file__).resolve()
        if root and not files[name].is_relative_to(pathlib.Path(root).resolve()):
            print(f"guard measure: imported {files[name]}, not the package under {root}", file=sys.stderr)
            return 3
    t0 = time.perf_counter()
    values = measure_pair(args.group) if paired else measure_group(args.group)
    doc = {
        "group": args.group, "label": "pair" if paired else args.label, "rep": args.rep,
        "pin": os.environ.get(PIN_VARIABLE),
        "package": {"file": str(files["lightning_attention"]), "version": getattr(la, "__version__", None),
                    **({"old_file": str(files[OLD_PACKAGE])} if paired else {})},
        "machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                    "cuda": torch.version.cuda, "python": platform.python_version()},
        "points": values, "elapsed_s": time.perf_counter() - t0,
    }  # fmt: skip
    pathlib.Path(args.out).write_text(json.dumps(doc, indent=1))
    sides = values if paired else {args.label: values}
    print(json.dumps({label: {name: round(v["value"], 4) for name, v in side.items()}
                      for label, side in sides.items()}), flush=True)  # fmt: skip
    return 0


# ---------------------------------------------------------------------------------------------------- run


def _package(root: str) -> pathlib.Path:
    path = pathlib.Path(root).resolve()
    if not (path / "lightning_attention" / "__init__.py").is_file():
        raise SystemExit(f"guard run: {root} holds no lightning_attention package")
    return path


def _commit(root: pathlib.Path, given: str | None) -> str | None:
    """The commit a package root holds: as given, its COMMIT file, or git when the root is a checkout's top."""
    if given:
        return given
    if (root / "COMMIT").is_file():
        return (root / "COMMIT").read_text().strip()
    if (root / ".git").exists() and shutil.which("git"):
        git = ["git", "-C", str(root)]
        proc = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
        if proc.returncode == 0:
            changed = subprocess.run([*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                     text=True, check=False).stdout.strip()  # fmt: skip
            return proc.stdout.strip() + ("+modified" if changed else "")
    return None


def _gpu_line() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    proc = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    return proc.stdout.strip().splitlines()[0] if proc.returncode == 0 and proc.stdout.strip() else None


def renamed_copy(old_root: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """The package under ``old_root`` copied to ``dest/lightning_attention_old``, that name written for
    ``lightning_attention`` in every Python file (modules, imports, the torch.library op namespace; the upper-case
    ``LIGHTNING_ATTENTION_*`` settings stay), so that a process can import it beside the new one; returns ``dest``."""
    target = dest / OLD_PACKAGE
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(old_root / "lightning_attention", target, ignore=shutil.ignore_patterns("__pycache__"))
    for file in target.rglob("*.py"):
        file.write_text(re.sub(r"\blightning_attention\b", OLD_PACKAGE, file.read_text()))
    return dest


def plan_processes(roots: dict[str, pathlib.Path], reps: int, groups: list[str], out: pathlib.Path) -> list[dict]:
    """The processes of a run, in order: for each repetition and group, the old package then the new one, or, for a
    paired group, one process importing both (the old one from ``out/renamed``, which :func:`renamed_copy` fills)."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    # the inherited path without either package root: only the root put first decides which package is imported
    baseline = [p for p in inherited if pathlib.Path(p).resolve() not in roots.values()]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_ATTENTION_")}
    renamed = out / "renamed"
    processes = []
    for rep in range(1, reps + 1):
        for group in groups:
            for label in ("pair",) if group in PAIRED_GROUPS else ("old", "new"):
                root = roots["new" if label == "pair" else label]
                file = out / "raw" / f"{label}-{group}-rep{rep}.json"
                cmd = [sys.executable, "-P", str(HERE / "guard.py"), "measure", "--group", group, "--label", label,
                       "--rep", str(rep), "--expect-root", str(root), "--out", str(file)]  # fmt: skip
                path = [str(root), *baseline]
                if label == "pair":
                    cmd[-2:-2] = ["--expect-old-root", str(renamed)]
                    path.insert(1, str(renamed))
                env = {**clean, "PYTHONPATH": os.pathsep.join(path)}
                if PINS[group] is not None:
                    env[PIN_VARIABLE] = PINS[group]
                processes.append({"rep": rep, "group": group, "label": label, "cmd": cmd, "env": env, "file": file})
    return processes


def run(args) -> int:
    roots = {"old": _package(args.old), "new": _package(args.new)}
    groups = args.groups.split(",")
    unknown = [g for g in groups if g not in PINS]
    if unknown:
        raise SystemExit(f"guard run: unknown groups {unknown}; groups are {sorted(PINS)}")
    out = pathlib.Path(args.out)
    processes = plan_processes(roots, args.reps, groups, out)
    per_rep = len(processes) // args.reps
    warm = len(processes) * PROCESS_S
    paired = [g for g in groups if g in PAIRED_GROUPS]
    shape = f"{len(groups) - len(paired)} groups x 2 packages" + (f" + {len(paired)} paired" if paired else "")
    print(f"guard: {len(processes)} processes ({args.reps} repetitions x ({shape})); about "
          f"{(warm + 2 * COMPILE_S) / 60:.0f} min with a cold Triton cache, {warm / 60:.0f} min with a warm one",
          flush=True)  # fmt: skip
    if args.dry_run:
        for p in processes:
            shown = {k: p["env"][k] for k in ("PYTHONPATH", PIN_VARIABLE) if k in p["env"]}
            print(" ".join([*(f"{k}={v}" for k, v in shown.items()), *p["cmd"]]))
        return 0
    (out / "raw").mkdir(parents=True, exist_ok=True)
    plan = {
        "gpu": _gpu_line(), "reps": args.reps, "groups": groups, "pins": {g: PINS[g] for g in groups},
        "packages": {label: {"root": str(root), "commit": _commit(root, getattr(args, f"{label}_commit"))}
                     for label, root in roots.items()},
        "budget_s": args.budget_s, "stopped": None,
    }  # fmt: skip
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    if paired:
        renamed_copy(roots["old"], out / "renamed")
    start, durations = time.perf_counter(), {}
    for i, p in enumerate(processes, 1):
        elapsed = time.perf_counter() - start
        expected = statistics.median(durations[p["group"]]) if p["group"] in durations else FIRST_GUESS_S
        if args.budget_s and elapsed + expected > args.budget_s:
            plan["stopped"] = f"budget: {elapsed:.0f} s spent, the next process would take about {expected:.0f} s"
            print(f"guard: stopping before process {i} of {len(processes)} ({plan['stopped']})", flush=True)
            break
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(p["cmd"], env=p["env"], capture_output=True, text=True, timeout=args.timeout_s,
                                  check=False)  # fmt: skip
            status = f"rc={proc.returncode}"
            if proc.returncode != 0:
                print(proc.stdout[-2000:] + proc.stderr[-4000:], flush=True)
        except subprocess.TimeoutExpired:
            status = f"timed out after {args.timeout_s} s"
            print(f"guard: {p['label']} {p['group']} rep {p['rep']} {status}", flush=True)
        took = time.perf_counter() - t0
        durations.setdefault(p["group"], []).append(took)
        left = sum(statistics.median(durations.get(q["group"], [took])) for q in processes[i:])
        print(f"[{i}/{len(processes)}] rep {p['rep']} {p['group']:6s} {p['label']}: {status} in {took:.1f} s; "
              f"{time.perf_counter() - start:.0f} s so far, about {left:.0f} s left", flush=True)  # fmt: skip
        if i % per_rep == 0:  # a repetition is complete: the report so far, should the call be cut short
            report_folder(out, quiet=True)
    (out / "plan.json").write_text(json.dumps(plan, indent=1))
    return report_folder(out)


# ---------------------------------------------------------------------------------------------------- report


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def judge(point, old: dict, new: dict, ratio: float | None = None) -> dict:
    """The verdict of one point from each package's medians (``value``, ``device``, ``host``; None: not measured);
    ``ratio``: new ÷ old where it is not the ratio of the medians (a paired point: the median of its processes')."""
    if old["value"] is None or new["value"] is None:
        return {"bound": None, "change": None, "verdict": "MISSING"}
    launch = any(m["host"] is not None and m["device"] is not None and m["host"] > m["device"] for m in (old, new))
    # change > 0: the new package is slower (a longer time, or fewer tokens per second)
    ratio = new["value"] / old["value"] if ratio is None else ratio
    change = 1 / ratio - 1 if point.higher_is_better else ratio - 1
    if launch:
        scale_us = {"ms": 1e3, "us": 1.0}.get(point.unit)
        slower_us = None if scale_us is None else (ratio - 1) * old["value"] * scale_us
        ok = change <= LAUNCH_TOLERANCE or (slower_us is not None and slower_us <= LAUNCH_ABSOLUTE_US)
    else:
        ok = change <= DEVICE_TOLERANCE
    return {"bound": "launch" if launch else "device", "ratio": ratio, "change": change,
            "verdict": "PASS" if ok else "FAIL"}  # fmt: skip


def summarize(raw: list[dict], reps: int) -> dict:
    """Per point, each package's runs and medians and the verdict; the overall verdict."""
    points, verdicts = [], []
    for point in POINTS:
        side, paired = {}, point.group in PAIRED_GROUPS
        for label in ("old", "new"):
            if paired:  # a paired process's file holds both packages: {"old": {point: ...}, "new": {...}}
                runs = [doc["points"][label][point.name] for doc in raw
                        if doc["label"] == "pair" and point.name in doc["points"].get(label, {})]  # fmt: skip
            else:
                runs = [
                    doc["points"][point.name] for doc in raw if doc["label"] == label and point.name in doc["points"]
                ]
            medians = {key: _median([r[key] for r in runs]) for key in ("value", "device", "host")}
            side[label] = {"runs": runs, **medians}
        ratios = None
        if paired:
            ratios = [n["value"] / o["value"] for o, n in zip(side["old"]["runs"], side["new"]["runs"])
                      if o["value"] and n["value"] is not None]  # fmt: skip
        verdict = judge(point, side["old"], side["new"], _median(ratios) if ratios else None)
        if paired:
            verdict["process_ratios"] = ratios
        short = min(len(side["old"]["runs"]), len(side["new"]["runs"])) < reps
        verdicts.append("INCOMPLETE" if verdict["verdict"] in ("MISSING", "PASS") and short else verdict["verdict"])
        points.append({"name": point.name, "group": point.group, "what": point.what, "unit": point.unit,
                       "higher_is_better": point.higher_is_better, **side, **verdict})  # fmt: skip
    overall = "FAIL" if "FAIL" in verdicts else "INCOMPLETE" if "INCOMPLETE" in verdicts else "PASS"
    return {"verdict": overall, "points": points}


def _num(x) -> str:
    return "-" if x is None else f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def markdown(result: dict) -> str:
    machine, packages = result.get("machine") or {}, result.get("packages") or {}
    gpu = f"GPU: {result.get('gpu') or machine.get('gpu')}; torch {machine.get('torch')}"
    gpu += f", triton {machine.get('triton')}"
    commits = {label: packages.get(label, {}).get("commit") or "?" for label in ("old", "new")}
    sitting = (f"{gpu}, CUDA {machine.get('cuda')}. Old: {commits['old']}, new: {commits['new']}. Medians of "
               f"{result['reps']} runs each, the packages alternating; a paired point's packages share each process "
               f"(their loops interleaved), and its ratio is the median of the processes' ratios.")  # fmt: skip
    rule = ("Rule: a launch-bound point (host time per call above the device time, in either package) passes within "
            "5% or 0.5 µs of the old median, any other within 3%.")  # fmt: skip
    lines = [
        f"# Guard: {result['verdict']}",
        "",
        sitting,
        "",
        rule,
        "",
        "| point | unit | old | new | new ÷ old | bound (host / device, new) | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in result["points"]:
        ratio = "-" if p.get("ratio") is None else f"{p['ratio']:.3f}"
        bound = f"{p['bound'] or '-'} ({_num(p['new']['host'])} / {_num(p['new']['device'])})"
        runs = f"{len(p['old']['runs'])}/{len(p['new']['runs'])} runs"
        if p.get("process_ratios"):
            runs = f"{len(p['process_ratios'])} paired runs: " + ", ".join(f"{r:.3f}" for r in p["process_ratios"])
        lines.append(f"| {p['name']}: {p['what']} | {p['unit']} | {_num(p['old']['value'])} | "
                     f"{_num(p['new']['value'])} | {ratio} | {bound} | {p['verdict']} ({runs}) |")  # fmt: skip
    if result.get("stopped"):
        lines += ["", f"Stopped early: {result['stopped']}."]
    return "\n".join(lines) + "\n"


def report_folder(folder: pathlib.Path, quiet: bool = False) -> int:
    """Writes ``guard.json`` and ``guard.md`` of a run folder; 0 when the verdict is PASS, else 1."""
    folder = pathlib.Path(folder)
    plan_file = folder / "plan.json"
    plan = json.loads(plan_file.read_text()) if plan_file.is_file() else {}
    raw = [json.loads(f.read_text()) for f in sorted((folder / "raw").glob("*.json"))]
    reps = plan.get("reps", 3)
    result = {**summarize(raw, reps), "reps": reps, "gpu": plan.get("gpu"), "stopped": plan.get("stopped"),
              "machine": raw[0]["machine"] if raw else None, "packages": plan.get("packages", {}),
              "imported": sorted({f"{d['label']}: {d['package']['file']}" for d in raw}
                                 | {f"pair, old: {d['package']['old_file']}"
                                    for d in raw if "old_file" in d["package"]}),
              "runs": raw}  # fmt: skip
    (folder / "guard.json").write_text(json.dumps(result, indent=1))
    text = markdown(result)
    (folder / "guard.md").write_text(text)
    if not quiet:
        print(text, end="", flush=True)
    return 0 if result["verdict"] == "PASS" else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="measure both packages, alternating, and report")
    p.add_argument("--old", required=True, help="root of the package to compare against (holds lightning_attention/)")
    p.add_argument("--new", required=True, help="root of the package under test")
    p.add_argument("--reps", type=int, default=3, help="runs of each group per package (the medians' count)")
    p.add_argument("--groups", default=",".join(PINS), help=f"comma-separated, of {','.join(PINS)}")
    p.add_argument("--out", default="guard", help="folder for raw/, plan.json, guard.json, guard.md")
    p.add_argument("--timeout-s", type=int, default=300, help="time limit of one process (its compiles included)")
    p.add_argument("--budget-s", type=float, default=0, help="start no process that would end after this (0: none)")
    p.add_argument("--old-commit", default=None, help="the commit of --old, when its root cannot say")
    p.add_argument("--new-commit", default=None, help="the commit of --new, when its root cannot say")
    p.add_argument("--dry-run", action="store_true", help="print the planned processes and exit")
    p = sub.add_parser("report", help="guard.json and guard.md of a run folder (exit 0 when PASS)")
    p.add_argument("folder")
    p = sub.add_parser("measure", help="one group in this process (run starts these; needs a GPU)")
    p.add_argument("--group", required=True, choices=sorted(PINS))
    p.add_argument("--out", required=True)
    p.add_argument("--label", default="new", choices=("old", "new", "pair"), help="pair: a paired group's process")
    p.add_argument("--rep", type=int, default=1)
    p.add_argument("--expect-root", default=None, help="refuse unless lightning_attention is imported from here")
    p.add_argument("--expect-old-root", default=None, help=f"paired groups: refuse unless {OLD_PACKAGE} is from here")
    args = parser.parse_args(argv)
    if args.command == "measure":
        return measure(args)
    if args.command == "report":
        return report_folder(pathlib.Path(args.folder))
    return run(args)


if __name__ == "__main__":
    raise SystemExit(main())
