"""A chunk call's launches as a value: what the plan of a call turns into, built once per problem and run per call.

A :class:`Program` is a list of steps over numbered tensor slots: the call's inputs first, then allocations, views
and small constant tables, and the kernel launches with their arguments already laid out (every shape, stride,
flag and grid is known from the problem; only the tensors' addresses change from call to call). Running it
(:meth:`Program.__call__`) allocates, takes the views, launches each kernel with this call's tensors and releases
every buffer after its last use. A training loop repeats the same problems, so after the first call of a problem a
call costs its allocations and launches, not the planning (docs/kernels.md, "Host overhead").

Programs are built by :mod:`lightning_attention.ops.lightning.run` from the launch builders' view of tensors: a
:class:`Ref` (slot and :class:`~lightning_attention.ops.lightning.plan.TensorSpec`), which answers what the
builders ask of a tensor (shape, strides, dtype, alignment). A program keeps every slot's spec, so its kernels can be
compiled before its first call from stand-in tensors (:meth:`Program.compile_ahead`,
:mod:`~lightning_attention.ops.lightning.compile_ahead`).
"""

import torch

from lightning_attention.ops.lightning.offsets import upload
from lightning_attention.ops.lightning.plan import TensorSpec


class Ref:
    """A tensor of a program under construction: its slot and its spec (what launch builders read)."""

    __slots__ = ("slot", "spec")

    def __init__(self, slot: int, spec: TensorSpec):
        self.slot, self.spec = slot, spec

    @property
    def shape(self) -> tuple[int, ...]:
        return self.spec.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.spec.dtype

    def stride(self) -> tuple[int, ...]:
        return self.spec.strides

    def element_size(self) -> int:
        return self.spec.element_size()

    def transposed(self) -> "Ref":
        """The same memory with the last two dims swapped (a state's [V, K] view): same slot, swapped strides, so a
        kernel that takes strides reads the transpose without a view being made."""
        s = self.spec
        swap = lambda t: (*t[:-2], t[-1], t[-2])  # noqa: E731
        return Ref(self.slot, TensorSpec(swap(s.shape), swap(s.strides), s.dtype, s.aligned))


class _Launch:
    """One kernel launch: the launcher, its grid and constexprs, the run-time arguments with the tensors' places left
    to fill (``consts`` with ``tensors`` = (position, slot) pairs), the slot of the tensor that names the device, and
    the bound launch once the launcher has verified it (:meth:`Launcher.bind`)."""

    __slots__ = ("bound", "constexprs", "consts", "grid", "launcher", "tensors", "x")

    def __init__(self, launcher, grid, consts: list, tensors: tuple, constexprs: dict, x: int):
        self.launcher, self.grid, self.consts, self.tensors = launcher, grid, consts, tensors
        self.constexprs, self.x = constexprs, x
        self.bound = None

    def arguments(self, values: list) -> tuple:
        """The launch's run-time arguments with the tensors of ``values`` (one per slot) in their places."""
        args = self.consts.copy()
        for i, slot in self.tensors:
            args[i] = values[slot]
        return tuple(args)

    def run(self, values: list) -> None:
        x = values[self.x]
        bound = self.bound
        if bound is not None:
            args = self.consts.copy()
            for i, slot in self.tensors:
                args[i] = values[slot].data_ptr() if bound.pointers else values[slot]
            if bound(tuple(args), x):
                return
        args = self.arguments(values)
        self.launcher(self.grid, args, self.constexprs, x)
        self.bound = self.launcher.bind(self.grid, args, self.constexprs, x)


class Program:
    """The steps of one problem (module docstring). Call it with the problem's input tensors (None where the problem
    has none; the first, q, is never None) to get its outputs. ``specs``: each slot's spec (None: an absent input).
    ``compiled_ahead``: whether :func:`~lightning_attention.ops.lightning.compile_ahead.compile_together` has had
    this program (its kernels are then compiled, or were left to their first launch)."""

    def __init__(self, num_inputs: int, num_slots: int, steps: list, outputs: tuple, specs: tuple):
        self.num_inputs, self.num_slots, self.steps, self.outputs = num_inputs, num_slots, steps, outputs
        self.specs = specs
        self.compiled_ahead = False
        self._constants: dict[tuple, torch.Tensor] = {}

    @property
    def launches(self) -> list[_Launch]:
        """The kernel launches in order (tests and profiling tools read them)."""
        return [step[1] for step in self.steps if step[0] == "launch"]

    def __call__(self, *inputs):
        values = self._run(inputs, free=True)
        return tuple(values[o] if o is not None else None for o in self.outputs)

    def run_keeping_buffers(self, *inputs) -> list:
        """Runs the program like a call but frees no buffer: every slot's tensor, by slot, so that profiling tools can
        repeat one launch alone (``launch.run(values)``)."""
        return self._run(inputs, free=False)

    def _run(self, inputs: tuple, free: bool) -> list:
        values: list = [*inputs, *([None] * (self.num_slots - len(inputs)))]
        device = inputs[0].device  # q: allocations and constants go where it is
        for step in self.steps:
            kind = step[0]
            if kind == "launch":
                step[1].run(values)
            elif kind == "alloc":
                values[step[1]] = torch.empty(step[2], dtype=step[3], device=device)
            elif kind == "narrow":
                _, slot, base, dim, start, length = step
                values[slot] = values[base].narrow(dim, start, length)
            elif kind == "free":
                if free:
                    for slot in step[1]:
                        values[slot] = None
            elif kind == "const":
                values[step[1]] = self._constant(step, device)
            else:  # "call"
                step[1]()
        return values

    def output_spec(self, index: int) -> TensorSpec | None:
        """The spec of output ``index`` (None when the program returns None there)."""
        slot = self.outputs[index]
        return None if slot is None else self.specs[slot]

    def compile_ahead(self, device: torch.device) -> None:
        """Hands every launch to its launcher's :meth:`~lightning_attention.ops.lightning.launch.Launcher.compile_ahead`
        (compile without launching), each tensor replaced by a stand-in on ``device`` with its slot's dtype and
        alignment: all that Triton specialises a kernel on, so the kernels built are the ones the calls will launch.
        Nothing is allocated at the slots' sizes and nothing runs on the GPU."""
        values = [None if spec is None else _stand_in(spec, device) for spec in self.specs]
        for step in self.steps:
            if step[0] == "launch":
                launch = step[1]
                args = launch.arguments(values)
                launch.launcher.compile_ahead(launch.grid, args, launch.constexprs, values[launch.x])

    def _constant(self, step: tuple, device: torch.device) -> torch.Tensor:
        """A small table made on ``device`` once and kept (read-only: safe across streams and graphs); copied without
        a host sync."""
        _, slot, data, dtype = step
        key = (slot, device)
        table = self._constants.get(key)
        if table is None:
            table = self._constants[key] = upload(data, dtype, device)
        return table


class ProgramBuilder:
    """Builds a :class:`Program`: inputs, then allocations, views, constants and launches in execution order."""

    def __init__(self):
        self.steps: list = []
        self.specs: list[TensorSpec | None] = []  # per slot
        self.num_inputs = 0
        self.refs: dict[str, Ref | None] = {}  # named tensors of the program (its inputs, shared tables)
        self._calls: set = set()

    @property
    def num_slots(self) -> int:
        return len(self.specs)

    def _slot(self, spec: TensorSpec | None) -> Ref | None:
        """A new slot holding a tensor of ``spec`` (None: an absent input, whose slot stays empty)."""
        self.specs.append(spec)
        return None if spec is None else Ref(len(self.specs) - 1, spec)

    def input(self, spec: TensorSpec | None) -> Ref | None:
        """The next input of the program (``None``: the problem has no such tensor; its slot stays empty)."""
        assert self.num_inputs == self.num_slots, "inputs come before every other slot"
        self.num_inputs += 1
        return self._slot(spec)

    def alloc(self, shape: tuple[int, ...], dtype: torch.dtype) -> Ref:
        """A new contiguous tensor (``torch.empty``)."""
        ref = self._slot(TensorSpec.contiguous(tuple(shape), dtype))
        self.steps.append(("alloc", ref.slot, tuple(shape), dtype))
        return ref

    def narrow(self, base: Ref, dim: int, start: int, length: int) -> Ref:
        """``base.narrow(dim, start, length)``: a view, aligned when the base is and the offset is 16 bytes."""
        s = base.spec
        offset_bytes = start * s.strides[dim] * s.element_size()
        shape = (*s.shape[:dim], length, *s.shape[dim + 1 :])
        ref = self._slot(TensorSpec(shape, s.strides, s.dtype, s.aligned and offset_bytes % 16 == 0))
        self.steps.append(("narrow", ref.slot, base.slot, dim, start, length))
        return ref

    def constant(self, data: tuple, dtype: torch.dtype) -> Ref:
        """A small tensor of fixed values (e.g. a segment table), made on the device once per program."""
        ref = self._slot(TensorSpec.contiguous(tuple(torch.tensor(data, dtype=dtype).shape), dtype))
        self.steps.append(("const", ref.slot, data, dtype))
        return ref

    def launch(self, launcher, grid, args: tuple, constexprs: dict, x: Ref) -> None:
        """``launcher(grid, args, constexprs, x)`` with every :class:`Ref` in ``args`` replaced by its tensor."""
        consts = [None if isinstance(a, Ref) else a for a in args]
        tensors = tuple((i, a.slot) for i, a in enumerate(args) if isinstance(a, Ref))
        self.steps.append(("launch", _Launch(launcher, grid, consts, tensors, constexprs, x.slot)))

    def call(self, fn) -> None:
        """``fn()`` before the next launch, once per program (a per-thread setup, e.g. Triton's allocator)."""
        if fn not in self._calls:
            self._calls.add(fn)
            self.steps.append(("call", fn))

    def finish(self, outputs: tuple) -> Program:
        """The program returning ``outputs`` (Refs or None), with each other buffer released after its last use."""
        out = tuple(None if o is None else o.slot for o in outputs)
        keep = {o for o in out if o is not None}
        last: dict[int, int] = {}
        for n, step in enumerate(self.steps):
            for slot in _slots(step):
                last[slot] = n
        frees: dict[int, list[int]] = {}
        for slot, n in last.items():
            if slot >= self.num_inputs and slot not in keep:
                frees.setdefault(n, []).append(slot)
        steps = []
        for n, step in enumerate(self.steps):
            steps.append(step)
            if n in frees:
                steps.append(("free", tuple(frees[n])))
        return Program(self.num_inputs, self.num_slots, steps, out, tuple(self.specs))


def _stand_in(spec: TensorSpec, device: torch.device) -> torch.Tensor:
    """A two-element tensor of ``spec``'s dtype on ``device``, 16-byte aligned or, where ``spec`` is not, one element
    past an aligned allocation (2 to 8 bytes off: never a multiple of 16)."""
    x = torch.empty(2, dtype=spec.dtype, device=device)
    return x if spec.aligned else x[1:]


def _slots(step: tuple) -> list[int]:
    """The slots a step reads or writes."""
    kind = step[0]
    if kind == "launch":
        return [slot for _, slot in step[1].tensors] + [step[1].x]
    if kind in ("alloc", "const"):
        return [step[1]]
    if kind == "narrow":
        return [step[1], step[2]]
    return []
