"""Launch replay: a chunk forward or backward call repeated without the Python that planned its launches.

Why. A K = V = 64 fwd+bwd takes 0.75-1.0 ms of GPU time on an H100, and its host side took 1.2-1.5 ms there
(``benchmarks/results/h100-2026-11-22z24``: the profiler's timeline shows 50-90 µs of our Python before each of the
8 launches of a segmented fwd+bwd: the segment plan, the pre-pass pieces, ~50 kernel arguments per walk, the
descriptor checks, the launch key). A training loop calls the same shapes again and again, and for the same shapes
that Python computes the same launches every time.

How. :func:`replayable` wraps a function whose work is allocations (:func:`empty`), views of its tensors
(:func:`view`) and kernel launches (:func:`launch`), each a deterministic function of a key: every tensor
argument's shape, strides, dtype, device and address modulo 16 (what the launch key and the descriptor rules see),
every other argument's value, and the environment variables the wrapped function's launch path reads (named by
its ``environment``, plus :data:`ENV_REPLAY`). The first call
of a key runs the function and records those steps, each tensor an argument refers to as a slot (an input, an
allocation or a view of either). Later calls of the key run the steps alone: allocate, take the views, and call each
launcher with the recorded arguments and the call's own tensors. Launchers are called exactly as the function called
them (:class:`~lightning_attention.ops.lightning.kernels.launch.DirectLauncher` keeps its own key and checks), so
autotuning, the interpreter and launch hooks behave as without replay. Once a launcher has verified a launch, the
recording binds it (:meth:`DirectLauncher.bind`): later replays skip the launcher's key and pass the tensors as their
addresses; a bound launch declines after its cache was reset or disabled, or while a hook is set, and that replay
then launches in full and binds again.

A recording is kept only when every tensor in it is accounted for exactly once: a tensor that is none of the slots
(e.g. a segment table built from host offsets), or an input passed twice as the same object (``q is k``: the
recording could not tell which one a launch meant), leaves the key unrecorded and every call of it runs in full.
Buffers are released after their last launch, as the function's own references would be. Callers exclude what the
key cannot see (values on the host, such as ``cu_seqlens_cpu``) with ``uncacheable``.

``LIGHTNING_ATTENTION_REPLAY=0`` turns replay off (every call runs in full); :func:`clear` forgets every recording.
"""

import functools
import os
import threading
from collections.abc import Callable

import torch

ENV_REPLAY = "LIGHTNING_ATTENTION_REPLAY"
MAX_RECORDINGS = 256  # keys per wrapped function (past it the cache starts over)


def _environment_reader(names: tuple[str, ...]) -> tuple[Callable[[], tuple], object]:
    """A function returning the values of ``names`` (None where unset), and the value that turns replay off as that
    function returns it (for ``names[0]`` = :data:`ENV_REPLAY`). CPython's ``os.environ`` keeps its data in a dict
    of encoded names and values: read there it costs ~0.3 µs for seven names against ~4 µs through
    ``os.environ.get`` (called twice per fwd+bwd)."""
    data, encode = getattr(os.environ, "_data", None), getattr(os.environ, "encodekey", None)
    encode_value = getattr(os.environ, "encodevalue", None)
    if isinstance(data, dict) and callable(encode) and callable(encode_value):
        keys = tuple(encode(name) for name in names)
        return (lambda: tuple(map(data.get, keys))), encode_value("0")
    return (lambda: tuple(os.environ.get(name) for name in names)), "0"

_state = threading.local()  # .recording: the Recording being made on this thread, or None
_wrapped: list = []  # every replayable function's recordings (for clear())


class _Slot:
    """A tensor of a recorded launch, by its index among the call's tensors."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class Recording:
    """The steps of one call: ``("alloc", slot, shape, dtype)``, ``("view", slot, base, size, stride, offset)``,
    ``("launch", launcher, grid, args, constexprs, x)``, ``("call", fn)``, ``("free", slots)``."""

    def __init__(self, inputs: tuple):
        self.num_inputs = len(inputs)
        self.steps: list[tuple] = []
        self.outputs: tuple = ()
        self.single = False
        self.num_slots = self.num_inputs
        self.valid = True
        self.tensors: list[torch.Tensor | None] = list(inputs)  # slot -> tensor, while recording
        self._ids: dict[int, int] = {}
        for i, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):
                if id(x) in self._ids:  # the same object twice: which one a launch meant is unknowable
                    self.valid = False
                self._ids.setdefault(id(x), i)
        # where allocations go: the first tensor input's device (the key fixes which inputs are tensors)
        self.device_input = next((i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)), None)
        if self.device_input is None:
            self.valid = False

    def _new_slot(self, x: torch.Tensor) -> int:
        self.tensors.append(x)
        self._ids[id(x)] = len(self.tensors) - 1
        return len(self.tensors) - 1

    def _ref(self, x):
        if not isinstance(x, torch.Tensor):
            return x
        index = self._ids.get(id(x))
        if index is None:  # not an input, an allocation or a view the function declared
            self.valid = False
            return x
        return _Slot(index)

    def add_alloc(self, x: torch.Tensor) -> None:
        if self.device_input is not None and x.device != self.tensors[self.device_input].device:
            self.valid = False  # a replay allocates on the first tensor input's device
        self.steps.append(("alloc", self._new_slot(x), tuple(x.shape), x.dtype))

    def add_view(self, view: torch.Tensor, base: torch.Tensor) -> None:
        ref = self._ref(base)
        same_memory = view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
        if not isinstance(ref, _Slot) or view.dtype != base.dtype or not same_memory:
            self.valid = False  # a replay rebuilds views with as_strided on the base's memory
            return
        offset = view.storage_offset() - base.storage_offset()
        self.steps.append(("view", self._new_slot(view), ref.index, tuple(view.shape), view.stride(), offset))

    def add_launch(self, launcher, grid, args: tuple, constexprs: dict, x: torch.Tensor) -> None:
        refs = [self._ref(a) for a in args]
        # the arguments as constants with the tensors' places left to fill: (position, slot) pairs
        tensors = tuple((i, r.index) for i, r in enumerate(refs) if type(r) is _Slot)
        consts = [None if type(r) is _Slot else r for r in refs]
        self.steps.append(("launch", launcher, grid, (consts, tensors), constexprs, self._ref(x)))

    def add_call(self, fn: Callable[[], None]) -> None:
        if not any(step[0] == "call" and step[1] is fn for step in self.steps):
            self.steps.append(("call", fn))

    def finish(self, outputs) -> bool:
        """Records the function's outputs (a tuple of tensors and Nones), adds the releases after last uses and
        drops the recorded tensors; returns whether the recording may be replayed."""
        single = not isinstance(outputs, tuple)
        self.outputs = tuple(self._ref(o) for o in ((outputs,) if single else outputs))
        self.single = single
        keep = {o.index for o in self.outputs if isinstance(o, _Slot)}
        last: dict[int, int] = {}
        for n, step in enumerate(self.steps):
            for ref in _step_slots(step):
                last[ref] = n
        frees: dict[int, list[int]] = {}
        for index, n in last.items():
            if index >= self.num_inputs and index not in keep:
                frees.setdefault(n, []).append(index)
        steps = []
        for n, step in enumerate(self.steps):
            steps.append(step)
            if n in frees:
                steps.append(("free", tuple(frees[n])))
        self.steps = steps
        self.bound: list = [None] * len(steps)  # per launch step, once its launcher can bind it (DirectLauncher.bind)
        self.num_slots = len(self.tensors)
        self.tensors, self._ids = [], {}
        return self.valid

    def replay(self, inputs: tuple):
        """The recorded steps on this call's ``inputs``: the function's outputs."""
        values: list = [*inputs, *([None] * (self.num_slots - len(inputs)))]
        device = inputs[self.device_input].device
        for n, step in enumerate(self.steps):
            kind = step[0]
            if kind == "launch":
                self._launch(n, step, values)
            elif kind == "alloc":
                values[step[1]] = torch.empty(step[2], dtype=step[3], device=device)
            elif kind == "view":
                _, slot, base, size, stride, offset = step
                b = values[base]
                values[slot] = b.as_strided(size, stride, b.storage_offset() + offset)
            elif kind == "free":
                for index in step[1]:
                    values[index] = None
            else:
                step[1]()
        out = tuple(values[o.index] if type(o) is _Slot else o for o in self.outputs)
        return out[0] if self.single else out

    def _launch(self, n: int, step: tuple, values: list) -> None:
        """Launch step ``n``: through its bound launch when there is one (the launcher's key and checks done once,
        tensors passed as addresses), else through the launcher as recorded, then bound for the next replays."""
        _, launcher, grid, (consts, tensors), constexprs, x = step
        x = values[x.index] if type(x) is _Slot else x
        bound = self.bound[n]
        if bound is not None:
            args = consts.copy()
            for i, slot in tensors:
                args[i] = values[slot].data_ptr() if bound.pointers else values[slot]
            if bound(tuple(args), x):
                return
        args = consts.copy()
        for i, slot in tensors:
            args[i] = values[slot]
        args = tuple(args)
        launcher(grid, args, constexprs, x)
        bind = getattr(launcher, "bind", None)
        self.bound[n] = None if bind is None else bind(grid, args, constexprs, x)


def _step_slots(step: tuple):
    """The slots a step reads or writes."""
    kind = step[0]
    if kind == "launch":
        return [slot for _, slot in step[3][1]] + ([step[5].index] if type(step[5]) is _Slot else [])
    if kind == "alloc":
        return [step[1]]
    if kind == "view":
        return [step[1], step[2]]
    return []


def _recording() -> Recording | None:
    return getattr(_state, "recording", None)


def empty(*shape: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``torch.empty(shape)``, recorded as an allocation of the call being recorded."""
    x = torch.empty(shape, dtype=dtype, device=device)
    rec = _recording()
    if rec is not None:
        rec.add_alloc(x)
    return x


def view(x: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    """Declares ``x`` (a view of ``base``, same dtype) to the call being recorded; returns ``x``."""
    rec = _recording()
    if rec is not None:
        rec.add_view(x, base)
    return x


def launch(launcher, grid, args: tuple, constexprs: dict, x: torch.Tensor) -> None:
    """``launcher(grid, args, constexprs, x)`` (a :class:`DirectLauncher` call), recorded."""
    launcher(grid, args, constexprs, x)
    rec = _recording()
    if rec is not None:
        rec.add_launch(launcher, grid, args, constexprs, x)


def call(fn: Callable[[], None]) -> None:
    """``fn()``, recorded (once per recording): a per-thread setup a replay must repeat (e.g. Triton's allocator)."""
    fn()
    rec = _recording()
    if rec is not None:
        rec.add_call(fn)


def _key_part(a):
    if isinstance(a, torch.Tensor):
        return (a.shape, a.stride(), a.dtype, a.device, a.data_ptr() & 15)
    return a


def replayable(uncacheable: Callable[[tuple], bool], environment: tuple[str, ...] = ()):
    """Decorator (module docstring): record the first call of every key, replay the later ones. ``uncacheable(args)``:
    True for a call whose steps the key does not determine (it runs in full, unrecorded). ``environment``: every
    environment variable the function's launch path reads per call, part of the key so that a change takes effect at
    the next call as without replay."""
    read_environment, off = _environment_reader((ENV_REPLAY, *environment))

    def decorate(fn):
        recordings: dict[tuple, Recording] = {}

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            env = read_environment()
            # keywords: not keyed (callers pass everything by position); inside another recording (a wrapped
            # function calling one): its steps belong to that recording
            if kwargs or env[0] == off or _recording() is not None or uncacheable(args):
                return fn(*args, **kwargs)
            key = (env, *[_key_part(a) for a in args])
            rec = recordings.get(key)
            if rec is not None:
                return rec.replay(args)
            rec = Recording(args)
            _state.recording = rec
            try:
                out = fn(*args)
            finally:
                _state.recording = None
            if rec.finish(out):
                if len(recordings) >= MAX_RECORDINGS:
                    recordings.clear()
                recordings[key] = rec
            return out

        wrapper.recordings = recordings  # for tests and for clearing
        _wrapped.append(recordings)
        return wrapper

    return decorate


def clear() -> None:
    """Forgets every recording (each key records again on its next call): after replacing a launcher or a planning
    function the key cannot see, as tests do."""
    for recordings in _wrapped:
        recordings.clear()
