"""The main job end to end: `train --smoke` writes a transformers folder, `generate` reads it, exact resume, the
LLaMA baseline, truthful --help defaults and one-line errors."""

import math
import os
import sys

import pytest
import torch
from safetensors.torch import load_file

from lightning_attention.cli import main
from lightning_attention.train import TrainConfig, train
from lightning_attention.train.checkpoint import load_training_state
from lightning_attention.train.config import SMOKE


def test_help_lists_the_main_job(capsys):
    assert main([]) == 0
    text = capsys.readouterr().out
    assert "train" in text and "generate" in text


def test_train_smoke_then_generate(tmp_path, capsys):
    out = str(tmp_path / "tnl")
    assert main(["train", "--smoke", "--no-progress", "--out", out]) == 0
    printed = capsys.readouterr().out
    assert "final validation loss" in printed and "bits/byte" in printed
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "training_state.pt",
            "checkpoint.json"} <= set(os.listdir(out))
    state = load_training_state(out)
    assert state["step"] == 6 and len(state["history"]["train"]) == 6
    losses = state["history"]["train"]
    assert losses[-1] < losses[0]  # even six steps move the loss off ln(256)
    (_, nats), (_, bpb) = state["history"]["val"][-1], state["history"]["val_bits_per_byte"][-1]
    assert bpb == pytest.approx(nats / math.log(2), rel=1e-12)  # bytes: one token per byte
    assert main(["generate", "--checkpoint", out, "--prompt", "def ", "--max-new-tokens", "12", "--quiet"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("def ") and len(text.encode("utf-8", errors="surrogatepass")) >= 4
    # --cuda-graphs turns the graph-replayed decode step on (on CPU the eager step runs): the same greedy text
    greedy = ["generate", "--checkpoint", out, "--prompt", "def ", "--max-new-tokens", "12", "--quiet",
              "--temperature", "0"]
    assert main(greedy) == 0
    eager = capsys.readouterr().out
    assert main([*greedy, "--cuda-graphs"]) == 0
    assert capsys.readouterr().out == eager


def test_resume_reproduces_the_loss_curve_exactly(tmp_path):
    straight = train(TrainConfig.smoke(out=str(tmp_path / "a"), progress=False))
    first = train(TrainConfig.smoke(out=str(tmp_path / "b"), progress=False, stop_at=3))
    assert first.step == 3
    resumed = train(TrainConfig.smoke(out=str(tmp_path / "b"), progress=False, resume=True))
    assert resumed.train_losses == straight.train_losses  # bitwise: same batches, RNG, optimizer state, schedule
    assert resumed.val_losses[-1] == straight.val_losses[-1]
    a, b = (load_file(str(tmp_path / name / "model.safetensors")) for name in "ab")
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


def test_llama_baseline_trains_and_generates(tmp_path, capsys):
    out = str(tmp_path / "llama")
    assert main(["train", "--smoke", "--arch", "llama", "--steps", "2", "--no-progress", "--out", out]) == 0
    assert load_training_state(out)["options"]["arch"] == "llama"
    capsys.readouterr()
    assert main(["generate", "--checkpoint", out, "--prompt", "x", "--max-new-tokens", "5", "--quiet"]) == 0
    assert capsys.readouterr().out.startswith("x")
    assert main(["generate", "--checkpoint", out, "--prompt", "x", "--cuda-graphs"]) == 2
    assert "--cuda-graphs needs a TransNormer checkpoint" in capsys.readouterr().err


def test_help_shows_the_real_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in text
    assert "(default: the preset's: smoke 32, tiny 128, 40m 512, 400m 1024)" in text  # --d-model
    assert f"(default: {TrainConfig().steps}; {SMOKE['steps']} with --smoke)" in text  # --steps
    assert "(default: checkpoints/<arch>; checkpoints/<arch>-smoke with --smoke)" in text  # --out


def test_generate_without_a_checkpoint_is_a_one_line_error(tmp_path, capsys):
    assert main(["generate", "--checkpoint", str(tmp_path / "nothing"), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint at" in err and "lightning-attention train" in err and "Traceback" not in err


def test_missing_data_file_is_a_one_line_error(tmp_path, capsys):
    assert main(["train", "--smoke", "--data", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")]) == 2
    assert "--data" in capsys.readouterr().err


def test_a_bad_fsdp_unit_is_a_one_line_error(tmp_path, capsys):
    assert main(["train", "--smoke", "--fsdp-unit-blocks", "0", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--fsdp-unit-blocks must be at least 1" in err and "Traceback" not in err


def test_hf_data_without_datasets_names_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if it were not installed
    assert main(["train", "--smoke", "--data", "hf:wikitext", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "pip install 'lightning-attention[data]'" in err and "Traceback" not in err
