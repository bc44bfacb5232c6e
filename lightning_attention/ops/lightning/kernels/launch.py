"""Direct kernel launches: a compiled Triton kernel launched without ``JITFunction.run`` once Triton has shown how.

Why. ``JITFunction.run`` (and ``Autotuner.run`` in front of it) spends tens of µs of host time per launch binding
and specialising every argument, building string keys and looking up caches; the walk kernel has ~55 arguments.
On an H100 host a chunk fwd+bwd spent ~1.5 ms of host time for 0.6-1.2 ms of GPU time, ~2.6 ms on the segmented
path (8 launches; ``benchmarks/NOTES-kernels.md``), and a batch-1 decode step ~48 µs for 6.8 µs of GPU time.

How. :class:`LaunchCache` keeps, per launch key (the caller's: never coarser than Triton's specialisation), the
``CompiledKernel`` that Triton's normal launch returned and then calls its launcher itself, passing exactly what
``JITFunction.run`` passes (triton 3.4 to 3.8)::

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
configuration pre-hook — disables the fast path of that cache for good (with one warning) and that call and every
later one go through Triton's normal launch. A new key always starts again with Triton's launch.

What the fast path leaves out of ``JITFunction.run``: launch hooks and ``pre_run_hooks`` (it steps aside while
any is set), the async-compile mode (a future is never kept), and knobs that change Triton's compile options
(``TRITON_DEBUG``, instrumentation): they are honoured when a key is first seen; call :meth:`LaunchCache.reset`
after changing them mid-process. The stream is read on every call (Triton's own ``get_current_stream``), so
launches follow ``torch.cuda.stream(...)`` and CUDA-graph capture. Under ``TRITON_INTERPRET=1`` there is nothing
compiled to reuse and every launch goes through the interpreter.

``LIGHTNING_ATTENTION_DIRECT_LAUNCH=0`` (read when a cache is created or reset) turns the fast path off: every
launch goes through Triton (side-by-side host-time measurements, debugging).
"""

import os
import threading
import warnings

import torch
import triton
from triton.runtime.jit import JITFunction


def _hook_idle(hook) -> bool:
    """A launch hook that does nothing: ``None`` (older Triton) or an empty ``HookChain`` (newer Triton)."""
    return hook is None or (type(hook).__name__ == "HookChain" and not hook.calls)


def jit_function(kernel):
    """The ``JITFunction`` under an ``Autotuner`` (or a heuristics wrapper), or ``kernel`` itself."""
    while not isinstance(kernel, JITFunction) and hasattr(kernel, "fn"):
        kernel = kernel.fn
    return kernel


ENV_DIRECT_LAUNCH = "LIGHTNING_ATTENTION_DIRECT_LAUNCH"
_I32 = range(-(2**31), 2**31)


def specialization_key(args: tuple) -> tuple:
    """What Triton's specialisation can see of run-time arguments, never less: a tensor's dtype and 16-byte alignment;
    an int's ``== 1``, divisibility by 16 and int32 range (finer than Triton for ``do_not_specialize`` ints, which
    then just take a few more keys); any other value by its type (floats are never specialised)."""
    return tuple(
        (a.dtype, not a.data_ptr() & 15)
        if isinstance(a, torch.Tensor)
        else (a == 1, not a % 16, a in _I32)
        if type(a) is int
        else type(a)
        for a in args
    )


class _Entry:
    """One launch key: how Triton is called for it and, once seen and verified, the compiled kernel's launcher.

    ``grid``: a fixed grid (or None when the caller passes one per call); ``kwargs``: the keyword arguments of the
    normal launch (constexprs, num_warps); ``meta``: the caller's (e.g. constexprs it appends to the arguments);
    ``config``: the constexprs by name once known (the caller's plus the autotuner's choice: what a grid function
    gets); ``tail``: the arguments after the caller's positional ones, in signature order, for the direct call.
    """

    __slots__ = ("compiled", "config", "function", "grid", "kwargs", "launcher", "meta", "packed_metadata", "tail")

    def __init__(self, grid, kwargs: dict, meta: tuple = ()):
        self.grid, self.kwargs, self.meta = grid, kwargs, meta
        self.compiled = None  # the CompiledKernel Triton's normal launch returned for this key
        self.config, self.tail = kwargs, ()
        self.launcher = self.function = self.packed_metadata = None  # set once verified


def _grid3(grid: tuple) -> tuple[int, int, int]:
    return grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1


class LaunchCache:
    """Launches a ``@triton.jit`` (or ``@triton.autotune``) kernel's compiled binary directly (module docstring).

    Callers build their own key (see :func:`specialization_key`), then ``entry = cache.entries.get(key) or
    cache.add(key, grid, kwargs)`` and ``cache.launch(entry, args, device, grid)``; :meth:`device_for` says whether
    a call may take this path at all.
    """

    cuda_only = True

    def __init__(self, kernel, max_entries: int = 256, name: str = "kernel"):
        self.kernel, self.max_entries, self.name = kernel, max_entries, name
        self.jit = jit_function(kernel)
        self.autotuned = self.jit is not kernel
        self._lock = threading.Lock()  # one verification at a time (it swaps the kernel's launcher for a recorder)
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
        compiled = isinstance(self.jit, JITFunction)
        self.disabled: str | None = None if compiled else "the kernel is not a compiled JITFunction (interpreter)"
        if os.environ.get(ENV_DIRECT_LAUNCH, "1").strip() == "0":
            self.disabled = f"{ENV_DIRECT_LAUNCH}=0"

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

    def _bind(self) -> bool:
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

    def device_for(self, x: torch.Tensor, scale=0.0) -> int | None:
        """The current CUDA device index when this call may take the fast path, else ``None``.

        Not for a disabled cache, CPU tensors (unless :attr:`cuda_only` is off: CPU tests drive a fake kernel), a
        non-float ``scale`` (the key treats it as a float), a set launch or pre-run hook, or ``x`` on a device other
        than the current one (Triton launches on the current device; the normal path switches to x's).
        """
        if self.disabled is not None or type(scale) is not float:
            return None
        index = x.get_device()  # -1 for a CPU tensor
        if index < 0 and self.cuda_only:
            return None
        if self.get_device is None and not self._bind():
            return None
        if not self.hooks_idle():
            return None
        return index if index == self.get_device() else None

    def add(self, key: tuple, grid, kwargs: dict, meta: tuple = ()) -> _Entry:
        """A new entry for ``key`` (the dict is bounded: past :attr:`max_entries` it starts over)."""
        if len(self.entries) >= self.max_entries:
            self.entries.clear()
        entry = self.entries[key] = _Entry(grid, kwargs, meta)
        return entry

    def alias(self, exact_key: tuple, entry: _Entry) -> None:
        """Lets ``aliases[exact_key]`` find ``entry``: a key finer than the entry's own, cheaper to build (bounded
        like the entries; an alias is only ever a shortcut to an entry of the same specialisation)."""
        if len(self.aliases) >= 4 * self.max_entries:
            self.aliases.clear()
        self.aliases[exact_key] = entry

    def launch(self, entry: _Entry, args: tuple, device: int, grid=None) -> None:
        """Launches ``kernel[grid](*args, **entry.kwargs)``: directly when verified, else through Triton (and learns).

        ``grid``: a tuple or a function of the constexprs (as Triton takes it); None: the entry's fixed grid.
        """
        grid = entry.grid if grid is None else grid
        if entry.launcher is not None:
            grid3 = _grid3(grid(entry.config) if callable(grid) else grid)
            if self.launch_direct(entry, grid3, args, device):
                return
            # rejected: the normal launch below is this call's only launch
        if self.disabled is None and entry.compiled is not None:
            self._verify(entry, args, device, grid)
            return
        compiled = self.kernel[grid](*args, **entry.kwargs)
        if self.disabled is None:
            self._adopt(entry, compiled, len(args))

    def launch_direct(self, entry: _Entry, grid3: tuple, args: tuple, device: int) -> bool:
        """Calls a verified entry's compiled launcher; False (and the fast path disabled) when the launcher rejects
        its arguments, which it does while parsing them, before anything is launched."""
        try:
            entry.launcher(
                *grid3, self.get_stream(device), entry.function, entry.packed_metadata, None, None, None,
                *args, *entry.tail,
            )  # fmt: skip
        except (TypeError, AttributeError) as e:
            self.disable(f"the compiled kernel's launcher rejected the direct call: {type(e).__name__}: {e}")
            return False
        return True

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
        grid3 = _grid3(grid(entry.config) if callable(grid) else grid)
        why = self._mismatch(calls, returned, entry, args + entry.tail, grid3, self.get_stream(device))
        if why is not None:
            self.disable(why)
        else:
            entry.function, entry.packed_metadata, entry.launcher = compiled.function, compiled.packed_metadata, real

    @staticmethod
    def _mismatch(calls: list, returned, entry: _Entry, args: tuple, grid3: tuple, stream) -> str | None:
        """Why the recorded normal launch differs from what the fast path would do, or ``None`` if it does not."""
        compiled = entry.compiled
        if returned is not compiled:
            return "Triton picked another compiled kernel for the same launch key (the key misses a specialisation)"
        if not calls:
            return "Triton's launch did not go through the compiled kernel's launcher attribute (_run)"
        got, kwargs = calls[0]
        if kwargs or len(got) != 9 + len(args):
            return f"the launcher was called with {len(got)} positional arguments and {sorted(kwargs)} keywords"
        head = (*grid3, stream, compiled.function, compiled.packed_metadata)
        for i, (a, b) in enumerate(zip(got[:6], head)):
            if type(a) is not type(b) or a != b:
                return f"launcher argument {i} differs: Triton passed {a!r}, the fast path would pass {b!r}"
        if not (_hook_idle(got[7]) and _hook_idle(got[8])):
            return "Triton passed active launch hooks"
        for i, (a, b) in enumerate(zip(got[9:], args)):
            if not (a is b or (type(a) is type(b) and not isinstance(a, torch.Tensor) and a == b)):
                return f"kernel argument {i} differs: Triton passed {a!r}, the fast path would pass {b!r}"
        return None


class DirectLauncher:
    """``kernel[grid](*args, **constexprs)`` for a call site whose kernel takes run-time arguments positionally and
    constexprs by keyword: through a :class:`LaunchCache` keyed by the device, :func:`specialization_key` of the
    run-time arguments and the constexprs (names and values), so one entry serves every sequence length and batch.

    ``args``: the tensors first (the same number at every call of a call site), then ints and floats.
    ``grid``: a tuple, or a function of the constexprs (it gets the autotuner's choice too, e.g. ``meta["BV"]``).
    ``x``: a tensor of the launch (its device must be the current one); CPU tensors, the interpreter and set launch
    hooks go through Triton's normal launch as they are.

    Repeated calls of the same shapes (a training loop) find their entry by an exact key instead: each tensor's dtype
    and address modulo 16 and the other arguments' raw values. It is finer than the specialisation key and costs
    ~1 µs to build against ~9 µs for :func:`specialization_key` over the walk's ~40 arguments (CPU, Python 3.11).
    """

    def __init__(self, kernel, name: str):
        self.cache = LaunchCache(kernel, name=name)
        self.num_tensors: int | None = None  # the leading tensors of ``args``, counted at the first fast call

    def __call__(self, grid, args: tuple, constexprs: dict, x: torch.Tensor) -> None:
        cache = self.cache
        device = cache.device_for(x)
        if device is None:
            cache.kernel[grid](*args, **constexprs)
            return
        constants = tuple(constexprs.items())
        exact = self._exact_key(device, args, constants)
        entry = cache.aliases.get(exact)
        if entry is None:
            key = (device, specialization_key(args), *constants)
            entry = cache.entries.get(key)
            if entry is None:
                entry = cache.add(key, None, constexprs)
            cache.alias(exact, entry)
        cache.launch(entry, args, device, grid)

    def _exact_key(self, device: int, args: tuple, constants: tuple) -> tuple:
        n = self.num_tensors
        if n is None:
            n = self.num_tensors = next((i for i, a in enumerate(args) if not isinstance(a, torch.Tensor)), len(args))
        return (device, *[(a.dtype, a.data_ptr() & 15) for a in args[:n]], args[n:], constants)

    def bind(self, grid, args: tuple, constexprs: dict, x: torch.Tensor) -> "BoundLaunch | None":
        """This call's launch fixed to its verified entry, for a caller that repeats it with other tensors of the
        same dtypes and alignments and the same other arguments (ops/lightning/replay.py); None while the call would
        not take the fast path (not yet verified, disabled, a hook set, not CUDA)."""
        cache = self.cache
        device = cache.device_for(x)
        if device is None:
            return None
        entry = cache.aliases.get(self._exact_key(device, args, tuple(constexprs.items())))
        if entry is None or entry.launcher is None:
            return None
        grid3 = _grid3(grid(entry.config) if callable(grid) else grid)
        return BoundLaunch(cache, entry, device, grid3, pointers=cache.cuda_only)


class BoundLaunch:
    """A :class:`DirectLauncher` call whose entry was looked up once (:meth:`DirectLauncher.bind`): each call only
    checks that the cache is the one it was bound under (no reset or disable since), that no hook is set and that the
    device is current, then calls the compiled kernel's launcher. ``pointers``: the caller passes the tensors as
    their addresses (ints), which spares Triton's launcher a device-pointer query per tensor; only for real compiled
    kernels (CUDA), whose launcher takes either."""

    __slots__ = ("cache", "device", "entry", "generation", "grid3", "pointers")

    def __init__(self, cache: LaunchCache, entry: _Entry, device: int, grid3: tuple, pointers: bool):
        self.cache, self.entry, self.device, self.grid3, self.pointers = cache, entry, device, grid3, pointers
        self.generation = cache.generation

    def __call__(self, args: tuple, x: torch.Tensor) -> bool:
        """Launches and returns True, or returns False without launching (the caller then launches in full)."""
        cache, device = self.cache, self.device
        if cache.generation != self.generation or not cache.hooks_idle():
            return False
        if x.get_device() != device or cache.get_device() != device:
            return False
        return cache.launch_direct(self.entry, self.grid3, args, device)
