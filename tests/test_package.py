"""Packaging: the console script answers --version and --help, and the package imports without a GPU."""

import subprocess
import sys

import lightning_attention
from lightning_attention.cli import main


def test_version_flag(capsys):
    try:
        main(["--version"])
    except SystemExit as e:
        assert e.code == 0
    assert lightning_attention.__version__ in capsys.readouterr().out


def test_help_lists_usage(capsys):
    assert main([]) == 0
    assert "usage: lightning-attention" in capsys.readouterr().out


def test_module_entry_point_runs():
    out = subprocess.run(
        [sys.executable, "-m", "lightning_attention", "--version"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and lightning_attention.__version__ in out.stdout
