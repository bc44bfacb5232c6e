"""Where results go: a JSON document rewritten after every measurement, printed tables (plain and markdown), the final
JSON line.

Writing after every record means a run that dies half-way (a CUDA fault, the time limit) still leaves everything
measured so far under ``--out``.
"""

import json
import math
import os
import pathlib
import sys


class ResultWriter:
    """A JSON document ``{"bench", "machine", "machine_line", "config", <sections>...}`` kept in sync on disk."""

    def __init__(self, path: pathlib.Path, bench: str, machine: dict, machine_line: str, config: dict):
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.doc = {"bench": bench, "machine_line": machine_line, "machine": machine, "config": config, "skipped": []}
        self.flush()

    def set(self, key: str, value) -> None:
        self.doc[key] = value
        self.flush()

    def add(self, section: str, record: dict) -> None:
        self.doc.setdefault(section, []).append(record)
        self.flush()

    def skip(self, what: str, reason: str) -> None:
        """Record (and say) that a part of the run did not happen and why."""
        self.doc["skipped"].append({"what": what, "reason": reason})
        print(f"skipped {what}: {reason}", flush=True)
        self.flush()

    def flush(self) -> None:
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(clean(self.doc), indent=1, default=_json_default, allow_nan=False) + "\n")
        os.replace(tmp, self.path)  # atomic: a reader never sees half a file


def _json_default(x):
    if hasattr(x, "to_json"):
        return x.to_json()
    if isinstance(x, pathlib.Path):
        return str(x)
    return str(x)


def clean(value):
    """JSON has no NaN/inf: map them to None (recursively)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def fmt(value, spec: str = ".3g") -> str:
    """A table cell: numbers formatted, None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)


def num(x, digits: int = 3) -> str:
    """A number for a markdown table: 3 significant digits, whole numbers from 100 up (1,185, not 1.18e+03); '-' for
    None."""
    if x is None:
        return "-"
    x = float(x)
    if x == 0:
        return "0"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:#.{digits}g}"


def times(x) -> str:
    """A ratio: ``2.04×``; '-' for None."""
    return "-" if x is None else f"{x:.2f}×"


def sci(x) -> str:
    """An error: ``2.65e-03``; '-' for None."""
    return "-" if x is None else f"{x:.2e}"


def md_table(headers: list[str], rows: list[list[str]]) -> str:
    """A markdown table (the recorded tables of ``docs/performance.md``)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain-text table with right-aligned columns (what a benchmark prints as it runs)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.rjust(w) for h, w in zip(headers, widths))
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(out)


def print_final_line(summary: dict) -> None:
    """The last line of stdout: one JSON object a script can parse with ``tail -n 1``."""
    sys.stdout.flush()
    print(json.dumps(clean(summary), default=_json_default, separators=(",", ":")), flush=True)


def load_plots(doc: dict, writer: "ResultWriter | None"):
    """The plotting module, or None (recorded as a skip) when matplotlib is missing: the JSON is the result, and
    ``lightning-attention bench <name> --replot DIR`` renders the figures later on a machine that has matplotlib."""
    try:
        from lightning_attention.bench import plots
    except ImportError as exc:
        folder = doc.get("config", {}).get("out", "DIR")
        reason = f"matplotlib is not installed ({exc}); render them later with --replot {folder}"
        if writer is not None:
            writer.skip("figures", reason)
        else:
            print(f"skipped figures: {reason}")
        return None
    return plots
