"""The README's commands and snippets do what it says: the two set-up commands name real extras and subcommands (and
are what CI runs), the quickstart runs on this machine (CPU in CI), the model snippet runs on a trained folder."""

import contextlib
import io
import os
import pathlib
import re
import shlex

import pytest

from lightning_attention.cli import build_parser

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def block(heading: str, language: str) -> str:
    """The first fenced ``language`` block after the ``heading`` line."""
    section = README[README.index(heading):]
    return re.search(rf"```{language}\n(.*?)```", section, re.S).group(1)


def extras() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_the_two_commands_do_the_whole_set_up():
    commands = [line for line in block("## The two commands", "bash").splitlines()
                if line.strip() and not line.startswith("#")]
    assert len(commands) == 2
    for command in commands:
        install, *rest = [shlex.split(part) for part in command.split("&&")]
        assert install[:3] == ["pip", "install", "-e"] and install[3].startswith(".[")
        assert set(install[3][2:-1].split(",")) <= set(extras())
        for argv in rest:
            if argv[0] == "lightning-attention":
                build_parser().parse_args(argv[1:])  # a real subcommand with real options
    main_job, tests = commands
    assert "lightning-attention train" in main_job and "lightning-attention generate" in main_job
    assert tests.endswith("python -m pytest -q")
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -q -e ".[test]"' in ci and "python3 -m pytest -q" in ci  # CI runs the README's command


def test_quickstart_runs():
    exec(compile(block("## Quickstart", "python"), "README quickstart", "exec"), {})


def test_model_snippet_runs_on_a_trained_folder(tmp_path, monkeypatch):
    from lightning_attention.train import TrainConfig, train

    train(TrainConfig.smoke(out=str(tmp_path / "checkpoints" / "tnl"), steps=1, progress=False))
    monkeypatch.chdir(tmp_path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(block("## TransNormerLLM with transformers", "python"), "README model snippet", "exec"), {})
    assert printed.getvalue().startswith("The Python ") and "def " in printed.getvalue()
    assert os.path.isdir(tmp_path / "checkpoints" / "tnl")
