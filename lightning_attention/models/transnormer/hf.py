"""transformers base classes, or minimal stand-ins when transformers (the ``hf`` extra) is not installed.

With transformers, the TNL classes are real ``PretrainedConfig`` / ``PreTrainedModel`` / ``GenerationMixin``
subclasses (save_pretrained, from_pretrained, AutoModelForCausalLM, generate). Without it, the same classes still
build, train, save (``config.to_dict()`` + ``state_dict()``) and sample with this package's own generator, so the
``lightning-attention train`` / ``generate`` main job needs only the core dependencies.
"""

import copy
from dataclasses import dataclass

import torch
from torch import nn

try:
    from transformers import GenerationMixin, PretrainedConfig, PreTrainedModel
    from transformers.modeling_outputs import BaseModelOutputWithPast, CausalLMOutputWithPast

    HAS_TRANSFORMERS = True
except ImportError:  # the `hf` extra is not installed
    HAS_TRANSFORMERS = False

    class PretrainedConfig:  # noqa: D101 - stand-in, see the module docstring
        model_type = ""

        def __init__(self, **kwargs):
            for key, value in kwargs.items():
                setattr(self, key, value)

        def to_dict(self) -> dict:
            out = copy.deepcopy(self.__dict__)
            out["model_type"] = self.model_type
            return out

        @classmethod
        def from_dict(cls, config_dict: dict, **kwargs):
            d = {k: v for k, v in config_dict.items() if k != "model_type"}
            d.update(kwargs)
            return cls(**d)

    class PreTrainedModel(nn.Module):  # noqa: D101
        config_class = PretrainedConfig

        def __init__(self, config, *args, **kwargs):
            super().__init__()
            self.config = config

        def post_init(self) -> None:
            self.apply(self._init_weights)

        @property
        def device(self) -> torch.device:
            return next(self.parameters()).device

        @property
        def dtype(self) -> torch.dtype:
            return next(self.parameters()).dtype

    class GenerationMixin:  # noqa: D101
        pass

    @dataclass
    class BaseModelOutputWithPast:  # noqa: D101
        last_hidden_state: torch.Tensor | None = None
        past_key_values: object = None
        hidden_states: tuple | None = None
        attentions: tuple | None = None

    @dataclass
    class CausalLMOutputWithPast:  # noqa: D101
        loss: torch.Tensor | None = None
        logits: torch.Tensor | None = None
        past_key_values: object = None
        hidden_states: tuple | None = None
        attentions: tuple | None = None


__all__ = [
    "HAS_TRANSFORMERS",
    "BaseModelOutputWithPast",
    "CausalLMOutputWithPast",
    "GenerationMixin",
    "PreTrainedModel",
    "PretrainedConfig",
]
