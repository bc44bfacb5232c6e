"""The benchmark registry: ops, the providers that implement them, and named shape sets.

An **op** (:class:`BenchOp`) is one mathematical operation with an input factory, FLOP and byte formulas, and a
float64 reference; a **provider** (:class:`Provider`) is one implementation of it (ours, our PyTorch path, FLA, the
official package, SDPA as the softmax baseline); a **shape set** (:class:`ShapeSet`) is a named list of shapes.
Harnesses look things up by name, so adding a baseline or a grid is one registration, not an edit of a script.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
from collections.abc import Callable

import torch

from lightning_attention.utils.dtypes import dtype_name


@dataclasses.dataclass(frozen=True)
class Shape:
    """One benchmark shape: q, k ``[batch, seqlen, heads, k_dim]``, v ``[batch, seqlen, heads, v_dim]``.

    ``lengths``: packed sequences of these lengths along T (batch 1, seqlen their sum, ``cu_seqlens`` offsets), for
    providers that take them (``Provider.varlen``); None: ``batch`` sequences of ``seqlen`` tokens.
    """

    batch: int
    seqlen: int
    heads: int
    k_dim: int
    v_dim: int
    dtype: torch.dtype
    lengths: tuple[int, ...] | None = None

    def __post_init__(self):
        if self.lengths is not None and (self.batch != 1 or sum(self.lengths) != self.seqlen):
            raise ValueError(f"packed lengths need batch 1 and seqlen = their sum, got {self}")

    @property
    def tokens(self) -> int:
        return self.batch * self.seqlen

    @property
    def head_class(self) -> str:
        """The shape class a kernel compiles for (no T, no batch): dtype, head dims and whether sequences are packed."""
        return head_class_of(self.to_json())

    def label(self) -> str:
        dtype = dtype_name(self.dtype)
        rows = f"N{len(self.lengths)}" if self.lengths is not None else f"B{self.batch}"
        return f"{rows}-T{self.seqlen}-H{self.heads}-K{self.k_dim}-V{self.v_dim}-{dtype}"

    def to_json(self) -> dict:
        doc = {
            "batch": self.batch,
            "seqlen": self.seqlen,
            "heads": self.heads,
            "k_dim": self.k_dim,
            "v_dim": self.v_dim,
            "dtype": dtype_name(self.dtype),
        }
        if self.lengths is not None:
            doc["lengths"] = list(self.lengths)
        return doc


def head_class_of(record: dict) -> str:
    """:attr:`Shape.head_class` of a shape's JSON fields (:meth:`Shape.to_json`, or a result record holding them)."""
    packed = "-varlen" if record.get("lengths") else ""
    return f"{record['dtype']}-K{record['k_dim']}-V{record['v_dim']}{packed}"


def token_budget_shapes(
    budget: int, seqlens: tuple[int, ...], heads: int, k_dim: int, v_dim: int, dtype: torch.dtype
) -> tuple[Shape, ...]:
    """Shapes with a fixed number of tokens per call: batch = budget / T (the paper's Fig. 3 protocol).

    Every T must divide the budget, so that all points of a curve move the same number of bytes.
    """
    shapes = []
    for t in seqlens:
        if t <= 0 or budget % t:
            raise ValueError(f"sequence length {t} does not divide the token budget {budget}")
        shapes.append(Shape(budget // t, t, heads, k_dim, v_dim, dtype))
    return tuple(shapes)


@dataclasses.dataclass(frozen=True)
class ShapeSet:
    """A named grid of shapes, e.g. grid (a) or (b) of docs/design.md."""

    name: str
    description: str
    shapes: tuple[Shape, ...]


@dataclasses.dataclass
class Prepared:
    """A provider's inputs laid out as it wants them, ready to time.

    ``forward()`` returns the output tensor whose gradient is ``grad_output``; ``leaves`` are the tensors that
    receive gradients (cleared between timed runs); ``gradients()`` returns them mapped back to the library layout
    (q, k, v order, ``[B, T, H, *]``) for the accuracy check. ``context()``: what the forward and its backward run
    under (e.g. a settings override), entered by :meth:`run_forward` and :meth:`forward_backward`.
    """

    forward: Callable[[], torch.Tensor]
    grad_output: torch.Tensor
    leaves: list[torch.Tensor]
    to_library_layout: Callable[[torch.Tensor], torch.Tensor]
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext

    def run_forward(self) -> torch.Tensor:
        with self.context():
            return self.forward()

    def forward_backward(self) -> None:
        with self.context():
            self.forward().backward(self.grad_output)

    def gradients(self) -> list[torch.Tensor]:
        return [self.to_library_layout(x.grad) for x in self.leaves]


@dataclasses.dataclass(frozen=True)
class Provider:
    """One implementation of an op.

    ``prepare(inputs)`` builds a :class:`Prepared` from the op's canonical inputs (library layout). ``available``
    returns ``None`` when the provider can run on ``device``, else the reason it is skipped. ``max_seqlen`` bounds T
    (SDPA runs up to 128K only). ``computes_op`` is False for a baseline that computes a different function (softmax
    attention): it is timed, but has no accuracy against the op's reference. ``flops`` overrides the op's formula.
    ``varlen``: it takes packed sequences (a shape with ``lengths``); the others skip such shapes.
    """

    name: str
    label: str
    family: str  # "ours" or "baseline"
    prepare: Callable[[dict], Prepared]
    available: Callable[[torch.device], str | None]
    max_seqlen: int | None = None
    computes_op: bool = True
    flops: Callable[[Shape], tuple[float, float]] | None = None
    cold_start: bool = False  # report the first fwd+bwd call of each shape class (compile + autotune)
    varlen: bool = False


@dataclasses.dataclass
class BenchOp:
    """An op: input factory, FLOP and byte formulas, float64 reference, providers and shape sets."""

    name: str
    make_inputs: Callable[[Shape, torch.device, int], dict]
    flops: Callable[[Shape], tuple[float, float]]
    io_bytes: Callable[[Shape], tuple[int, int]]
    reference: Callable[[dict], tuple[torch.Tensor, list[torch.Tensor]]]
    providers: dict[str, Provider] = dataclasses.field(default_factory=dict)
    shape_sets: dict[str, ShapeSet] = dataclasses.field(default_factory=dict)

    def register_provider(self, provider: Provider) -> Provider:
        if provider.name in self.providers:
            raise ValueError(f"provider {provider.name!r} is already registered for {self.name}")
        self.providers[provider.name] = provider
        return provider

    def register_shape_set(self, shape_set: ShapeSet) -> ShapeSet:
        self.shape_sets[shape_set.name] = shape_set
        return shape_set


OPS: dict[str, BenchOp] = {}


def register_op(op: BenchOp) -> BenchOp:
    if op.name in OPS:
        raise ValueError(f"op {op.name!r} is already registered")
    OPS[op.name] = op
    return op


def module_missing(*modules: str) -> str | None:
    """``None`` when every module can be found, else a message naming the first one missing (nothing is imported)."""
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # parent package missing
            found = False
        if not found:
            return f"{module} is not installed"
    return None
