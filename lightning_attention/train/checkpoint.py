"""Training checkpoints: one folder that is a transformers model folder and the state of an exact resume.

Layout of ``<out>/`` (``lightning-attention train --out <out>``)::

    config.json, generation_config.json   the model config (``save_pretrained``)
    model.safetensors                     the weights (``save_pretrained``)
    tokenizer.json, tokenizer_config.json the tokenizer (its ``save_pretrained``)
    training_state.pt                     optimizer, LR schedule, step, data position, RNG states, options, history;
                                          plain tensors and numbers, read with ``torch.load(weights_only=True)``
    checkpoint.json                       the manifest: format, step, and the size and SHA-256 of every file above
    previous/                             the checkpoint before this one (same layout), kept until the next save

``AutoModelForCausalLM.from_pretrained(out)`` / ``AutoTokenizer.from_pretrained(out)`` (after ``import
lightning_attention``), ``lightning-attention generate --checkpoint out`` and ``train --resume`` read it; the last
two verify every checksum first, so a truncated, zeroed, emptied or replaced file is reported as "checkpoint <out> is
corrupt/incomplete: ..." (safetensors alone does not notice zeroed bytes) instead of a traceback or silently wrong
weights, and a pickle is never executed.

A save never touches the last good checkpoint until the new one is complete: every file is written into a fresh
private folder inside ``<out>`` (``.staging-<random>``, so no fixed temporary name can be planted), flushed to disk
(fsync), hashed, and only then renamed into place, the manifest last; the checkpoint it replaces is first kept in
``previous/`` (hard links, no copy). A process killed while writing leaves the old checkpoint in place; killed in the
middle of the renames, the manifest no longer matches and ``previous/`` still holds the last good one.
"""

import contextlib
import hashlib
import json
import os
import random
import shutil
import tempfile

import torch

from lightning_attention.train.errors import UserError

FORMAT = "lightning-attention-checkpoint"
FORMAT_VERSION = 2
MANIFEST = "checkpoint.json"
TRAINING_STATE = "training_state.pt"
PREVIOUS = "previous"
STAGING_PREFIX = ".staging-"
LEGACY_FILE = "checkpoint.pt"  # the single-pickle format of earlier versions


class CheckpointError(UserError):
    """A checkpoint is missing, incomplete, corrupt, of an old format, or does not fit the requested run."""


# -- writing -------------------------------------------------------------------------------------------------------


def _fsync_file(path: str) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # makes the renames and new names inside the folder durable
    finally:
        os.close(fd)


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_manifest(folder: str, step: int) -> dict:
    files = sorted(f for f in os.listdir(folder) if f != MANIFEST and os.path.isfile(os.path.join(folder, f)))
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "step": step,
                "files": {f: {"bytes": os.path.getsize(os.path.join(folder, f)),
                              "sha256": sha256_of(os.path.join(folder, f))} for f in files}}
    path = os.path.join(folder, MANIFEST)
    with open(path, "w") as out:
        json.dump(manifest, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    return manifest


def save_checkpoint(out: str, model, tokenizer, training_state: dict, step: int) -> str:
    """Writes the checkpoint of ``step`` to the folder ``out`` as described in the module docstring; returns ``out``.

    Args:
        model: a transformers model (``save_pretrained`` writes config.json, model.safetensors and
            generation_config.json).
        tokenizer: its tokenizer (``save_pretrained``).
        training_state: plain data for ``torch.save`` (tensors, numbers, strings, lists, tuples, dicts).
    """
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):  # what a save killed earlier left behind
        if name.startswith(STAGING_PREFIX):
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)
    staging = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out)
    with no_progress_bars():
        model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    torch.save(training_state, os.path.join(staging, TRAINING_STATE))
    for name in os.listdir(staging):
        _fsync_file(os.path.join(staging, name))
    manifest = _write_manifest(staging, step)
    _fsync_dir(staging)

    old = _current_manifest(out)
    if old is not None:
        _keep_as_previous(out, old)
    for name in manifest["files"]:  # the data first, the manifest last: it is what makes the new files valid
        os.replace(os.path.join(staging, name), os.path.join(out, name))
    os.replace(os.path.join(staging, MANIFEST), os.path.join(out, MANIFEST))
    for name in set(old["files"]) - set(manifest["files"]) if old else ():
        os.remove(os.path.join(out, name))
    _fsync_dir(out)
    os.rmdir(staging)
    return out


def _current_manifest(out: str) -> dict | None:
    """The manifest of the checkpoint now in ``out`` if it verifies (a broken one must not replace ``previous/``)."""
    try:
        return verify_checkpoint(out)
    except CheckpointError:
        return None


def _keep_as_previous(out: str, manifest: dict) -> None:
    """Makes ``out/previous/`` the checkpoint now in ``out`` (hard links where the file system allows)."""
    fresh = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out)
    for name in [*manifest["files"], MANIFEST]:
        try:
            os.link(os.path.join(out, name), os.path.join(fresh, name))
        except OSError:
            shutil.copy2(os.path.join(out, name), os.path.join(fresh, name))
    _fsync_dir(fresh)
    previous = os.path.join(out, PREVIOUS)
    if os.path.isdir(previous):
        retired = tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out)
        os.replace(previous, os.path.join(retired, PREVIOUS))
        os.replace(fresh, previous)
        shutil.rmtree(retired)
    else:
        os.replace(fresh, previous)
    _fsync_dir(out)


# -- reading -------------------------------------------------------------------------------------------------------


def _corrupt(path: str, why: str) -> CheckpointError:
    message = f"checkpoint {path} is corrupt/incomplete: {why}"
    previous = os.path.join(path, PREVIOUS)
    if os.path.basename(os.path.normpath(path)) != PREVIOUS and os.path.isdir(previous):
        try:
            step = verify_checkpoint(previous)["step"]
            message += f". The previous checkpoint (step {step}) is intact in {previous}"
        except CheckpointError:
            pass
    return CheckpointError(message)


def _missing(path: str) -> CheckpointError:
    if os.path.isfile(os.path.join(path, LEGACY_FILE)) or (os.path.isfile(path) and path.endswith(".pt")):
        return CheckpointError(
            f"{path} holds a checkpoint of an earlier version of lightning_attention (a single pickle file, "
            f"{LEGACY_FILE}). It is not loaded: unpickling it could run arbitrary code. Train again with "
            "`lightning-attention train`, which writes a transformers folder with checksums.")
    if os.path.isdir(path):
        return CheckpointError(f"{path} holds no training checkpoint (no {MANIFEST}; write one with "
                               f"`lightning-attention train --out {path}`)")
    return CheckpointError(f"no checkpoint at {path}: train one with `lightning-attention train --out {path}`")


def verify_checkpoint(path: str) -> dict:
    """Checks the manifest of the checkpoint folder ``path`` against every file; returns the manifest.

    Raises :class:`CheckpointError` for a missing folder or manifest, an old pickle checkpoint, a file missing,
    of the wrong size or with the wrong SHA-256 (naming the file), or an unreadable manifest.
    """
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise _missing(path)
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
        files = manifest["files"]
        if manifest.get("format") != FORMAT or not isinstance(files, dict):
            raise ValueError("not a lightning-attention checkpoint manifest")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _corrupt(path, f"{MANIFEST} is unreadable ({type(exc).__name__}: {exc})") from None
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint {path} has format version {manifest.get('format_version')}; this "
                              f"version of lightning_attention reads version {FORMAT_VERSION}")
    for name, expected in files.items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise _corrupt(path, f"{name} is missing")
        size = os.path.getsize(file)
        if size != expected["bytes"]:
            raise _corrupt(path, f"{name} has {size} bytes, the manifest says {expected['bytes']}")
        if sha256_of(file) != expected["sha256"]:
            raise _corrupt(path, f"{name} does not match its SHA-256 checksum")
    return manifest


def load_training_state(path: str, map_location="cpu") -> dict:
    """The verified training state of the checkpoint folder ``path`` (never unpickles code: ``weights_only``)."""
    verify_checkpoint(path)
    try:
        return torch.load(os.path.join(path, TRAINING_STATE), map_location=map_location, weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to read it safely is a broken checkpoint
        raise _corrupt(path, f"{TRAINING_STATE} cannot be read safely ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0] if str(exc) else ''})") from None


def load_weights(model, path: str) -> None:
    """Loads ``path/model.safetensors`` (verified) into ``model``; tied weights saved once are restored by tying."""
    from safetensors.torch import load_file

    verify_checkpoint(path)
    try:
        weights = load_file(os.path.join(path, "model.safetensors"))
    except Exception as exc:  # noqa: BLE001
        raise _corrupt(path, f"model.safetensors cannot be read ({type(exc).__name__}: {exc})") from None
    missing, unexpected = model.load_state_dict(weights, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or ()) if model.config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise CheckpointError(f"checkpoint {path} does not fit the model: missing {sorted(set(missing) - tied)}, "
                              f"unexpected {sorted(unexpected)}")


def load_pretrained(path: str, device="cpu"):
    """``(model, tokenizer)`` from a checkpoint folder (verified first when it has a manifest) or any transformers
    folder of a causal LM; the model in eval mode on ``device``. A folder without tokenizer files gets the byte
    tokenizer when its vocabulary has 256 entries."""
    from transformers import AutoModelForCausalLM, AutoTokenizer  # knows "transnormer" (models/registration.py)

    from lightning_attention.train.tokenizer import BYTE_VOCAB, byte_tokenizer

    if os.path.isfile(os.path.join(path, MANIFEST)):
        verify_checkpoint(path)
    elif not os.path.isfile(os.path.join(path, "config.json")):
        raise _missing(path)
    with no_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(path).to(device).eval()
    if os.path.isfile(os.path.join(path, "tokenizer_config.json")) or os.path.isfile(
            os.path.join(path, "tokenizer.json")):
        tokenizer = AutoTokenizer.from_pretrained(path)
    elif model.config.vocab_size == BYTE_VOCAB:
        tokenizer = byte_tokenizer()
    else:
        raise CheckpointError(f"{path} has no tokenizer files and a vocabulary of {model.config.vocab_size} (only "
                              f"a {BYTE_VOCAB}-token model can fall back to the byte tokenizer)")
    return model, tokenizer


@contextlib.contextmanager
def no_progress_bars():
    """transformers' progress bars off for a moment: a small save or load needs none between training lines."""
    from transformers.utils import logging

    enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            logging.enable_progress_bar()


# -- RNG states ----------------------------------------------------------------------------------------------------


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
