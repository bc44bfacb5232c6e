"""The problem the kernel timing scripts share (``chunk_timing``, ``chunk_sweep``, ``chunk_profile``,
``host_overhead``, ``host_profile``): bf16 q, k, v ``[B, T, H, D]`` that require grad, an upstream gradient, TNL
slopes (layers 0 of 12), and the two calls that get timed. Scripts import it as ``from kernel_problem import ...``
(``python benchmarks/<script>.py`` puts this folder on the path).
"""

import json
from collections.abc import Callable
from dataclasses import dataclass

import torch

import lightning_attention as la


@dataclass
class Problem:
    """q, k, v: ``[B, T, H, D]`` leaves; do: ``[B, T, H, D]``; slope: ``[H]``; fwd / fwd_bwd: the timed calls."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    slope: torch.Tensor
    fwd: Callable[[], tuple]
    fwd_bwd: Callable[[], tuple]


def make_problem(B: int, T: int, H: int = 16, D: int = 128, dtype=torch.bfloat16) -> Problem:
    """``fwd``: ``lightning_attn`` under no_grad; ``fwd_bwd``: forward + ``autograd.grad`` w.r.t. q, k, v."""
    slope = la.tnl_slopes(H, 0, 12).cuda()
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    do = torch.randn(B, T, H, D, device="cuda", dtype=dtype)

    def fwd():
        with torch.no_grad():
            return la.lightning_attn(q, k, v, slope)

    def fwd_bwd():
        o, _ = la.lightning_attn(q, k, v, slope)
        return torch.autograd.grad(o, (q, k, v), do)

    return Problem(q, k, v, do, slope, fwd, fwd_bwd)


ENV_PROBE_MIN_TILE = "PROBE_WALK_MIN_TILE"


def apply_probe_overrides() -> None:
    """For probes only (``chunk_sweep.py``, ``inter_debug.py`` children): ``PROBE_WALK_MIN_TILE=32`` lets a pinned
    configuration keep a value tile narrower than ``configs.WALK_MIN_TILE`` (the dispatcher widens or re-warps it
    otherwise), to time and check narrow tiles before any rule admits them."""
    import os

    from lightning_attention.ops.lightning.kernels import configs

    if os.environ.get(ENV_PROBE_MIN_TILE):
        configs.WALK_MIN_TILE = int(os.environ[ENV_PROBE_MIN_TILE])


def parse_shape(text: str, D: int = 128) -> tuple[int, int, int]:
    """``"BxT"`` or ``"BxTxD"`` (the scripts' ``--shapes`` items) -> (B, T, D); D defaults to ``D``."""
    dims = [int(x) for x in text.split("x")]
    if len(dims) not in (2, 3):
        raise ValueError(f"a shape is BxT or BxTxD, got {text!r}")
    return dims[0], dims[1], dims[2] if len(dims) == 3 else D


def write_json(path: str | None, result: dict) -> None:
    """Writes ``result`` to ``path`` (indented) when a path is given."""
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=1)
