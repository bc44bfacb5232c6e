"""The GPU's SM clock while a measurement runs, and whether its power cap was lowering it.

A GPU that reaches its power limit lowers its SM clock (on the H200 from 1,980 MHz to 1,600-1,700 MHz at 700 W), and
a call bound by its arithmetic slows with it: the same call on the same machine then takes more or less time with
what ran before it, and GPUs of one model that settle at different clocks under the cap disagree
(docs/kernels.md, "The power cap"). A :class:`Sampler` polls ``nvidia-smi`` in the background (PyTorch reads clocks
only through the optional NVML bindings; ``nvidia-smi`` ships with every driver) and gives each measurement the
samples of its own window: the mean and lowest SM clock, the mean power draw and the share of samples with the
software power cap active.
"""

import functools
import shutil
import statistics
import subprocess
import threading
import time

import torch

SAMPLE_MS = 50
FIELDS = "clocks.sm,power.draw,clocks_throttle_reasons.sw_power_cap"

# (monotonic seconds, SM MHz, watts, power-capped)
Sample = tuple[float, float, float, bool]


def parse_sample(line: str) -> tuple[float, float, bool] | None:
    """One ``nvidia-smi`` line of :data:`FIELDS` (csv, no header, no units) -> (SM MHz, watts, power-capped), or None
    for a line that is not one (a field the driver reports as N/A)."""
    parts = [p.strip() for p in line.split(",")]
    if len(parts) != 3:
        return None
    try:
        return float(parts[0]), float(parts[1]), parts[2] == "Active"
    except ValueError:
        return None


def summarise_window(samples: list[Sample]) -> dict:
    """Samples -> ``samples`` (their number), ``sm_mhz_mean``, ``sm_mhz_min``, ``watts_mean`` and ``capped_share``
    (the share of samples under the power cap); only ``samples`` when there are none."""
    if not samples:
        return {"samples": 0}
    clocks = [s[1] for s in samples]
    return {
        "samples": len(samples),
        "sm_mhz_mean": round(statistics.fmean(clocks), 1),
        "sm_mhz_min": min(clocks),
        "watts_mean": round(statistics.fmean(s[2] for s in samples), 1),
        "capped_share": round(sum(s[3] for s in samples) / len(samples), 3),
    }


@functools.lru_cache(maxsize=None)
def _smi_target(exe: str, device: torch.device) -> str:
    """How ``nvidia-smi -i`` names ``device``: its UUID where PyTorch reports one that nvidia-smi knows
    (CUDA_VISIBLE_DEVICES renumbers the devices PyTorch sees, not those nvidia-smi lists), else its index. Asked once
    per device (:func:`start` and :func:`limits` both need it)."""
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    if uuid:
        target = f"GPU-{uuid}"
        cmd = [exe, "-i", target, "--query-gpu=index", "--format=csv,noheader"]
        try:
            subprocess.run(cmd, capture_output=True, timeout=10, check=True)
            return target
        except (OSError, subprocess.SubprocessError):
            pass
    return str(device.index or 0)


def limits(device: torch.device) -> dict | None:
    """The power limit in force and the top SM clock, as ``nvidia-smi`` reports them; None without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None or device.type != "cuda":
        return None
    fields = "power.limit,clocks.max.sm"
    cmd = [exe, "-i", _smi_target(exe, device), f"--query-gpu={fields}", "--format=csv,noheader"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return dict(zip(fields.split(","), (v.strip() for v in out.split(","))))


class Sampler:
    """``nvidia-smi`` polling one GPU every :data:`SAMPLE_MS` ms in a background process; a reader thread keeps the
    samples. :meth:`window` summarises those taken between two ``time.monotonic()`` readings. Use :func:`start`."""

    def __init__(self, exe: str, target: str):
        cmd = [exe, "-i", target, f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits", f"-lms={SAMPLE_MS}"]
        self.samples: list[Sample] = []
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            sample = parse_sample(line)
            if sample is not None:
                self.samples.append((time.monotonic(), *sample))

    def window(self, t0: float, t1: float) -> dict:
        """:func:`summarise_window` of the samples taken from ``t0`` to ``t1`` (``time.monotonic()`` seconds)."""
        return summarise_window([s for s in self.samples if t0 <= s[0] <= t1])

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        self.reader.join(timeout=5)


def start(device: torch.device) -> Sampler | None:
    """A running :class:`Sampler` for a CUDA ``device``, or None where there is nothing to sample (a CPU device, no
    nvidia-smi): the measurement then records no clock."""
    exe = shutil.which("nvidia-smi")
    if exe is None or device.type != "cuda":
        return None
    try:
        return Sampler(exe, _smi_target(exe, device))
    except OSError:
        return None
