"""``lightning-attention bench serving``: HF ``generate()`` of TNL against LLaMA at equal size, per batch and prompt.

Both architectures at one preset (``--preset``, default ``40m``: TNL and transformers' own ``LlamaForCausalLM`` with
SDPA attention, byte vocabulary), bf16 weights on CUDA, run through plain ``model.generate()`` (no compile); TNL
twice, with eager decode steps (``tnl``) and with each decode step a CUDA-graph replay (``tnl-graphs``,
``config.decode_cuda_graphs``). For every (arch, batch, prompt length) point — batches ``--batches`` (default 1,
64), random prompts of ``--prompts`` tokens (default 1,024 and 32,768) — one warm-up request, then ``--repeats``
times (default 3) the prefill alone (time to first token) and a whole greedy request of exactly ``--new-tokens``
tokens (default 128) are timed by ``lightning_attention/bench/serving_timing.py``, which defines every number
recorded (the minimum over the repeats).

Out of memory is a result, not a crash: the point is recorded with ``"oom": true`` and ``stage`` (the call that ran
out: warm-up, prefill or generate, keeping what was measured before it), cached memory is released and the run goes
on — where LLaMA's growing KV cache stops fitting is part of the answer. Other failures are recorded the same way
with ``"status": "error"``.

Output: ``serving.json`` (``models``: per arch its parameters, dtype, attention; ``points``: one record per point,
in the order run), a table per point, a table of decode tokens/s per prompt length side by side for each (arch,
batch) — TNL's should stay flat as the prompt grows, LLaMA's fall — and figures ``serving_decode.png`` (decode
tokens/s against prompt length) and ``serving_memory.png`` (cache after generation and peak memory).
"""

import pathlib

import torch

from lightning_attention.bench.progress import progress, write
from lightning_attention.bench.results import ResultWriter, format_table, load_plots, num
from lightning_attention.bench.serving_timing import build_model, model_dtype, time_point
from lightning_attention.bench.timing import record_failure, release
from lightning_attention.utils.dtypes import dtype_name

PRESET = "40m"
BATCHES = (1, 64)
PROMPTS = (1024, 32768)
NEW_TOKENS = 128
REPEATS = 3
QUICK = {"preset": "smoke", "batches": (1, 2), "prompts": (16, 64), "new_tokens": 8}
POINT_COLUMNS = ("arch", "batch", "prompt", "status", "TTFT ms", "total s", "decode tok/s", "tok/s", "peak GiB",
                 "cache MiB")


def run(args, device: torch.device, writer: ResultWriter, out: pathlib.Path) -> dict:
    preset = args.preset or (QUICK["preset"] if args.quick else PRESET)
    batches = sorted(args.batches or (QUICK["batches"] if args.quick else BATCHES))
    prompts = sorted(args.prompts or (QUICK["prompts"] if args.quick else PROMPTS))  # largest last: OOM comes last
    new_tokens = args.new_tokens or (QUICK["new_tokens"] if args.quick else NEW_TOKENS)
    repeats = args.repeats or REPEATS
    writer.set("serving", {"preset": preset, "batches": batches, "prompts": prompts, "new_tokens": new_tokens,
                           "repeats": repeats, "dtype": dtype_name(model_dtype(device)),
                           "decoding": "greedy"})
    models = {}
    with progress(total=len(args.archs) * len(batches) * len(prompts), desc="serving", unit="point") as bar:
        for arch in args.archs:
            model, models[arch] = build_model(arch, preset, device, seed=args.seed)
            writer.set("models", models)
            for batch in batches:
                for prompt in prompts:
                    bar.set_postfix_str(f"{arch} batch {batch} prompt {prompt}")
                    record = measure(model, arch, batch, prompt, new_tokens, device, repeats, args.seed)
                    writer.add("points", record)
                    write(_point_line(record))
                    bar.update()
            del model  # the next arch starts from an empty allocator
            release(device)
    figures = report(writer.doc, out, writer)
    points = writer.doc.get("points", [])
    return {"figures": figures, "points": len(points),
            "oom": [f"{r['arch']} batch {r['batch']} prompt {r['prompt']}" for r in points if r["oom"]],
            "errors": sum(r["status"] == "error" for r in points)}


def measure(model, arch: str, batch: int, prompt: int, new_tokens: int, device: torch.device, repeats: int,
            seed: int) -> dict:
    """One point's record: what :func:`serving_timing.time_point` measured and ``"status": "ok"``, or the failure as
    :func:`timing.record_failure` records it (``"oom"`` or ``"error"``, with what was measured before it); ``oom``
    says which. Cached device memory is released either way, so the next point starts clean."""
    record = {"arch": arch, "batch": batch, "prompt": prompt, "new_tokens": new_tokens}
    try:
        time_point(model, batch, prompt, new_tokens, device=device, record=record, repeats=repeats, seed=seed)
        record["status"] = "ok"
    except Exception as exc:  # noqa: BLE001 - out of memory is a result; the run goes on
        record_failure(record, exc)
    finally:
        release(device)
    record["oom"] = record["status"] == "oom"
    return record


def _point_line(r: dict) -> str:
    where = f"{r['arch']} batch {r['batch']} prompt {r['prompt']}"
    if r["status"] != "ok":
        return f"{where}: {r['status'].upper()} in {r.get('stage')} ({r.get('error')})"
    return (f"{where}: first token {r['prefill_s'] * 1e3:,.1f} ms, {r['new_tokens']} tokens in {r['total_s']:.2f} s, "
            f"decode {r['decode_tokens_per_s']:,.0f} tokens/s, cache {r['cache_bytes'] / 2**20:,.2f} MiB")


def _scaled(value, scale: float):
    return None if value is None else value * scale


def point_rows(points: list[dict]) -> list[list[str]]:
    """The per-point table's rows (:data:`POINT_COLUMNS`); a failed point keeps what it measured before failing."""
    rows = []
    for r in points:
        rows.append([r["arch"], str(r["batch"]), str(r["prompt"]), r["status"], num(_scaled(r.get("prefill_s"), 1e3)),
                     num(r.get("total_s")), num(r.get("decode_tokens_per_s")), num(r.get("tokens_per_s")),
                     num(_scaled(r.get("peak_bytes"), 2**-30)), num(_scaled(r.get("cache_bytes"), 2**-20))])
    return rows


def flatness_rows(points: list[dict]) -> tuple[list[str], list[list[str]]]:
    """Decode tokens/s of each (arch, batch) at every prompt length side by side, and longest ÷ shortest prompt
    (1.0 = as fast with the long prompt as with the short one). A failed point shows its status in upper case."""
    prompts = sorted({r["prompt"] for r in points})
    cells: dict[tuple[str, int], dict[int, dict]] = {}
    for r in points:
        cells.setdefault((r["arch"], r["batch"]), {})[r["prompt"]] = r
    headers = ["arch", "batch", *(f"decode tok/s @ {p}" for p in prompts), f"{prompts[-1]} ÷ {prompts[0]}"]
    rows = []
    for (arch, batch), by_prompt in cells.items():
        row = [arch, str(batch)]
        for p in prompts:
            r = by_prompt.get(p)
            row.append("-" if r is None else num(r.get("decode_tokens_per_s")) if r["status"] == "ok"
                       else r["status"].upper())
        first, last = (by_prompt.get(p, {}).get("decode_tokens_per_s") for p in (prompts[0], prompts[-1]))
        row.append(num(last / first) if first and last and len(prompts) > 1 else "-")
        rows.append(row)
    return headers, rows


def report(doc: dict, out: pathlib.Path, writer: ResultWriter | None = None) -> list[str]:
    """Tables and figures from a serving JSON document (a fresh run, or ``--replot`` of a saved one)."""
    points = doc.get("points", [])
    setup = doc.get("serving", {})
    if points:
        print(f"serving: preset {setup.get('preset')}, {setup.get('dtype')}, {setup.get('new_tokens')} new tokens "
              "per request, greedy; TTFT = prefill alone; peak = torch.cuda.max_memory_allocated (CUDA only)")
        print(format_table(list(POINT_COLUMNS), point_rows(points)))
        print(format_table(*flatness_rows(points)))

    plots = load_plots(doc, writer)
    if plots is None:
        return []
    line = doc["machine_line"]
    decode_path, memory_path = out / "serving_decode.png", out / "serving_memory.png"
    if not points:
        figures = [plots.placeholder(path, title, "no point was measured", line)
                   for path, title in ((decode_path, "serving decode"), (memory_path, "serving memory"))]
    else:
        decode: dict[str, list] = {}
        memory: dict[str, list] = {}
        for r in points:
            failed = [str(x["prompt"]) for x in points
                      if (x["arch"], x["batch"]) == (r["arch"], r["batch"]) and x["status"] != "ok"]
            name = f"{r['arch']}, batch {r['batch']}" + (f" (failed at prompt {', '.join(failed)})" if failed else "")
            ok = r["status"] == "ok"
            decode.setdefault(name, []).append((r["prompt"], r.get("decode_tokens_per_s") if ok else None))
            memory.setdefault(f"{name}: cache", []).append((r["prompt"], _scaled(r.get("cache_bytes"), 2**-20)))
            if r.get("peak_bytes") is not None:
                memory.setdefault(f"{name}: peak", []).append((r["prompt"], r["peak_bytes"] * 2**-20))
        title = f"{setup.get('preset')} preset, {setup.get('new_tokens')} new tokens, {setup.get('dtype')}"
        figures = [
            plots.xy_lines(decode, "prompt length (tokens)", "decode tokens / s (all rows)", decode_path,
                           f"HF generate() decode throughput, {title}", line, logx=True, logy=True),
            plots.xy_lines(memory, "prompt length (tokens)", "MiB", memory_path,
                           f"cache after generation and peak memory, {title}", line, logx=True, logy=True),
        ]
    names = [p.name for p in figures]
    if writer is not None:
        writer.set("figures", names)
    return names
