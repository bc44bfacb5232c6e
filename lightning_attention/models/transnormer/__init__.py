"""TransNormerLLM: config, model and cache, registered with transformers' Auto classes (``model_type="transnormer"``).

The names below load on first use (PEP 562), so that registering the config with ``AutoConfig`` (see
:mod:`lightning_attention.models.registration`) does not import the model and transformers' modelling code.
"""

import importlib

_EXPORTS = {
    "TransNormerCache": "cache",
    "cache_of": "cache",
    "TransNormerConfig": "config",
    "TransNormerForCausalLM": "model",
    "TransNormerModel": "model",
    "TransNormerPreTrainedModel": "model",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


def __dir__() -> list[str]:
    return sorted(__all__)


def register_auto_classes() -> None:
    """Registers ``model_type="transnormer"`` with AutoConfig / AutoModel / AutoModelForCausalLM now (idempotent;
    ``import lightning_attention`` already does it when transformers' Auto classes are imported)."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from lightning_attention.models.registration import register_config, register_models

    register_config(AutoConfig)
    register_models(AutoModel, AutoModelForCausalLM)


__all__ = [*_EXPORTS, "register_auto_classes"]
