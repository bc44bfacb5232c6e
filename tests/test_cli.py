"""The main job end to end: `train --smoke`, `generate` from its checkpoint, exact resume, the LLaMA baseline."""

import torch

from lightning_attention.cli import main
from lightning_attention.train import TrainConfig, train
from lightning_attention.train.checkpoint import load_checkpoint


def test_help_lists_the_main_job(capsys):
    assert main([]) == 0
    text = capsys.readouterr().out
    assert "train" in text and "generate" in text


def test_train_smoke_then_generate(tmp_path, capsys):
    out = str(tmp_path / "tnl")
    assert main(["train", "--smoke", "--no-progress", "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "final validation loss" in printed
    ckpt = load_checkpoint(out)
    assert ckpt["arch"] == "tnl" and ckpt["step"] == 6 and len(ckpt["history"]["train"]) == 6
    losses = ckpt["history"]["train"]
    assert losses[-1] < losses[0]  # even six steps move the loss off ln(256)
    assert main(["generate", "--checkpoint", out, "--prompt", "def ", "--max-new-tokens", "12", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("def ") and len(text.encode("utf-8", errors="surrogatepass")) >= 4


def test_resume_reproduces_the_loss_curve_exactly(tmp_path):
    straight = train(TrainConfig.smoke(out=str(tmp_path / "a"), progress=False))
    first = train(TrainConfig.smoke(out=str(tmp_path / "b"), progress=False, stop_at=3))
    assert first.step == 3
    resumed = train(TrainConfig.smoke(out=str(tmp_path / "b"), progress=False, resume=True))
    assert resumed.train_losses == straight.train_losses  # bitwise: same batches, RNG, optimizer state, schedule
    assert resumed.val_losses[-1] == straight.val_losses[-1]
    a, b = load_checkpoint(str(tmp_path / "a")), load_checkpoint(str(tmp_path / "b"))
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name


def test_llama_baseline_trains_and_generates(tmp_path, capsys):
    out = str(tmp_path / "llama")
    assert main(["train", "--smoke", "--arch", "llama", "--steps", "2", "--no-progress", "--out", out]) == 0
    assert load_checkpoint(out)["arch"] == "llama"
    capsys.readouterr()
    assert main(["generate", "--checkpoint", out, "--prompt", "x", "--max-new-tokens", "5", "--quiet"]) == 0
    assert capsys.readouterr().out.startswith("x")
