"""The main job: train a small TransNormerLLM (or the LLaMA baseline) on a text, on CPU or GPU(s)."""

from lightning_attention.train.config import TrainConfig
from lightning_attention.train.trainer import TrainResult, train

__all__ = ["TrainConfig", "TrainResult", "train"]
