"""After a plain `import lightning_attention`, transformers' Auto classes know "transnormer" (checked in fresh
processes, whichever is imported first); the import itself loads no transformers, and works without it."""

import subprocess
import sys

import pytest
import torch

from tests.models.helpers import tiny_tnl


def run_fresh(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.strip()


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("hf") / "tnl")
    tiny_tnl(torch.float32).save_pretrained(path)
    return path


LOAD = ("from transformers import AutoConfig, AutoModel, AutoModelForCausalLM\n"
        "print(type(AutoConfig.for_model('transnormer', decoder_layers=2)).__name__)\n"
        "print(type(AutoModelForCausalLM.from_pretrained({folder!r})).__name__)\n"
        "print(type(AutoModel.from_pretrained({folder!r})).__name__)\n")


@pytest.mark.parametrize("order", ["lightning_attention first", "transformers first"])
def test_auto_classes_resolve_transnormer_in_a_fresh_process(folder, order):
    code = LOAD.format(folder=folder)
    code = "import lightning_attention\n" + code if order == "lightning_attention first" else \
        "import transformers.models.auto.modeling_auto\nimport lightning_attention\n" + code
    assert run_fresh(code).splitlines() == ["TransNormerConfig", "TransNormerForCausalLM", "TransNormerModel"]


def test_the_folder_ships_no_remote_code_pointer(folder):
    """No modelling code travels with the folder, so its config must not send transformers looking for any."""
    import json
    import os

    config = json.load(open(os.path.join(folder, "config.json")))
    assert config["model_type"] == "transnormer" and "auto_map" not in config
    assert not [name for name in os.listdir(folder) if name.endswith(".py")]


def test_import_loads_no_transformers_and_works_without_it():
    assert run_fresh("import sys, lightning_attention; print('transformers' in sys.modules)") == "False"
    code = ("import sys; sys.modules['transformers'] = None  # as if it were not installed\n"
            "import torch, lightning_attention as la\n"
            "q = torch.randn(1, 5, 2, 16)\n"
            "o, _ = la.lightning_attn(q, q, q, la.tnl_slopes(2, 0, 2))\n"
            "print(tuple(o.shape))\n")
    assert run_fresh(code) == "(1, 5, 2, 16)"
