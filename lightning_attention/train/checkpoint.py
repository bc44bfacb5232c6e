"""Training checkpoints: one folder that is a transformers model folder and the state of an exact resume.

Layout of ``<out>/`` (``lightning-attention train --out <out>``)::

    config.json, generation_config.json   the model config (``save_pretrained``)
    model.safetensors                     the full weights (``save_pretrained``; gathered to rank 0 under FSDP2)
    tokenizer.json, tokenizer_config.json the tokenizer (its ``save_pretrained``)
    training_state.pt                     LR schedule, step, data position, RNG states, options, history, the
                                          optimizer's hyperparameters; plain tensors and numbers, read with
                                          ``torch.load(weights_only=True)``
    optimizer/                            the AdamW state, sharded: safetensors files written by every rank and
                                          readable at any world size (see
                                          :mod:`~lightning_attention.train.optimizer_state`)
    checkpoint.json                       the manifest: format, step, and the size and SHA-256 of every file above
                                          (files in subfolders by their relative path, e.g. ``optimizer/shard-...``)
    previous/                             the checkpoint before this one (same layout), kept until the next save

``AutoModelForCausalLM.from_pretrained(out)`` / ``AutoTokenizer.from_pretrained(out)`` (after ``import
lightning_attention``), ``lightning-attention generate --checkpoint out`` and ``train --resume`` read it; the last
two verify every checksum first, so a truncated, zeroed, emptied or replaced file is reported as "checkpoint <out> is
corrupt/incomplete: ..." (safetensors alone does not notice zeroed bytes) instead of a traceback or silently wrong
weights, and a pickle is never executed. A file that the manifest does not list in one of its subfolders is an error
too: the optimizer's reader takes every file of its folder.

A save never touches the last good checkpoint until the new one is complete: every file is written into a fresh
private folder inside ``<out>`` (``.staging-<random>``, so no fixed temporary name can be planted; under torchrun
rank 0 creates it and every rank writes its optimizer shard there: across machines ``<out>`` must be on a file system
they share), flushed to disk (fsync), hashed, and only then
renamed into place, the manifest last; the checkpoint it replaces is first kept in ``previous/`` (hard links, no
copy). A process killed while writing leaves the old checkpoint in place; killed in the middle of the renames, the
manifest no longer matches and ``previous/`` still holds the last good one.
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


def _relative_files(folder: str) -> list[str]:
    """Every file under ``folder`` (``previous/`` and staging folders excepted) as a sorted ``/``-separated path."""
    found = []
    for root, dirs, files in os.walk(folder):
        rel = os.path.relpath(root, folder)
        if rel == ".":
            dirs[:] = [d for d in dirs if d != PREVIOUS and not d.startswith(STAGING_PREFIX)]
        found += [f if rel == "." else f"{rel.replace(os.sep, '/')}/{f}" for f in files]
    return sorted(found)


def _write_manifest(folder: str, step: int) -> dict:
    files = [f for f in _relative_files(folder) if f != MANIFEST]
    manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "step": step,
                "files": {f: {"bytes": os.path.getsize(os.path.join(folder, f)),
                              "sha256": sha256_of(os.path.join(folder, f))} for f in files}}
    path = os.path.join(folder, MANIFEST)
    with open(path, "w") as out:
        json.dump(manifest, out, indent=1)
        out.flush()
        os.fsync(out.fileno())
    return manifest


def save_checkpoint(out: str, step: int, write_files, *, distributed: bool = False) -> str:
    """Writes the checkpoint of ``step`` to the folder ``out`` as described in the module docstring; returns ``out``.

    ``write_files(staging)`` writes the checkpoint's files into the private folder ``staging``. With
    ``distributed``, every rank of the default process group calls this function: rank 0 creates the folder, every
    rank's ``write_files`` writes into it (e.g. its optimizer shard), and rank 0 makes the result the checkpoint once
    all have finished. Use :func:`write_model_files` for the transformers files and the training state.
    """
    import torch.distributed as dist

    main = not distributed or dist.get_rank() == 0
    staging = _new_staging(out) if main else None
    if distributed:
        payload = [staging]
        dist.broadcast_object_list(payload, src=0)
        staging = payload[0]
    write_files(staging)
    if distributed:
        dist.barrier()  # every rank's files are written
    if main:
        _commit(out, staging, step)
    if distributed:
        dist.barrier()  # nobody reads or writes the folder before the new checkpoint is in place
    return out


def write_model_files(folder: str, model, tokenizer, training_state: dict, weights: dict | None = None) -> None:
    """The transformers files of ``model`` and ``tokenizer`` and ``training_state.pt``, into ``folder``.

    Args:
        model: a transformers model (``save_pretrained`` writes config.json, model.safetensors and
            generation_config.json).
        tokenizer: its tokenizer (``save_pretrained``).
        training_state: plain data for ``torch.save`` (tensors, numbers, strings, lists, tuples, dicts).
        weights: the full state dict to write instead of ``model``'s own (a sharded model's, gathered).
    """
    with no_progress_bars():
        model.save_pretrained(folder, safe_serialization=True, state_dict=weights)
    tokenizer.save_pretrained(folder)
    torch.save(training_state, os.path.join(folder, TRAINING_STATE))


def _new_staging(out: str) -> str:
    os.makedirs(out, exist_ok=True)
    for name in os.listdir(out):  # what a save killed earlier left behind
        if name.startswith(STAGING_PREFIX):
            shutil.rmtree(os.path.join(out, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=out)


def _commit(out: str, staging: str, step: int) -> None:
    """Flushes, hashes and renames the files of ``staging`` into ``out`` (see the module docstring)."""
    for name in _relative_files(staging):
        _fsync_file(os.path.join(staging, name))
    manifest = _write_manifest(staging, step)
    for folder in _folders(staging, manifest["files"]):
        _fsync_dir(folder)

    old = _current_manifest(out)
    if old is not None:
        _keep_as_previous(out, old)
    for name in manifest["files"]:  # the data first, the manifest last: it is what makes the new files valid
        os.makedirs(os.path.dirname(os.path.join(out, name)), exist_ok=True)
        os.replace(os.path.join(staging, name), os.path.join(out, name))
    for name in set(old["files"]) - set(manifest["files"]) if old else ():
        os.remove(os.path.join(out, name))  # before the manifest: a subfolder must hold no file it does not list
    for folder in _folders(out, manifest["files"]):
        _fsync_dir(folder)
    os.replace(os.path.join(staging, MANIFEST), os.path.join(out, MANIFEST))
    _fsync_dir(out)
    shutil.rmtree(staging)


def _folders(root: str, files) -> list[str]:
    """The folders that hold ``files`` (relative paths under ``root``), subfolders first."""
    return sorted({os.path.dirname(os.path.join(root, name)) for name in files}, key=len, reverse=True)


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
        os.makedirs(os.path.dirname(os.path.join(fresh, name)), exist_ok=True)
        try:
            os.link(os.path.join(out, name), os.path.join(fresh, name))
        except OSError:
            shutil.copy2(os.path.join(out, name), os.path.join(fresh, name))
    for folder in _folders(fresh, manifest["files"]):
        _fsync_dir(folder)
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
    of the wrong size or with the wrong SHA-256 (naming the file), a file in a manifest subfolder that it does not
    list, or an unreadable manifest (one naming a path outside the folder included: a save removes the files of the
    checkpoint it replaces).
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
        outside = [n for n in files if os.path.isabs(n) or "\\" in n or ".." in n.split("/")]
        if outside:
            raise ValueError(f"it names {outside[0]!r}, outside the checkpoint folder")
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
    sharded = {os.path.dirname(name) for name in files if "/" in name}  # folders a reader takes whole
    unlisted = [name for name in _relative_files(path) if os.path.dirname(name) in sharded and name not in files]
    if unlisted:
        raise _corrupt(path, f"{unlisted[0]} is not in {MANIFEST}")
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
