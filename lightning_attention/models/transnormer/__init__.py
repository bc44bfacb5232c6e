"""TransNormerLLM: config, model, cache; registered with transformers' Auto classes when it is installed."""

from lightning_attention.models.transnormer.cache import TransNormerCache
from lightning_attention.models.transnormer.config import TransNormerConfig
from lightning_attention.models.transnormer.hf import HAS_TRANSFORMERS
from lightning_attention.models.transnormer.model import (
    TransNormerForCausalLM,
    TransNormerModel,
    TransNormerPreTrainedModel,
)


def register_auto_classes() -> bool:
    """Registers ``model_type="transnormer"`` with AutoConfig / AutoModel / AutoModelForCausalLM.

    Runs on import of this package; returns False when transformers is not installed.
    """
    if not HAS_TRANSFORMERS:
        return False
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    AutoConfig.register(TransNormerConfig.model_type, TransNormerConfig, exist_ok=True)
    AutoModel.register(TransNormerConfig, TransNormerModel, exist_ok=True)
    AutoModelForCausalLM.register(TransNormerConfig, TransNormerForCausalLM, exist_ok=True)
    return True


register_auto_classes()

__all__ = [
    "TransNormerCache",
    "TransNormerConfig",
    "TransNormerForCausalLM",
    "TransNormerModel",
    "TransNormerPreTrainedModel",
    "register_auto_classes",
]
