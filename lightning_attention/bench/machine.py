"""The machine line that heads every benchmark output: GPU, driver, CUDA, torch, triton, baseline versions, date."""

import datetime
import hashlib
import importlib.metadata
import os
import pathlib
import platform
import shutil
import subprocess

import torch

from lightning_attention import settings

# (label, distribution names to try): the wheels are named fla_core / lightning_attn
_PACKAGES = (
    ("triton", ("triton",)),
    ("fla", ("fla-core", "fla_core", "flash-linear-attention")),
    ("lightning_attn", ("lightning_attn", "lightning-attn")),
    ("lightning_attention", ("lightning-attention", "lightning_attention")),
)


def package_version(distributions: tuple[str, ...]) -> str | None:
    """Installed version of the first distribution found, or None."""
    for name in distributions:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _driver_version() -> str | None:
    # torch does not expose the driver version; nvidia-smi does (and is absent on CPU machines)
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def _git_revision() -> str | None:
    """Short commit of the checkout the package was imported from, with ``+modified`` when tracked files differ from
    it (a working tree copied onto a GPU machine keeps the commit it was made from); None outside a git checkout."""
    exe = shutil.which("git")
    if exe is None:
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        out = subprocess.run(
            [exe, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10, check=True, cwd=here
        ).stdout
        modified = subprocess.run(
            [exe, "diff", "--quiet", "HEAD", "--"], capture_output=True, timeout=30, check=False, cwd=here
        )  # exit status 1: tracked files differ
    except (OSError, subprocess.SubprocessError):
        return None
    rev = out.strip()
    if not rev:
        return None
    return rev + "+modified" if modified.returncode == 1 else rev


def source_digest(root: str | os.PathLike | None = None) -> str:
    """The first 16 hex digits of a sha256 over the Python sources of the package at ``root`` (default: the one
    imported), each file's path and bytes in path order: which code ran, where the ``git`` field cannot say (a
    working tree copied onto a GPU machine keeps older git metadata). For a commit's digest, run this on its
    ``git archive <commit> lightning_attention`` unpacked."""
    if root is None:
        import lightning_attention

        root = pathlib.Path(lightning_attention.__file__).parent
    root = pathlib.Path(root)
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def machine_info(device: torch.device | str) -> dict:
    """Everything that decides what a timing means, as a JSON-ready dict."""
    device = torch.device(device)
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": str(device),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0") == "1",
        "backend": settings.current().backend,
    }
    for label, dists in _PACKAGES:
        info[label] = package_version(dists)
    if info["lightning_attention"] is None:  # run from a checkout on PYTHONPATH (the GPU machine), not installed
        import lightning_attention

        info["lightning_attention"] = lightning_attention.__version__
    info["git"] = _git_revision()
    info["source_sha256"] = source_digest()
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = props.name
        info["gpu_memory_gb"] = round(props.total_memory / 2**30, 1)
        info["compute_capability"] = f"{props.major}.{props.minor}"
        info["sm_count"] = props.multi_processor_count
        info["driver"] = _driver_version()
    else:
        info["gpu"] = None
        info["driver"] = None
    return info


def machine_line(info: dict) -> str:
    """One line, e.g. ``NVIDIA H100 80GB HBM3 | driver 550.54 | CUDA 12.4 | torch 2.11 | triton 3.6 | fla 0.6.0 …``."""
    where = info["gpu"] if info.get("gpu") else f"CPU {info['cpu']} x{info['cpu_count']}"
    parts = [where]
    if info.get("gpu"):
        parts.append(f"driver {info.get('driver') or 'n/a'}")
        parts.append(f"CUDA {info.get('cuda') or 'n/a'}")
    parts.append(f"torch {info['torch']}")
    parts.append(f"triton {info.get('triton') or 'not installed'}")
    parts.append(f"fla {info.get('fla') or 'not installed'}")
    parts.append(f"lightning_attn {info.get('lightning_attn') or 'not installed'}")
    parts.append(f"lightning_attention {info.get('lightning_attention') or 'n/a'}")
    if info.get("triton_interpret"):
        parts.append("TRITON_INTERPRET=1")
    parts.append(info["date"])
    return " | ".join(parts)
