"""Host time of plain fwd+bwd calls, an older version of the package against this one, interleaved in one process.

On a shared host a process can run 1.5x slower than the next one of the same code, so two packages timed in
separate processes compare their processes more than their code. Here each process imports both (the older one as
``lightning_attention_old``, from the renamed copy ``guard.py`` makes of ``--old``) and, per shape, alternates
their loops (old, new, then new, old, ...) on the same shapes (``timed_calls.make_problem``, bf16, H = 16):

- ``host``: host µs to enqueue one fwd+bwd (``timed_calls.host_ms``, 40 calls a loop), the backward on the
  autograd engine's device thread as in a training loop;
- ``host_one_thread``: the same with ``torch.autograd.set_multithreading_enabled(False)`` (the backward on the
  calling thread);
- ``device``: ``do_bench`` µs of the call (what the kernels benchmark reports).

Each value is the median over the loops of a process; ``summary`` holds the median over ``--processes`` processes,
and ``runs`` every process's numbers.

    mkdir -p .old && git archive <commit> lightning_attention | tar x -C .old
    python benchmarks/host_pair.py --old .old --shapes 64x1024x64,8x8192x64 --out host_pair.json
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile

from guard import renamed_copy
from guard_points import OLD_PACKAGE, _interleaved
from timed_calls import child_runs, parse_shape, write_json

LABELS = ("old", "new")


def _measure(shapes: list[str], rounds: int) -> dict:
    """{shape: {"old" | "new": {"host" | "host_one_thread" | "device": median µs}}} in this process."""
    import importlib

    import torch
    from timed_calls import device_ms, host_ms, make_problem

    import lightning_attention

    packages = {"old": importlib.import_module(OLD_PACKAGE), "new": lightning_attention}
    out = {}
    for shape in shapes:
        B, T, D = parse_shape(shape)
        calls = {label: make_problem(B, T, 16, D, package=p).fwd_bwd for label, p in packages.items()}
        for fn in calls.values():
            for _ in range(3):  # compile, verify the launchers, settle the allocator
                fn()
        torch.cuda.synchronize()
        host = lambda fn: host_ms(fn, calls=40, loops=1) * 1e3  # noqa: E731
        timed = {"host": _interleaved(calls, rounds, host)}
        with torch.autograd.set_multithreading_enabled(False):
            timed["host_one_thread"] = _interleaved(calls, rounds, host)
        timed["device"] = _interleaved(calls, max(2, rounds // 3), lambda fn: device_ms(fn, warmup=10, rep=60) * 1e3)
        out[shape] = {label: {k: statistics.median(t[label]) for k, t in timed.items()} for label in LABELS}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default=".old", help="root holding the older package (lightning_attention/)")
    parser.add_argument("--shapes", default="64x1024x64,8x8192x64,4x16384x64,2x32768x64,1x1024",
                        help="BxT or BxTxD (D = 128 unless given), comma-separated")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=10, help="loops of each package per shape and timer")
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--out", default=None, help="write the JSON here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # one process's measurement
    args = parser.parse_args()
    shapes = args.shapes.split(",")
    if args.child:
        print(json.dumps(_measure(shapes, args.rounds)))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        renamed = renamed_copy(pathlib.Path(args.old), pathlib.Path(tmp))
        path = os.pathsep.join([str(renamed), os.environ.get("PYTHONPATH", "")])
        runs = child_runs(__file__, ["--shapes", args.shapes, "--rounds", str(args.rounds)], args.processes,
                          env={**os.environ, "PYTHONPATH": path})  # fmt: skip
    summary = {
        shape: {
            label: {k: round(statistics.median(run[shape][label][k] for run in runs), 1) for k in runs[0][shape][label]}
            for label in LABELS
        }
        for shape in shapes
    }
    for shape, row in summary.items():
        print(shape, json.dumps(row), flush=True)
    import torch

    from lightning_attention.bench.machine import machine_info, machine_line, source_digest

    info = machine_info(torch.device("cuda"))
    write_json(args.out, {
        "machine_line": machine_line(info), "command": "python " + " ".join(sys.argv),
        "old": {"root": args.old, "source": source_digest(pathlib.Path(args.old) / "lightning_attention")},
        "new": {"source": source_digest()}, "shapes": shapes, "summary": summary, "runs": runs,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
