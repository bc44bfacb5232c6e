"""--resume continues the run with its own options: changing one is an error unless allowed by --resume-override;
the length and the save/eval cadence may change freely."""


import pytest

from lightning_attention.cli import main
from lightning_attention.train import TrainConfig, train
from lightning_attention.train.checkpoint import load_training_state
from lightning_attention.train.errors import UserError


@pytest.fixture(scope="module")
def stopped(tmp_path_factory) -> str:
    """A smoke run with --context 32 stopped at step 2 of 4."""
    out = str(tmp_path_factory.mktemp("resume") / "run")
    assert main(["train", "--smoke", "--no-progress", "--steps", "4", "--context", "32", "--stop-at", "2",
                 "--out", out]) == 0
    return out


@pytest.fixture
def run(stopped, copy_of) -> str:
    return copy_of(stopped)


@pytest.mark.parametrize("flags", [["--lr", "0.001"], ["--context", "16"], ["--seed", "7"], ["--batch-size", "2"],
                                   ["--tokenizer", "bpe"]])
def test_a_changed_option_is_refused(run, flags, capsys):
    assert main(["train", "--smoke", "--no-progress", "--resume", "--out", run, *flags]) == 2
    err = capsys.readouterr().err
    name = flags[0][2:].replace("-", "_")
    assert f"differ from the run's own: {name}: " in err and f"--resume-override {name}" in err
    assert load_training_state(run)["step"] == 2  # nothing trained, nothing written


def test_an_overridden_option_is_accepted(run, capsys):
    assert main(["train", "--smoke", "--no-progress", "--resume", "--out", run, "--lr", "0.001",
                 "--resume-override", "lr"]) == 0
    state = load_training_state(run)
    assert state["step"] == 4 and state["options"]["lr"] == 0.001


def test_length_and_cadence_may_change_and_the_rest_comes_from_the_checkpoint(run):
    assert main(["train", "--smoke", "--no-progress", "--resume", "--out", run, "--steps", "5", "--stop-at", "3",
                 "--save-every", "1", "--eval-every", "1"]) == 0
    state = load_training_state(run)
    assert state["step"] == 3 and state["options"]["context"] == 32  # --context 32 was not repeated
    assert [step for step, _ in state["history"]["val"]] == [2, 3]


def test_the_python_api_compares_every_option(run):
    with pytest.raises(UserError, match="lr: 0.003 -> 0.01"):
        train(TrainConfig.smoke(out=run, steps=4, context=32, lr=0.01, resume=True, progress=False))
    result = train(TrainConfig.smoke(out=run, steps=4, context=32, resume=True, progress=False))
    assert result.step == 4
