"""Each kernel of one ``lightning_attn`` fwd+bwd held alone: its time per launch, the SM clock it settles at, the board
power and the energy per launch, so that a run under the power cap says which kernel draws what.

A call that holds the GPU long enough reaches the H200's 700 W cap, which lowers the SM clock, and a kernel bound by its
chain of products slows with it (docs/kernels.md, "The power cap"). Per shape (bf16, H = 16, TNL slopes) this runs the
forward and backward programs once, keeping every buffer, then repeats each launch of them back to back for
``--hold-s`` seconds after ``--idle-s`` seconds of idle, and reports over the window's second half: µs per launch
(CUDA events), the mean SM clock, the mean power draw and the share of power-capped samples
(``lightning_attention.bench.clocks``, nvidia-smi every 50 ms), and the energy per launch (power × time; the board's
power, so it includes the memory's and the idle SMs'). The whole fwd+bwd is held the same way at the end.

Repeating one launch repeats what it reads and writes: the scan, which works in place, then composes its own output,
whose values grow; the time of a launch does not depend on them.

    python benchmarks/energy_profile.py --shapes 8x8192,1x65536 --out energy.json
"""

import argparse
import functools
import time

import torch
from chunk_profile import call_programs, describe, launch_rows
from timed_calls import add_settings_option, make_problem, parse_shape, settings_changes, write_json

from lightning_attention import settings
from lightning_attention.bench import clocks
from lightning_attention.bench.timing import settle


def held(fn, sampler, hold_s: float, idle_s: float) -> dict:
    """``fn`` back to back for ``hold_s`` seconds after ``idle_s`` of idle; the second half of the window measured."""
    device = torch.device("cuda")
    time.sleep(idle_s)
    settle(fn, device, hold_s / 2)  # reach the clock the hold settles at
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.monotonic()
    begin.record()
    calls = settle(fn, device, hold_s / 2)
    end.record()
    end.synchronize()
    t1 = time.monotonic()
    us = begin.elapsed_time(end) * 1e3 / calls
    window = sampler.window(t0, t1) if sampler is not None else {}
    watts = window.get("watts_mean")
    return {"us": us, "calls": calls, **window, "mj_per_call": None if watts is None else watts * us * 1e-3}


def profile_shape(B: int, T: int, H: int, D: int, sampler, hold_s: float, idle_s: float) -> dict:
    problem = make_problem(B, T, H, D)
    for _ in range(3):  # compile, verify the direct launches, warm
        problem.fwd_bwd()
    programs = call_programs(problem)
    q, k, v, do, slope = problem.q.detach(), problem.k.detach(), problem.v.detach(), problem.do, problem.slope
    fwd_values = programs["fwd"].run_keeping_buffers(q, k, v, slope, None, None)
    states_slot = programs["fwd"].outputs[2]  # the segments' incoming states (None: an unsegmented plan)
    fwd_states = None if states_slot is None else fwd_values[states_slot]
    bwd_values = programs["bwd"].run_keeping_buffers(q, k, v, do, None, slope, None, None, fwd_states)
    rows = []
    for name, values in (("fwd", fwd_values), ("bwd", bwd_values)):
        program = programs[name]
        for launch, row in zip(program.launches, launch_rows(program), strict=True):
            timed = held(functools.partial(launch.run, values), sampler, hold_s, idle_s)
            rows.append({"pass": name, **row, **timed})
    whole = held(problem.fwd_bwd, sampler, hold_s, idle_s)
    return {"plan": programs["plan"], "launches": rows, "fwd_bwd": whole}


def line(what: str, r: dict) -> str:
    if r.get("watts_mean") is None:
        return f"  {r['us']:8.1f} us  {what}"
    clock = f"{r['sm_mhz_mean']:6.0f} MHz {r['watts_mean']:5.0f} W capped {r['capped_share']:4.0%}"
    return f"  {r['us']:8.1f} us  {clock} {r['mj_per_call']:7.3f} mJ  {what}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="8x8192,1x65536", help="BxT or BxTxD, comma-separated")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--hold-s", type=float, default=3.0, help="seconds each launch runs back to back")
    parser.add_argument("--idle-s", type=float, default=2.0, help="seconds of idle before each hold")
    add_settings_option(parser)
    parser.add_argument("--out", default=None, help="write the result as JSON to this file")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    device = torch.device("cuda")
    sampler = clocks.start(device)
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "settings": args.set,
              "limits": clocks.limits(device), "hold_s": args.hold_s, "idle_s": args.idle_s, "shapes": {}}  # fmt: skip
    try:
        with settings.override(**settings_changes(args.set)):
            for shape in args.shapes.split(","):
                B, T, D = parse_shape(shape)
                res = result["shapes"][shape] = profile_shape(B, T, args.heads, D, sampler, args.hold_s, args.idle_s)
                print(f"== {shape} (H = {args.heads}): plan {res['plan']}", flush=True)
                for r in res["launches"]:
                    print(line(f"{r['pass']} {describe(r)}", r), flush=True)
                print(line("the whole fwd+bwd", res["fwd_bwd"]), flush=True)
    finally:
        if sampler is not None:
            sampler.close()
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
