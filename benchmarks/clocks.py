"""Does a call's device time follow the GPU's SM clock, which the GPU lowers when it reaches its power cap?

Per shape (bf16, H = 16) and provider of ``lightning-attention bench kernels`` (``--providers``: ours, FLA; the same
inputs and calls as that benchmark), one process times the forward (and with ``--fwd-bwd`` the forward + backward)
in rounds: after ``--idle-s`` seconds of idle, ``--bursts`` measurements back to
back (``timed_calls.device_ms``, about 0.15 s each). ``nvidia-smi`` samples the GPU every 50 ms meanwhile (SM clock,
power draw, whether the software power cap is lowering the clock; ``lightning_attention.bench.clocks``, which
``bench kernels`` uses for every point) and every measurement gets the samples of its own window: the mean and
lowest SM clock, the mean power and the share of samples under the power cap. With
``--sustain-s`` each call then runs back to back for that long, as a training loop would, timed in blocks of about
0.1 s (CUDA events, no L2 flush).

A call whose time moves with the clock under the cap is bound by its arithmetic (a memory-bound call keeps its time:
the memory clock is not capped); its time on another GPU of the same model depends on where that GPU settles under
the cap. ``summary`` gives, per shape, provider and timer, the first measurement after idle and the bursts' median,
each with its clock, the time the call would take at the top clock if it scales with it, and the sustained run's
settled time. docs/kernels.md ("The power cap") cites what it found.

    python benchmarks/clocks.py --shapes 2x32768x256,2x32768x128,8x8192x64 --providers ours-chunk,fla --fwd-bwd \
        --out clocks.json
"""

import argparse
import statistics
import sys
import time

import torch
from timed_calls import device_ms, event_block, parse_shape, write_json

from lightning_attention.bench import clocks
from lightning_attention.bench.providers import GRID_HEADS, LIGHTNING_ATTN
from lightning_attention.bench.registry import Shape


def timers(provider: str, B: int, T: int, D: int, fwd_bwd: bool) -> dict:
    """The provider's forward (under no_grad) and, with ``fwd_bwd``, forward + backward (gradients cleared first) on
    the benchmark's inputs of one shape: ``{timer name: call}``."""
    shape = Shape(B, T, GRID_HEADS, D, D, torch.bfloat16)
    prepared = LIGHTNING_ATTN.providers[provider].prepare(LIGHTNING_ATTN.make_inputs(shape, torch.device("cuda"), 0))

    def fwd():
        with torch.no_grad():
            return prepared.run_forward()

    def fwd_and_bwd():
        for x in prepared.leaves:
            x.grad = None
        prepared.forward_backward()

    return {"fwd_ms": fwd, **({"fwd_bwd_ms": fwd_and_bwd} if fwd_bwd else {})}


def sustained(fn, seconds: float, sampler) -> list[dict]:
    """``fn`` called back to back for ``seconds``: per block of calls (about 0.1 s), the seconds since the start, the
    ms per call (CUDA events around the block) and the block's clock and power samples."""
    start, rows = time.monotonic(), []
    calls = 1
    while time.monotonic() - start < seconds:
        t0 = time.monotonic()
        ms, _ = event_block(fn, calls)
        rows.append({"second": round(t0 - start, 3), "ms": round(ms, 4), **sampler.window(t0, time.monotonic())})
        calls = max(1, round(100 / ms))
    return rows


def measure(shapes: list[str], providers: list[str], fwd_bwd: bool, rounds: int, bursts: int, idle_s: float,
            sampler, sustain_s: float = 0.0) -> list[dict]:  # fmt: skip
    """Rows of (shape, provider, timer, round, index in the round, ms, the window's clock and power); with
    ``sustain_s``, rows of the sustained run (round "sustained", index: the block)."""
    rows = []
    for shape in shapes:
        for provider in providers:
            for name, fn in timers(provider, *parse_shape(shape), fwd_bwd).items():
                fn()  # compiles and tunes before the first idle
                torch.cuda.synchronize()
                for r in range(rounds):
                    time.sleep(idle_s)
                    for i in range(bursts):
                        t0 = time.monotonic()
                        ms = device_ms(fn)
                        row = {"shape": shape, "provider": provider, "timer": name, "round": r, "index": i,
                               "ms": round(ms, 4)}  # fmt: skip
                        rows.append({**row, **sampler.window(t0, time.monotonic())})
                        print(rows[-1], flush=True)
                if sustain_s > 0:
                    time.sleep(idle_s)
                    for i, block in enumerate(sustained(fn, sustain_s, sampler)):
                        rows.append({"shape": shape, "provider": provider, "timer": name, "round": "sustained",
                                     "index": i, **block})  # fmt: skip
                    print(rows[-1], flush=True)
            torch.cuda.empty_cache()
    return rows


def summarise(rows: list[dict]) -> dict:
    """Per shape, provider and timer: the first measurement of each round (after idle) and the rest (bursts), each as
    the median time and mean clock; the time scaled to the top clock seen (``ms · MHz / top``, what a call bound by its
    arithmetic would take there), as the median and spread of the bursts; the spread of the rounds' raw times; and
    the sustained run's second half (median ms per call, mean clock, share capped) where there is one."""
    summary = {}
    top = max((r["sm_mhz_mean"] for r in rows if r.get("samples")), default=None)
    for key in dict.fromkeys((r["shape"], r["provider"], r["timer"]) for r in rows):
        of_call = [r for r in rows if (r["shape"], r["provider"], r["timer"]) == key and r.get("samples")]
        mine = [r for r in of_call if r["round"] != "sustained"]
        held = [r for r in of_call if r["round"] == "sustained"]
        entry = {}
        if mine:
            first = [r for r in mine if r["index"] == 0]
            rest = [r for r in mine if r["index"] > 0] or first
            scaled = [r["ms"] * r["sm_mhz_mean"] / top for r in rest]
            times = [r["ms"] for r in mine]
            entry = {
                "after_idle": {"ms": round(statistics.median(r["ms"] for r in first), 4),
                               "sm_mhz": round(statistics.fmean(r["sm_mhz_mean"] for r in first), 1)},
                "bursts": {"ms": round(statistics.median(r["ms"] for r in rest), 4),
                           "sm_mhz": round(statistics.fmean(r["sm_mhz_mean"] for r in rest), 1),
                           "capped_share": round(statistics.fmean(r["capped_share"] for r in rest), 3)},
                "at_top_clock_ms": round(statistics.median(scaled), 4),
                "at_top_clock_spread": round(max(scaled) / min(scaled) - 1, 4),
                "spread": round(max(times) / min(times) - 1, 4),
            }  # fmt: skip
        if held:  # its second half: where the clock has settled
            late = [r for r in held if r["second"] >= held[-1]["second"] / 2]
            entry["sustained"] = {
                "ms": round(statistics.median(r["ms"] for r in late), 4),
                "sm_mhz": round(statistics.fmean(r["sm_mhz_mean"] for r in late), 1),
                "capped_share": round(statistics.fmean(r["capped_share"] for r in late), 3),
                "seconds": held[-1]["second"],
            }
        if entry:
            summary[" ".join(key)] = entry
    return {"top_sm_mhz": top, "calls": summary}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="2x32768x256,2x32768x128,8x8192x64",
                        help="BxT or BxTxD (D = 128 unless given), comma-separated")  # fmt: skip
    parser.add_argument("--providers", default="ours-chunk", help=f"of {', '.join(LIGHTNING_ATTN.providers)}")
    parser.add_argument("--fwd-bwd", action="store_true", help="also time the forward + backward")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--bursts", type=int, default=8, help="measurements per round, back to back")
    parser.add_argument("--idle-s", type=float, default=5.0, help="idle before each round")
    parser.add_argument("--sustain-s", type=float, default=0.0, help="then each call back to back this long")
    parser.add_argument("--out", default=None, help="write the JSON here")
    args = parser.parse_args()
    if set(args.providers.split(",")) - set(LIGHTNING_ATTN.providers):
        parser.error(f"--providers: of {', '.join(LIGHTNING_ATTN.providers)}")
    sampler = clocks.start(torch.device("cuda")) if torch.cuda.is_available() else None
    if sampler is None:
        parser.error("needs a CUDA GPU and nvidia-smi")
    try:
        rows = measure(args.shapes.split(","), args.providers.split(","), args.fwd_bwd, args.rounds, args.bursts,
                       args.idle_s, sampler, args.sustain_s)  # fmt: skip
    finally:
        sampler.close()
    summary = summarise(rows)
    for call, row in summary["calls"].items():
        print(call, row, flush=True)

    from lightning_attention.bench.machine import machine_info, machine_line, source_digest

    write_json(args.out, {
        "machine_line": machine_line(machine_info(torch.device("cuda"))), "command": "python " + " ".join(sys.argv),
        "source": source_digest(), "limits": clocks.limits(torch.device("cuda")), "summary": summary, "rows": rows,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
