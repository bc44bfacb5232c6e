"""Activation checkpointing, the transformers way: gradient_checkpointing_enable() (activation_checkpointing_enable()
on transformers 5) recomputes every block in the backward pass and gives the same gradients; `train
--gradient-checkpointing` trains the same run."""

import warnings

import pytest
import torch

from lightning_attention.train import TrainConfig, train
from lightning_attention.train import trainer
from lightning_attention.train.trainer import enable_activation_checkpointing
from lightning_attention.utils.testing import assert_close
from tests.models.helpers import VARIANTS, tiny_tnl


def checkpointing_on(model) -> bool:
    """transformers 5 renamed ``is_gradient_checkpointing`` to ``is_activation_checkpointing``."""
    if hasattr(type(model), "is_activation_checkpointing"):
        return model.is_activation_checkpointing
    return model.is_gradient_checkpointing


def gradients(model, ids, **kwargs) -> tuple[dict, int]:
    """Gradients of the LM loss, and how many times the token mixers ran."""
    calls = []
    hooks = [layer.token_mixer.register_forward_hook(lambda *a: calls.append(1)) for layer in model.model.layers]
    model.zero_grad()
    model(ids, labels=ids, **kwargs).loss.backward()
    for hook in hooks:
        hook.remove()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, len(calls)


@pytest.mark.parametrize("variant", ["tnl", "hybrid", "packed"])
def test_checkpointed_gradients_equal_the_plain_ones(variant):
    model = tiny_tnl(torch.float64, **VARIANTS["hybrid" if variant == "hybrid" else "tnl"]).train()
    ids = torch.randint(1, 256, (2, 23))
    kwargs = {}
    if variant == "packed":
        ids, kwargs = ids.reshape(1, -1), {"cu_seqlens": torch.tensor([0, 5, 5, 30, 46])}
    plain, plain_calls = gradients(model, ids, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # transformers 5 renamed it activation_checkpointing_enable
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert checkpointing_on(model)
    checkpointed, calls = gradients(model, ids, **kwargs)
    assert calls == 2 * plain_calls  # every block ran again in the backward pass
    for name in plain:
        assert_close(name, checkpointed[name], plain[name], torch.float64)


def test_the_trainer_helper_enables_it_on_both_architectures():
    from tests.models.helpers import tiny_llama

    for model in (tiny_tnl(torch.float64), tiny_llama()):
        enable_activation_checkpointing(model)
        assert checkpointing_on(model)


def test_train_with_gradient_checkpointing_trains_the_same_run(tmp_path, monkeypatch):
    enabled = []

    def spy(model):
        enable_activation_checkpointing(model)
        enabled.append(checkpointing_on(model))

    monkeypatch.setattr(trainer, "enable_activation_checkpointing", spy)
    plain = train(TrainConfig.smoke(out=str(tmp_path / "a"), steps=3, progress=False))
    assert enabled == []
    checkpointed = train(TrainConfig.smoke(out=str(tmp_path / "b"), steps=3, progress=False,
                                           gradient_checkpointing=True))
    assert enabled == [True]
    torch.testing.assert_close(torch.tensor(checkpointed.train_losses), torch.tensor(plain.train_losses),
                               rtol=1e-6, atol=0)
