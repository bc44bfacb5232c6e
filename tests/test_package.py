"""Packaging: the console script answers --version and --help, the package imports without a GPU, dependencies are
the ones it uses, and a missing optional dependency names its extra."""

import ast
import pathlib
import re
import subprocess
import sys

import pytest

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


ROOT = pathlib.Path(__file__).resolve().parents[1]
IMPORT_NAMES = {"pytest": "pytest"}  # distribution name -> import name where they differ: none so far


def _requirements() -> dict[str, set[str]]:
    """``{"": core dependencies, extra: its dependencies}`` as import names (self-references left out)."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"": project["dependencies"], **project["optional-dependencies"]}
    name = lambda requirement: re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0]  # noqa: E731
    return {group: {IMPORT_NAMES.get(name(r), name(r)) for r in requirements if name(r) != project["name"]}
            for group, requirements in groups.items()}


def _third_party_imports(folder: pathlib.Path) -> set[str]:
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                found.add(node.module.split(".")[0])
    return found - set(sys.stdlib_module_names) - {"lightning_attention", "tests", "__future__"}


def test_every_dependency_is_used_and_every_import_is_declared():
    declared = _requirements()
    package, tests = _third_party_imports(ROOT / "lightning_attention"), _third_party_imports(ROOT / "tests")
    unused = {group: names - package - tests for group, names in declared.items()}
    assert not any(unused.values()), f"declared but never imported: {unused}"
    optional_in_package = {"fla", "lightning_attn"}  # the benchmarks' baselines, found at run time when installed
    undeclared = package - set().union(*declared.values()) - optional_in_package
    assert not undeclared, f"imported but declared nowhere: {undeclared}"
    assert "datasets" in declared["data"] and {"transformers", "tokenizers", "safetensors"} <= declared["hf"]
    assert declared[""] == {"torch", "triton"}  # a kernel-only install


def test_the_cli_without_transformers_says_which_extra(tmp_path):
    code = ("import sys; sys.modules['transformers'] = None  # as if it were not installed\n"
            "from lightning_attention.cli import main\n"
            "assert main(['train', '--help']) == 0\n")
    help_run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "--steps" in help_run.stdout  # --help needs no transformers
    code = ("import sys; sys.modules['transformers'] = None\n"
            "from lightning_attention.cli import main\n"
            f"sys.exit(main(['train', '--smoke', '--out', {str(tmp_path / 'o')!r}]))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "pip install 'lightning-attention[hf]'" in run.stderr
    assert "Traceback" not in run.stderr
