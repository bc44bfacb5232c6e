"""Every ``LIGHTNING_ATTENTION_*`` setting, read from the environment once, at import.

Users set three of them (the README lists them):

``LIGHTNING_ATTENTION_BACKEND`` — ``auto`` (Triton kernels on CUDA tensors, the PyTorch path on CPU tensors),
``triton`` (the kernels everywhere; on CPU tensors under Triton's interpreter, ``TRITON_INTERPRET=1`` set before
import) or ``torch``.
``LIGHTNING_ATTENTION_DEBUG`` — ``1`` also runs, on CUDA tensors, the value checks that need a device->host copy.
``LIGHTNING_ATTENTION_PRECISION`` — ``input`` (default: the kernels' fp32 intermediates meet the tensor cores rounded
to the input dtype, as FLA's do) or ``split`` (carried as two halves: bf16 / fp16 results at the rounding floor of
the output dtype, at some cost in speed; docs/design.md, "Precision").

The others are tuning knobs for maintainers (CONTRIBUTING.md, "Tuning knobs"): pinned kernel configurations, forced
segment lengths, the kernel variants to take or avoid. Code never reads the environment itself: it asks
:func:`current`. Tests and benchmarks change settings with :func:`override`, which takes effect at the next call
(plans are cached per settings value, so nothing stale survives an override).
"""

import contextlib
import dataclasses
import os
import threading
import warnings
from collections.abc import Iterator, Mapping

PREFIX = "LIGHTNING_ATTENTION_"
BACKENDS = ("auto", "triton", "torch")
BF16_INTER_MODES = ("input", "tf32")
PRECISIONS = ("input", "split")
# variables that no longer do anything: a user who still sets one is told once
REMOVED = {
    "LIGHTNING_ATTENTION_REPLAY": "launches are planned once per shape and repeated from the cached plan; CUDA "
    "graphs (docs/kernels.md, 'Host overhead') remove the rest of the host time",
}


@dataclasses.dataclass(frozen=True)
class KernelPin:
    """One launch configuration of the chunk walks, pinned instead of tuned: tokens per chunk ``BT``, value tile
    ``BV``, warps and pipeline stages. Written ``BT=64,BV=64,num_warps=4,num_stages=1`` in the environment."""

    BT: int = 64
    BV: int = 64
    num_warps: int = 4
    num_stages: int = 1

    @classmethod
    def parse(cls, text: str) -> "KernelPin":
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {}
        for item in text.split(","):
            if not item.strip():
                continue
            key, _, value = item.partition("=")
            key = key.strip()
            if key not in fields:
                raise ValueError(f"{PREFIX}KERNEL_CONFIG: unknown key {key!r} in {text!r}; keys are {sorted(fields)}")
            values[key] = _int(f"{PREFIX}KERNEL_CONFIG's {key}", value)
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The library's settings (module docstring). Hashable: the chunk plans are cached per value.

    User settings:
        backend: ``"auto"`` | ``"triton"`` | ``"torch"``.
        debug: value checks that need a device->host copy run on CUDA tensors too.
        precision: ``"input"`` | ``"split"``: how the chunk walks' fp32 operands meet the tensor cores (16-bit inputs).
    Tuning knobs (``CONTRIBUTING.md``):
        kernel_config: a :class:`KernelPin` for every chunk walk instead of autotuning, or None.
        segment_len: tokens per segment of the long-sequence path (0: never segment), or None: the plan's choice.
        prepass_len: tokens per pre-pass piece (a multiple of 16 dividing the segment; 0: the segments), or None.
        fused_dkdv: dk and dv from one fused reverse walk (True) or two walks (False); None: the plan's choice (the
            two-warpgroup walk at K = V = 128 in bf16 on sm_90, the Triton walk at head dims of 64 with tensor
            descriptors; docs/kernels.md, "The fused dk/dv walk").
        bf16_inter: operand precision of the bf16 inter-chunk product with the fp32 state: ``"input"`` | ``"tf32"``.
        gluon: the two-warpgroup walk where it applies (K = 128 and 256, bf16, sm_90).
        tma: tensor descriptors where the inputs meet their alignment rules.
        direct_launch: compiled kernels launched directly once verified, instead of through Triton's launcher.
        tuned_table: autotuned launches take the configuration measured for their shape class on this GPU
            architecture where one is shipped (``kernels/tuned.py``), instead of autotuning.
        compile_ahead: a problem's first call compiles all its kernels (and, when gradients are needed, its
            backward's) at once in threads before launching (``ops/lightning/compile_ahead.py``), instead of each at
            its first launch.
    """

    backend: str = "auto"
    debug: bool = False
    precision: str = "input"
    kernel_config: KernelPin | None = None
    segment_len: int | None = None
    prepass_len: int | None = None
    fused_dkdv: bool | None = None
    bf16_inter: str = "input"
    gluon: bool = True
    tma: bool = True
    direct_launch: bool = True
    tuned_table: bool = True
    compile_ahead: bool = True

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"{PREFIX}BACKEND must be one of {BACKENDS}, got {self.backend!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"{PREFIX}PRECISION must be one of {PRECISIONS}, got {self.precision!r}")
        if self.bf16_inter not in BF16_INTER_MODES:
            raise ValueError(f"{PREFIX}BF16_INTER must be one of {BF16_INTER_MODES}, got {self.bf16_inter!r}")
        if self.segment_len is not None and (self.segment_len < 0 or self.segment_len % 16):
            raise ValueError(f"{PREFIX}SEGMENT_LEN must be 0 or a positive multiple of 16, got {self.segment_len}")
        if self.prepass_len is not None and (self.prepass_len < 0 or self.prepass_len % 16):
            raise ValueError(f"{PREFIX}PREPASS_LEN must be 0 or a positive multiple of 16, got {self.prepass_len}")


def _int(name: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {text!r}") from None


def _flag(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(f"{name} must be 0 or 1, got {text!r}")


def from_environment(environ: Mapping[str, str] = os.environ) -> Settings:
    """The settings that ``environ`` gives (unset variables keep their defaults); raises ValueError naming a variable
    with an invalid value."""

    def get(name: str) -> str | None:
        value = environ.get(PREFIX + name)
        return None if value is None or not value.strip() else value

    values: dict = {}
    if (text := get("BACKEND")) is not None:
        values["backend"] = text.strip().lower()
    if (text := get("DEBUG")) is not None:
        values["debug"] = _flag(PREFIX + "DEBUG", text)
    if (text := get("KERNEL_CONFIG")) is not None:
        values["kernel_config"] = KernelPin.parse(text)
    for name, field in (("SEGMENT_LEN", "segment_len"), ("PREPASS_LEN", "prepass_len")):
        if (text := get(name)) is not None:
            values[field] = _int(PREFIX + name, text)
    if (text := get("DKDV")) is not None:
        values["fused_dkdv"] = None if text.strip().lower() == "auto" else _flag(PREFIX + "DKDV", text)
    for name, field in (("GLUON", "gluon"), ("TMA", "tma"), ("DIRECT_LAUNCH", "direct_launch"),
                        ("TUNED_TABLE", "tuned_table"), ("COMPILE_AHEAD", "compile_ahead")):
        if (text := get(name)) is not None:
            values[field] = _flag(PREFIX + name, text)
    for name, field in (("BF16_INTER", "bf16_inter"), ("PRECISION", "precision")):
        if (text := get(name)) is not None:
            values[field] = text.strip().lower()
    return Settings(**values)


def _warn_removed(environ: Mapping[str, str]) -> None:
    for name, why in REMOVED.items():
        if name in environ:
            warnings.warn(f"{name} is set but no longer has an effect: {why}", FutureWarning, stacklevel=3)


_lock = threading.Lock()
_current = from_environment()
_warn_removed(os.environ)


def current() -> Settings:
    """The settings in force (the environment's at import, unless an :func:`override` is active)."""
    return _current


@contextlib.contextmanager
def override(**changes) -> Iterator[Settings]:
    """Within the ``with`` block, the current settings with ``changes`` applied (validated like the environment's)::

        with settings.override(backend="triton", segment_len=64):
            ...

    Process-wide (not per thread): for tests and benchmarks. ``kernel_config`` takes a :class:`KernelPin` or its
    text form.
    """
    global _current
    if isinstance(changes.get("kernel_config"), str):
        changes["kernel_config"] = KernelPin.parse(changes["kernel_config"])
    with _lock:
        previous = _current
        _current = dataclasses.replace(previous, **changes)
    try:
        yield _current
    finally:
        with _lock:
            _current = previous
