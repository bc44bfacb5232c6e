"""TransNormerLLM in transformers' Auto classes after a plain ``import lightning_attention``, at no import cost.

Registering needs transformers' config and model base classes, whose import takes seconds (``import
lightning_attention`` itself takes about as long, torch included); a kernel user should not pay that. So each part
registers when transformers needs it, through transformers' documented ``AutoConfig.register`` /
``AutoModel*.register`` (transformers has no plugin entry point for third-party models):

- the config: right after ``transformers.models.auto.configuration_auto`` (``AutoConfig``) finishes loading, through
  an import hook (or at once if it is already loaded). Every Auto class loads that module first.
- the models (``AutoModel``, ``AutoModelForCausalLM``): when the model module finishes loading, which the first
  ``TransNormerConfig`` triggers — ``from_pretrained`` / ``from_config`` / ``pipeline`` build the config before they
  look up the model class.

Without transformers installed nothing happens.
"""

import importlib
import importlib.abc
import sys
import warnings

CONFIG_MODULE = "transformers.models.auto.configuration_auto"
MODEL_MODULE = "lightning_attention.models.transnormer.model"


def register_config(auto_config) -> None:
    """``AutoConfig.register("transnormer", TransNormerConfig)``."""
    from lightning_attention.models.transnormer.config import TransNormerConfig

    auto_config.register(TransNormerConfig.model_type, TransNormerConfig, exist_ok=True)


def register_models(auto_model, auto_model_for_causal_lm) -> None:
    """``AutoModel`` -> ``TransNormerModel``, ``AutoModelForCausalLM`` -> ``TransNormerForCausalLM``."""
    from lightning_attention.models.transnormer.config import TransNormerConfig
    from lightning_attention.models.transnormer.model import TransNormerForCausalLM, TransNormerModel

    auto_model.register(TransNormerConfig, TransNormerModel, exist_ok=True)
    auto_model_for_causal_lm.register(TransNormerConfig, TransNormerForCausalLM, exist_ok=True)


def ensure_models_registered() -> None:
    """Loads the model module (whose last line registers the models); called by every new ``TransNormerConfig``."""
    if MODEL_MODULE not in sys.modules:
        importlib.import_module(MODEL_MODULE)


def model_module_ready() -> None:
    """The model module's last line: registers its classes with ``AutoModel`` / ``AutoModelForCausalLM``."""
    from transformers import AutoModel, AutoModelForCausalLM

    register_models(AutoModel, AutoModelForCausalLM)


class _RunAfterExec(importlib.abc.Loader):
    """Wraps a module's loader: executes the module, then a callback with it."""

    def __init__(self, loader, callback):
        self.loader, self.callback = loader, callback

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        _run(self.callback, module)

    def __getattr__(self, name):  # everything else (get_source, get_resource_reader, ...) is the real loader's
        return getattr(self.loader, name)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Finds one watched module with the other finders and wraps its loader (once; then leaves ``sys.meta_path``)."""

    def __init__(self, name: str, callback):
        self.name, self.callback = name, callback

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _RunAfterExec(spec.loader, self.callback)
                return spec
        return None


def _run(callback, module) -> None:
    try:
        callback(module)
    except Exception as exc:  # noqa: BLE001 - registration must never break the user's import of transformers
        warnings.warn(f"lightning_attention could not register TransNormerLLM with transformers' Auto classes: "
                      f"{type(exc).__name__}: {exc}", RuntimeWarning, stacklevel=2)


def _on_config_module(module) -> None:
    register_config(module.AutoConfig)


def install() -> None:
    """Registers the config now if transformers' AutoConfig is loaded, else when it loads (called on package import)."""
    module = sys.modules.get(CONFIG_MODULE)
    if module is not None:
        _run(_on_config_module, module)
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(CONFIG_MODULE, _on_config_module))
