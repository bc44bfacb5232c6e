"""Checkpoint folders under faults: every damaged file is a one-line "corrupt/incomplete" error naming it, a crafted
pickle never runs, a process killed while saving never loses the last good checkpoint, and saves go through private
temporary folders, flushed to disk before the rename."""

import json
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

from lightning_attention.cli import main
from lightning_attention.train import TrainConfig, train
from lightning_attention.train import checkpoint as ckpt_io
from lightning_attention.train.checkpoint import CheckpointError, load_training_state, verify_checkpoint


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> str:
    """A smoke run saved at steps 3 (kept in previous/) and 6 (the checkpoint)."""
    out = str(tmp_path_factory.mktemp("ckpt") / "tnl")
    train(TrainConfig.smoke(out=out, save_every=3, progress=False))
    return out


@pytest.fixture
def folder(saved, copy_of) -> str:
    return copy_of(saved)


def test_layout_manifest_and_previous(saved):
    manifest = verify_checkpoint(saved)
    assert manifest["step"] == 6
    assert set(manifest["files"]) >= {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
                                      "tokenizer_config.json", "training_state.pt"}
    on_disk = {os.path.relpath(os.path.join(root, f), saved).replace(os.sep, "/")
               for root, dirs, files in os.walk(saved) if "previous" not in os.path.relpath(root, saved).split(os.sep)
               for f in files}
    assert set(manifest["files"]) == on_disk - {"checkpoint.json"}  # every file covered, subfolders too
    assert [f for f in manifest["files"] if f.startswith("optimizer/")]  # the optimizer state, by its path
    assert verify_checkpoint(os.path.join(saved, "previous"))["step"] == 3
    assert not [n for n in os.listdir(saved) if n.startswith(".staging-")]  # no temporary folder left behind


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _zero_64_bytes(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        f.write(bytes(64))


def _empty(path):
    open(path, "wb").close()


def _random_bytes(path):
    size = os.path.getsize(path)
    with open(path, "wb") as f:
        f.write(torch.randint(0, 256, (size,), dtype=torch.uint8).numpy().tobytes())


OPTIMIZER_SHARD = "optimizer/shard-00001-model-00001-of-00001.safetensors"  # one process writes one shard

FAULTS = {
    "truncated-weights": ("model.safetensors", _truncate, "model.safetensors has"),
    "zeroed-weights": ("model.safetensors", _zero_64_bytes, "model.safetensors does not match"),
    "empty-state": ("training_state.pt", _empty, "training_state.pt has 0 bytes"),
    "random-state": ("training_state.pt", _random_bytes, "training_state.pt does not match"),
    "missing-tokenizer": ("tokenizer.json", os.remove, "tokenizer.json is missing"),
    "zeroed-optimizer": (OPTIMIZER_SHARD, _zero_64_bytes, f"{OPTIMIZER_SHARD} does not match"),
    "missing-optimizer": (OPTIMIZER_SHARD, os.remove, f"{OPTIMIZER_SHARD} is missing"),
    "stray-optimizer-shard": ("optimizer/shard-00002-model-00001-of-00001.safetensors",
                              lambda path: open(path, "wb").close(), "is not in checkpoint.json"),
    "random-manifest": ("checkpoint.json", _random_bytes, "checkpoint.json is unreadable"),
    "empty-manifest": ("checkpoint.json", _empty, "checkpoint.json is unreadable"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_damaged_checkpoint_is_a_clear_error_everywhere(folder, fault, capsys):
    name, damage, detail = FAULTS[fault]
    damage(os.path.join(folder, name))
    with pytest.raises(CheckpointError) as raised:
        verify_checkpoint(folder)
    message = str(raised.value)
    assert message.startswith(f"checkpoint {folder} is corrupt/incomplete: ") and detail in message
    assert f"previous checkpoint (step 3) is intact in {os.path.join(folder, 'previous')}" in message
    for argv in (["generate", "--checkpoint", folder, "--prompt", "x"],
                 ["train", "--smoke", "--no-progress", "--resume", folder]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "is corrupt/incomplete" in err and detail in err and "Traceback" not in err
        assert len(err.strip().splitlines()) == 1
    assert verify_checkpoint(os.path.join(folder, "previous"))["step"] == 3  # the previous one is untouched


class _Exploit:
    """A pickle that would create a file when unpickled with weights_only=False."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_crafted_pickle_is_never_executed(folder, tmp_path, capsys):
    marker = str(tmp_path / "pwned")
    state = os.path.join(folder, "training_state.pt")
    with open(state, "wb") as f:
        pickle.dump({"step": _Exploit(marker)}, f, protocol=2)
    manifest_path = os.path.join(folder, "checkpoint.json")  # the attacker rewrites the manifest to match
    manifest = json.load(open(manifest_path))
    manifest["files"]["training_state.pt"] = {"bytes": os.path.getsize(state), "sha256": ckpt_io.sha256_of(state)}
    json.dump(manifest, open(manifest_path, "w"))
    with pytest.raises(CheckpointError, match="training_state.pt cannot be read safely"):
        load_training_state(folder)
    assert main(["train", "--smoke", "--no-progress", "--resume", folder]) == 2
    assert "cannot be read safely" in capsys.readouterr().err
    assert not os.path.exists(marker)


def test_a_manifest_naming_files_outside_the_folder_is_refused(folder, tmp_path):
    """A save removes the files of the checkpoint it replaces: a crafted manifest must not make it delete others."""
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    manifest_path = pathlib.Path(folder) / "checkpoint.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["../victim.txt"] = {"bytes": victim.stat().st_size, "sha256": ckpt_io.sha256_of(str(victim))}
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="names '../victim.txt', outside the checkpoint folder"):
        verify_checkpoint(folder)
    train(TrainConfig.smoke(out=folder, steps=1, progress=False))  # a new run saving into the folder
    assert victim.read_text() == "keep me" and verify_checkpoint(folder)["step"] == 1


def test_an_old_pickle_checkpoint_is_refused_unopened(tmp_path, capsys):
    old = tmp_path / "old"
    old.mkdir()
    marker = str(tmp_path / "pwned")
    with open(old / "checkpoint.pt", "wb") as f:
        pickle.dump(_Exploit(marker), f, protocol=2)
    for argv in (["generate", "--checkpoint", str(old)], ["train", "--smoke", "--resume", str(old)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert "earlier version" in err and "could run arbitrary code" in err
    assert not os.path.exists(marker)


def test_resume_without_a_checkpoint_is_an_error(tmp_path, capsys):
    assert main(["train", "--smoke", "--no-progress", "--resume", "--out", str(tmp_path / "none")]) == 2
    assert "no checkpoint at" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "none")


def test_saves_use_private_temporary_folders_flushed_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace, real_mkdtemp = os.fsync, os.replace, ckpt_io.tempfile.mkdtemp

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        if os.path.isfile(src):  # a file renamed into place (folders are the previous/ rotation)
            events.append(("replace", os.path.abspath(src)))
        real_replace(src, dst)

    def mkdtemp(**kwargs):
        path = real_mkdtemp(**kwargs)
        events.append(("mkdtemp", path))
        return path

    monkeypatch.setattr(ckpt_io.os, "fsync", fsync)
    monkeypatch.setattr(ckpt_io.os, "replace", replace)
    monkeypatch.setattr(ckpt_io.tempfile, "mkdtemp", mkdtemp)
    out = str(tmp_path / "run")
    train(TrainConfig.smoke(out=out, steps=2, save_every=1, progress=False))
    staging = [path for kind, path in events if kind == "mkdtemp"]
    assert staging and all(os.path.dirname(p) == out and os.path.basename(p).startswith(".staging-")
                           for p in staging)
    assert len(set(staging)) == len(staging)  # a fresh name every time: nothing to plant in advance
    synced, renamed = set(), 0
    for kind, path in events:
        if kind == "fsync":
            synced.add(path)
        elif kind == "replace":
            assert path in synced, f"{path} renamed before it was flushed to disk"
            renamed += 1
    assert renamed == 2 * (len(verify_checkpoint(out)["files"]) + 1)  # two saves of every file and the manifest
    assert not [n for n in os.listdir(out) if n.startswith(".staging-")]


KILL_DURING_SAVE = textwrap.dedent("""
    import os, signal, sys, torch
    from lightning_attention.train import TrainConfig, train
    from lightning_attention.train import checkpoint as ckpt_io

    where, out = sys.argv[1], sys.argv[2]
    saves = {"n": 0}
    real_save, real_replace = torch.save, os.replace

    def die():
        os.kill(os.getpid(), signal.SIGKILL)

    def save(obj, path, *args, **kwargs):  # training_state.pt: the second save dies half-way through the file
        saves["n"] += 1
        if where == "writing" and saves["n"] == 2:
            real_save(obj, path)
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
            die()
        return real_save(obj, path, *args, **kwargs)

    def replace(src, dst):  # the second save dies after renaming its first files into place
        if where == "renaming" and saves["n"] == 2 and os.path.basename(dst) == "training_state.pt":
            die()
        return real_replace(src, dst)

    torch.save = save
    ckpt_io.os.replace = replace
    train(TrainConfig.smoke(out=out, save_every=3, progress=False))
""")


def _killed_run(where: str, out: str) -> None:
    proc = subprocess.run([sys.executable, "-c", KILL_DURING_SAVE, where, out], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]


def test_killed_while_writing_keeps_the_last_good_checkpoint_and_resumes_exactly(tmp_path):
    out = str(tmp_path / "run")
    _killed_run("writing", out)
    assert verify_checkpoint(out)["step"] == 3  # the half-written save never became the checkpoint
    resumed = train(TrainConfig.smoke(out=out, save_every=3, progress=False, resume=True))
    straight = train(TrainConfig.smoke(out=str(tmp_path / "straight"), save_every=3, progress=False))
    assert resumed.train_losses == straight.train_losses
    assert not [n for n in os.listdir(out) if n.startswith(".staging-")]  # the next save cleaned up


def test_killed_while_renaming_keeps_the_previous_checkpoint(tmp_path, capsys):
    out = str(tmp_path / "run")
    _killed_run("renaming", out)
    with pytest.raises(CheckpointError, match=r"corrupt/incomplete: model.safetensors .* checkpoint \(step 3\)"):
        verify_checkpoint(out)
    previous = os.path.join(out, "previous")
    assert verify_checkpoint(previous)["step"] == 3
    # the way out the message points to: resume from previous/ into the same folder
    assert main(["train", "--smoke", "--no-progress", "--save-every", "3", "--resume", previous, "--out", out]) == 0
    assert verify_checkpoint(out)["step"] == 6
    straight = train(TrainConfig.smoke(out=str(tmp_path / "straight"), save_every=3, progress=False))
    assert load_training_state(out)["history"]["train"] == straight.train_losses
