"""``train --compile``: every decoder block is compiled (before activation checkpointing's recomputation and FSDP2's
sharding wrap it, one block or several to a unit), without graph breaks, and trains the eager run.

The trainer compiles with the default backend (inductor), which takes minutes on a 2-core CPU; here the blocks'
``compile()`` is pointed at ``aot_eager``, which traces forward and backward the same way (Dynamo, AOTAutograd) and
runs the captured graphs eagerly.
"""

import pytest
import torch
import torch._dynamo.utils as dynamo_utils
from torch import nn

from lightning_attention.train import TrainConfig, parallel, train


@pytest.mark.parametrize("unit_blocks", [1, 2], ids=["a-unit-per-block", "one-unit-of-two-blocks"])
def test_compile_captures_every_block_whole_under_fsdp_with_checkpointing(tmp_path, monkeypatch, unit_blocks):
    compiled = []
    real_compile = nn.Module.compile

    def compile_aot_eager(self, *args, **kwargs):
        compiled.append(type(self).__name__)
        return real_compile(self, *args, **{**kwargs, "backend": "aot_eager"})

    monkeypatch.setattr(nn.Module, "compile", compile_aot_eager)
    eager = train(TrainConfig.smoke(out=str(tmp_path / "eager"), steps=3, progress=False))
    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    options = {"steps": 3, "progress": False, "compile": True, "data_parallel": "fsdp", "gradient_checkpointing": True,
               "fsdp_unit_blocks": unit_blocks}
    result = train(TrainConfig.smoke(out=str(tmp_path / "compiled"), **options))
    assert compiled == ["TransNormerDecoderLayer"] * 2  # the smoke preset's two blocks, nothing else
    assert dynamo_utils.counters["stats"]["unique_graphs"] >= 1
    assert not dynamo_utils.counters["graph_break"], dict(dynamo_utils.counters["graph_break"])
    torch.testing.assert_close(torch.tensor(result.train_losses), torch.tensor(eager.train_losses), rtol=1e-5, atol=0)
    torch._dynamo.reset()


def test_decoder_blocks_are_the_models_no_split_modules():
    from lightning_attention.models.presets import model_config, model_from_config

    for arch, block in (("tnl", "TransNormerDecoderLayer"), ("llama", "LlamaDecoderLayer")):
        with torch.device("meta"):
            model = model_from_config(arch, model_config(arch, "smoke"))
        blocks = parallel.decoder_blocks(model)
        assert [type(b).__name__ for b in blocks] == [block] * 2
