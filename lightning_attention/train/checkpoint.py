"""Training checkpoints: everything an exact resume needs, in one file written atomically.

``<out>/checkpoint.pt`` holds: the architecture and its config dict, model and optimizer state, the step, the data
loader position, every RNG state (torch CPU and CUDA, Python), the training options and the loss history.
``lightning-attention generate --checkpoint <out>`` reads the same file.
"""

import os
import random

import torch

FORMAT_VERSION = 1
FILENAME = "checkpoint.pt"


def checkpoint_path(path: str) -> str:
    """``path`` itself if it is a file, else ``path/checkpoint.pt``."""
    return path if os.path.isfile(path) else os.path.join(path, FILENAME)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_checkpoint(path: str, **payload) -> str:
    """Writes ``payload`` (plus the format version) to ``path/checkpoint.pt`` atomically; returns the file path."""
    os.makedirs(path, exist_ok=True)
    target = os.path.join(path, FILENAME)
    tmp = target + ".tmp"
    torch.save({"format_version": FORMAT_VERSION, **payload}, tmp)
    os.replace(tmp, target)  # a crash mid-write never leaves a truncated checkpoint behind
    return target


def load_checkpoint(path: str, map_location="cpu") -> dict:
    """Reads a checkpoint file (or ``path/checkpoint.pt``)."""
    file = checkpoint_path(path)
    if not os.path.isfile(file):
        raise FileNotFoundError(f"no checkpoint at {file}")
    ckpt = torch.load(file, map_location=map_location, weights_only=False)
    if ckpt.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{file}: unsupported checkpoint format {ckpt.get('format_version')}")
    return ckpt


def load_model(path: str, device="cpu"):
    """``(model, checkpoint)`` from a checkpoint: the model in eval mode on ``device``."""
    from lightning_attention.models.presets import model_from_config

    ckpt = load_checkpoint(path)
    model = model_from_config(ckpt["arch"], ckpt["model_config"])
    model.load_state_dict(ckpt["model"])
    return model.to(device).eval(), ckpt
