"""The main job: train a small TransNormerLLM (or the LLaMA baseline) on a text, on CPU or GPU(s).

``train`` and ``TrainResult`` load on first use, so that the options (and ``lightning-attention --help``) do not
import transformers.
"""

from lightning_attention.train.config import TrainConfig


def __getattr__(name: str):
    if name in ("TrainResult", "train"):
        from lightning_attention.train import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["TrainConfig", "TrainResult", "train"]
