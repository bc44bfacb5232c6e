"""The one way this library launches a Triton kernel: the compiled kernel called directly once Triton has shown how.

Why. ``JITFunction.run`` (and ``Autotuner.run`` in front of it) spends tens of µs of host time per launch binding
and specialising every argument, building string keys and looking up caches; the walk kernel has ~55 arguments. On
an H100 host a chunk fwd+bwd spent ~1.5 ms of host time for 0.6-1.2 ms of GPU time, and a batch-1 decode step
~48 µs for 6.8 µs of GPU time (docs/kernels.md, "Host overhead"). The chunk walks, the recompute backward and the
decode step all launch through a :class:`Launcher`.

How. A :class:`Launcher` keeps, per launch key (never coarser than Triton's specialisation), the ``CompiledKernel``
that Triton's normal launch returned, and then calls its launcher itself, passing exactly what ``JITFunction.run``
passes (triton 3.4 to 3.8)::

    compiled.run(grid0, grid1, grid2, stream, compiled.function, compiled.packed_metadata,
                 launch_metadata, enter_hook, exit_hook, *all_arguments_in_signature_order)

(``launch_metadata`` and the hooks are ``None``: the fast path is only taken while no launch hook is set.)

Life of a key: the first call launches through Triton (compiling, autotuning or looking up the right
specialisation) and keeps the returned ``CompiledKernel`` (and, for an autotuned kernel, the configuration the
autotuner chose); the second call launches through Triton again with a recorder in place of the kernel's launcher
and checks that Triton picked the same compiled kernel and called its launcher with precisely the arguments the
fast path would pass (same grid, stream, function handle, metadata, and each argument identical, constexprs
included); only then do later calls use the launcher directly. Anything unexpected — another compiled kernel (the
key missed a specialisation), another calling convention, an attribute that is not there, a
``TypeError``/``AttributeError`` from the launcher (raised while it parses its arguments, before it launches), a
configuration pre-hook, a constexpr left to its default — disables the fast path of that launcher for good (with one
warning) and that call and every later one go through Triton's normal launch.

What the fast path leaves out of ``JITFunction.run``: launch hooks and ``pre_run_hooks`` (it steps aside while any is
set), the async-compile mode (a future is never kept), and knobs that change Triton's compile options
(``TRITON_DEBUG``, instrumentation): they are honoured when a key is first seen; call :meth:`Launcher.reset` after
changing them mid-process. The stream is read on every call (Triton's own ``get_current_stream``), so launches follow
``torch.cuda.stream(...)`` and CUDA-graph capture. Under ``TRITON_INTERPRET=1`` there is nothing compiled to reuse
and every launch goes through the interpreter; the ``direct_launch`` setting off sends every launch through Triton.
"""

import threading
import warnings

import torch
import triton
from triton.runtime.jit import JITFunction

from lightning_attention import settings
from lightning_attention.ops.lightning.library import on_device_of


def _hook_idle(hook) -> bool:
    """A launch hook that does nothing: ``None`` (older Triton) or an empty ``HookChain`` (newer Triton)."""
    return hook is None or (type(hook).__name__ == "HookChain" and not hook.calls)


def jit_function(kernel):
    """The ``JITFunction`` under an ``Autotuner`` (or a heuristics wrapper), or ``kernel`` itself."""
    while not isinstance(kernel, JITFunction) and hasattr(kernel, "fn"):
        kernel = kernel.fn
    return kernel


_I32 = range(-(2**31), 2**31)


def specialization_key(args: tuple) -> tuple:
    """What Triton's specialisation can see of run-time arguments, never less: a tensor's dtype and 16-byte alignment;
    an int's ``== 1``, divisibility by 16 and int32 range (finer than Triton for ``do_not_specialize`` ints, which
    then just take a few more keys); a tuple (the kernels' stride groups) element by element; any other value by its
    type (floats are never specialised)."""
    return tuple(
        (a.dtype, not a.data_ptr() & 15)
        if isinstance(a, torch.Tensor)
        else (a == 1, not a % 16, a in _I32)
        if type(a) is int
        else specialization_key(a)
        if type(a) is tuple
        else type(a)
        for a in args
    )


def grid3(grid: tuple) -> tuple[int, int, int]:
    """A grid of one to three dimensions as three ints."""
    return grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1


class _Entry:
    """One launch key: how Triton is called for it and, once seen and verified, the compiled kernel's launcher.

    ``kwargs``: the keyword arguments of the normal launch (constexprs, num_warps); ``config``: the constexprs by
    name once known (the caller's plus the autotuner's choice: what a grid function gets); ``tail``: the arguments
    after the caller's positional ones, in signature order, for the direct call.
    """

    __slots__ = ("compiled", "config", "function", "kwargs", "launcher", "packed_metadata", "tail")

    def __init__(self, kwargs: dict):
        self.kwargs = kwargs
        self.compiled = None  # the CompiledKernel Triton's normal launch returned for this key
        self.config, self.tail = kwargs, ()
        self.launcher = self.function = self.packed_metadata = None  # set once verified


class Launcher:
    """``kernel[grid](*args, **constexprs)`` for a kernel that takes its run-time arguments positionally (tensors
    first, then ints and floats) and its constexprs (and ``num_warps``/``num_stages``) by keyword, launched directly
    once verified (module docstring). One entry serves every sequence length and batch: the key is the device,
    :func:`specialization_key` of the run-time arguments and the constexprs.

    Repeated calls of the same shapes (a training loop, a decode loop) find their entry by an exact key instead: each
    tensor's dtype and address modulo 16 and the other arguments' raw values. It is finer than the specialisation key
    and costs ~1 µs to build against ~9 µs for :func:`specialization_key` over the walk's ~40 arguments.
    """

    cuda_only = True  # CPU tests of the fast path drive a fake kernel on CPU tensors

    def __init__(self, kernel, name: str, max_entries: int = 256):
        self.kernel, self.name, self.max_entries = kernel, name, max_entries
        self.jit = jit_function(kernel)
        self.autotuned = self.jit is not kernel
        self._lock = threading.Lock()  # one verification at a time (it swaps the kernel's launcher for a recorder)
        self.num_tensors: int | None = None  # the leading tensors of ``args``, counted at the first keyed call
        self.reset()

    def reset(self) -> None:
        """Forgets every entry and re-enables the fast path (when the kernel is a compiled ``JITFunction``)."""
        # bumped by every reset and disable: a BoundLaunch made before stops launching directly
        self.generation = getattr(self, "generation", 0) + 1
        self.entries: dict[tuple, _Entry] = {}
        self.aliases: dict[tuple, _Entry] = {}  # a caller's exact key -> the entry of its specialisation key
        self.get_device = self.get_stream = None  # Triton's driver functions, bound on first use
        self._runtime = None
        self._pre_run_hooks = getattr(self.jit, "pre_run_hooks", None)
        # Under TRITON_INTERPRET=1 the decorator returned an InterpretedFunction: nothing is compiled to reuse.
        self.compiles = isinstance(self.jit, JITFunction)
        self.disabled: str | None = None if self.compiles else "the kernel is not a compiled JITFunction (interpreter)"

    def disable(self, reason: str) -> None:
        if self.disabled is None:
            warnings.warn(
                f"{self.name}: direct kernel launch disabled ({reason}); every launch now goes through Triton's "
                "normal launch (correct, with more host overhead per launch)",
                RuntimeWarning,
                stacklevel=3,
            )
        self.disabled = reason
        self.generation += 1
        self.entries.clear()
        self.aliases.clear()

    # -- the call -------------------------------------------------------------------------------------------------

    def __call__(self, grid, args: tuple, constexprs: dict, x: torch.Tensor) -> None:
        """Launches ``kernel[grid](*args, **constexprs)`` on ``x``'s device (it must be the current one).

        ``grid``: a tuple, or a function of the constexprs (it gets the autotuner's choice too, e.g.
        ``meta["BV"]``). CPU tensors, the interpreter, set launch hooks and ``x`` on a device other than the current
        one go through Triton's normal launch, on ``x``'s device (so a caller need not switch devices itself).
        """
        device = self.device_for(x)
        if device is None:
            with on_device_of(x):
                self.kernel[grid](*args, **constexprs)
            return
        constants = tuple(constexprs.items())
        exact = self._exact_key(device, args, constants)
        entry = self.aliases.get(exact)
        if entry is None:
            key = self._key(device, args, constants)
            entry = self.entries.get(key)
            if entry is None:
                if len(self.entries) >= self.max_entries:
                    self.entries.clear()
                entry = self.entries[key] = _Entry(constexprs)
            if len(self.aliases) >= 4 * self.max_entries:
                self.aliases.clear()
            self.aliases[exact] = entry
        self._launch(entry, grid, args, device)

    @staticmethod
    def _key(device: int, args: tuple, constants: tuple) -> tuple:
        """The entry's key: the device, what Triton specialises the arguments on, the constexprs."""
        return (device, specialization_key(args), *constants)

    def _exact_key(self, device: int, args: tuple, constants: tuple) -> tuple:
        n = self.num_tensors
        if n is None:
            n = self.num_tensors = next((i for i, a in enumerate(args) if not isinstance(a, torch.Tensor)), len(args))
        return (device, *[(a.dtype, a.data_ptr() & 15) for a in args[:n]], args[n:], constants)

    def device_for(self, x: torch.Tensor) -> int | None:
        """The current CUDA device index when this call may take the fast path, else ``None``.

        Not for a disabled launcher or the ``direct_launch`` setting off, CPU tensors (unless :attr:`cuda_only` is
        off: CPU tests drive a fake kernel), a set launch or pre-run hook, or ``x`` on a device other than the
        current one (Triton launches on the current device; the normal path switches to x's).
        """
        if self.disabled is not None or not settings.current().direct_launch:
            return None
        index = x.get_device()  # -1 for a CPU tensor
        if index < 0 and self.cuda_only:
            return None
        if self.get_device is None and not self._bind_driver():
            return None
        if not self.hooks_idle():
            return None
        return index if index == self.get_device() else None

    def _bind_driver(self) -> bool:
        try:
            from triton.runtime.driver import driver

            active = driver.active
            self.get_device, self.get_stream = active.get_current_device, active.get_current_stream
            self._runtime = triton.knobs.runtime
        except Exception as e:  # noqa: BLE001 - any surprise means: do not take the fast path
            self.disable(f"cannot bind Triton's driver or knobs: {type(e).__name__}: {e}")
            return False
        return True

    def hooks_idle(self) -> bool:
        """No launch hook and no pre-run hook is set (the fast path steps aside while one is)."""
        rt = self._runtime
        return _hook_idle(rt.launch_enter_hook) and _hook_idle(rt.launch_exit_hook) and not self._pre_run_hooks

    def _launch(self, entry: _Entry, grid, args: tuple, device: int) -> None:
        """Directly when verified, else through Triton (learning, then verifying, the entry)."""
        if entry.launcher is not None:
            if self.launch_direct(entry, grid3(grid(entry.config) if callable(grid) else grid), args, device):
                return
            # rejected: the normal launch below is this call's only launch
        if self.disabled is None and entry.compiled is not None:
            self._verify(entry, args, device, grid)
            return
        compiled = self.kernel[grid](*args, **entry.kwargs)
        if self.disabled is None:
            self._adopt(entry, compiled, len(args))

    def launch_direct(self, entry: _Entry, grid: tuple, args: tuple, device: int) -> bool:
        """Calls a verified entry's compiled launcher; False (and the fast path disabled) when the launcher rejects
        its arguments, which it does while parsing them, before anything is launched."""
        try:
            entry.launcher(
                *grid, self.get_stream(device), entry.function, entry.packed_metadata, None, None, None,
                *args, *entry.tail,
            )  # fmt: skip
        except (TypeError, AttributeError) as e:
            self.disable(f"the compiled kernel's launcher rejected the direct call: {type(e).__name__}: {e}")
            return False
        return True

    # -- learning and verifying an entry --------------------------------------------------------------------------

    def _adopt(self, entry: _Entry, compiled, num_args: int) -> None:
        if compiled is None or hasattr(compiled, "result"):
            return  # a compile hook skipped the launch, or an async-compile future: learn on a later call
        missing = [a for a in ("_run", "function", "packed_metadata") if not hasattr(compiled, a)]
        if missing:
            self.disable(f"Triton's compiled kernel has no {', '.join(missing)}")
            return
        config = dict(entry.kwargs)
        if self.autotuned:
            chosen = getattr(self.kernel, "best_config", None)
            if (
                chosen is None
                or chosen.pre_hook is not None
                or getattr(self.kernel, "restore_value", None)
                or getattr(self.kernel, "reset_to_zero", None)
            ):
                self.disable("the autotuner's choice is unknown or runs hooks around the launch")
                return
            config.update(chosen.kwargs)
        names = getattr(self.jit, "arg_names", None)
        try:
            # the signature's arguments after the positional ones (a fake test kernel takes everything positionally)
            tail = () if names is None else tuple(config[n] for n in names[num_args:])
        except KeyError as e:
            self.disable(f"argument {e} of the signature is neither passed nor chosen by the autotuner (a default)")
            return
        entry.compiled, entry.config, entry.tail = compiled, config, tail

    def _verify(self, entry: _Entry, args: tuple, device: int, grid) -> None:
        """Launches through Triton once more with a recorder around the compiled kernel's launcher."""
        compiled = entry.compiled
        calls = []
        with self._lock:
            real = getattr(compiled, "_run", None)

            def recorder(*a, **kw):
                if len(calls) < 2:
                    calls.append((a, kw))
                return real(*a, **kw)

            try:
                if real is None:
                    raise AttributeError("the compiled kernel has no initialised launcher (_run)")
                compiled._run = recorder
            except Exception as e:  # noqa: BLE001 - cannot watch Triton's launch: never launch directly
                self.disable(f"cannot record Triton's launch: {type(e).__name__}: {e}")
                self.kernel[grid](*args, **entry.kwargs)
                return
            try:
                returned = self.kernel[grid](*args, **entry.kwargs)
            finally:
                compiled._run = real
        if len(calls) > 1:
            return  # another thread launched the same kernel meanwhile: the record is ambiguous, verify next time
        grid = grid3(grid(entry.config) if callable(grid) else grid)
        why = self._mismatch(calls, returned, entry, args + entry.tail, grid, self.get_stream(device))
        if why is not None:
            self.disable(why)
        else:
            entry.function, entry.packed_metadata, entry.launcher = compiled.function, compiled.packed_metadata, real

    @staticmethod
    def _mismatch(calls: list, returned, entry: _Entry, args: tuple, grid: tuple, stream) -> str | None:
        """Why the recorded normal launch differs from what the fast path would do, or ``None`` if it does not."""
        compiled = entry.compiled
        if returned is not compiled:
            return "Triton picked another compiled kernel for the same launch key (the key misses a specialisation)"
        if not calls:
            return "Triton's launch did not go through the compiled kernel's launcher attribute (_run)"
        got, kwargs = calls[0]
        if kwargs or len(got) != 9 + len(args):
            return f"the launcher was called with {len(got)} positional arguments and {sorted(kwargs)} keywords"
        head = (*grid, stream, compiled.function, compiled.packed_metadata)
        for i, (a, b) in enumerate(zip(got[:6], head)):
            if type(a) is not type(b) or a != b:
                return f"launcher argument {i} differs: Triton passed {a!r}, the fast path would pass {b!r}"
        if not (_hook_idle(got[7]) and _hook_idle(got[8])):
            return "Triton passed active launch hooks"
        for i, (a, b) in enumerate(zip(got[9:], args)):
            if not (a is b or (type(a) is type(b) and not isinstance(a, torch.Tensor) and a == b)):
                return f"kernel argument {i} differs: Triton passed {a!r}, the fast path would pass {b!r}"
        return None

    # -- compiling before the first launch ----------------------------------------------------------------------

    def compile_ahead(self, grid, args: tuple, constexprs: dict, x: torch.Tensor) -> None:
        """Compiles, without launching, what ``self(grid, args, constexprs, x)`` would launch (every candidate of an
        autotuned kernel), through Triton's ``warmup``: inside a
        :func:`~lightning_attention.ops.lightning.compile_ahead.compile_together` block the build runs in a thread
        and this returns at once. Nothing to do for a CPU tensor, under the interpreter, or where this launcher's
        entry for the key already holds a compiled kernel."""
        index = x.get_device()  # -1 for a CPU tensor
        if not self.compiles or (index < 0 and self.cuda_only):
            return
        entry = self.entries.get(self._key(index, args, tuple(constexprs.items())))
        if entry is not None and entry.compiled is not None:
            return
        with on_device_of(x):
            self.kernel.warmup(*args, grid=grid, **constexprs)

    # -- bound launches -------------------------------------------------------------------------------------------

    def bind(self, grid, args: tuple, constexprs: dict, x: torch.Tensor) -> "BoundLaunch | None":
        """This call's launch fixed to its verified entry, for a caller that repeats it with other tensors of the same
        dtypes and alignments and the same other arguments (a cached chunk plan, ``ops/lightning/program.py``); None
        while the call would not take the fast path (not yet verified, disabled, a hook set, not CUDA)."""
        device = self.device_for(x)
        if device is None:
            return None
        entry = self.aliases.get(self._exact_key(device, args, tuple(constexprs.items())))
        if entry is None or entry.launcher is None:
            return None
        return BoundLaunch(self, entry, device, grid3(grid(entry.config) if callable(grid) else grid))


class BoundLaunch:
    """A :class:`Launcher` call whose entry was looked up once (:meth:`Launcher.bind`): each call only checks that
    the launcher is the one it was bound under (no reset or disable since), that no hook is set and that the device is
    current, then calls the compiled kernel's launcher. ``pointers``: the caller may pass the tensors as their
    addresses (ints), which spares Triton's launcher a device-pointer query per tensor; only for real compiled
    kernels (CUDA), whose launcher takes either."""

    __slots__ = ("device", "entry", "generation", "grid", "launcher", "pointers")

    def __init__(self, launcher: Launcher, entry: _Entry, device: int, grid: tuple):
        self.launcher, self.entry, self.device, self.grid = launcher, entry, device, grid
        self.pointers = launcher.cuda_only
        self.generation = launcher.generation

    def __call__(self, args: tuple, x: torch.Tensor) -> bool:
        """Launches and returns True, or returns False without launching (the caller then launches in full)."""
        launcher, device = self.launcher, self.device
        if launcher.generation != self.generation or not launcher.hooks_idle():
            return False
        if not settings.current().direct_launch or x.get_device() != device or launcher.get_device() != device:
            return False
        return launcher.launch_direct(self.entry, self.grid, args, device)
