"""``create_model``: a registered model, built with its options and, optionally, pretrained weights.

Kept apart from the registry so that the registry imports nothing that registers into it: weight loading
(:mod:`paddletrain.models.pretrained`) knows the ResNet layout, and the ResNet module registers its builders.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import paddle
from omegaconf import DictConfig

from paddletrain.models._registry import ModelOptionError, model_builder
from paddletrain.models.pretrained import load_pretrained
from paddletrain.models.weights import describe

__all__ = ["build_model", "create_model"]


def create_model(
    name: str,
    num_classes: int = 1000,
    in_chans: int = 3,
    pretrained: str | None = None,
    *,
    strict: bool = True,
    trust_pickle: bool = False,
    **kwargs: Any,
) -> paddle.nn.Layer:
    """Build the registered model ``name``, optionally loading weights.

    Args:
        name: a name from :func:`~paddletrain.models.list_models` (an installed plugin's included).
        num_classes: classifier outputs; 0 gives a feature extractor whose head is an identity.
        in_chans: input image channels.
        pretrained: a weight source (a ``.safetensors``/``.pdparams`` file, a checkpoint dir, ``vision:<arch>``,
            ``paddleclas:<Name>`` or ``hub:<module>``; see docs/finetuning.md) loaded with
            :func:`paddletrain.models.pretrained.load_pretrained`. A classifier head of another size is
            left freshly initialised.
        strict: with ``pretrained``, fail when any weight other than the classifier head is missing,
            unexpected or of another shape.
        trust_pickle: allow unpickling ``.pdparams`` files that hold more than numpy arrays (pickles can run
            code: trust the file first).
        **kwargs: builder options, e.g. ``drop_rate``, ``zero_init_residual``, ``data_format``. A weight source
            adds the options its weights need (e.g. ``project_first_shortcut`` for ``paddleclas:`` ResNets);
            options given here win.

    Raises:
        UnknownModelError: no model is registered under ``name`` (the message lists close names).
        ModelOptionError: the builder does not accept one of ``kwargs``.
    """
    builder = model_builder(name)
    if pretrained:
        # Options the weights need (e.g. PaddleClas' projection shortcut), unless the caller sets them.
        kwargs = {**describe(pretrained).model_options, **kwargs}
    model = builder(num_classes=num_classes, in_chans=in_chans, **kwargs)
    if pretrained:
        load_pretrained(model, pretrained, strict=strict, trust_pickle=trust_pickle)
    return model


# Model options passed to the builder only when the config changes them, so a user's builder need not take them.
_MODEL_OPTIONS = {"width": 1.0, "drop_rate": 0.0, "drop_path_rate": 0.0, "zero_init_residual": False,
                  "data_format": "NCHW"}


def typed_for(builder: Any, name: str, key: str, value: Any) -> Any:
    """A schema key's ``value`` as ``builder`` takes it: the schema's ``model.width`` is a float (paddletrain's
    width multiplier), while a plugin's ``width`` may count channels. A whole number goes in as an int unless the
    builder declares a float for it; a fraction for a parameter whose default is an int is refused naming both."""
    if not isinstance(value, float) or isinstance(value, bool):
        return value
    try:
        parameter = inspect.signature(builder).parameters.get(key)
    except (TypeError, ValueError):  # a builtin or a callable without a signature
        parameter = None
    declared = parameter.annotation if parameter is not None else inspect.Parameter.empty
    default = parameter.default if parameter is not None else inspect.Parameter.empty
    wants_float = declared in (float, "float") or isinstance(default, float) or str(declared).startswith("float")
    wants_int = declared in (int, "int") or (isinstance(default, int) and not isinstance(default, bool))
    if wants_float:
        return value
    if value.is_integer():
        return int(value)
    if wants_int:
        raise ModelOptionError(f"model.{key}={value}: the {name} builder takes a whole number for {key} (its default "
                               f"is {default!r})")
    return value


def build_model(cfg: DictConfig, num_classes: int, in_chans: int,
                options: Mapping[str, Any] | None = None) -> paddle.nn.Layer:
    """The model from the ``model`` config; ``num_classes``/``in_chans`` are the data's, unless the config sets them.

    ``model.arch`` is passed only when set (``model=vision``); options the weights need (e.g. PaddleClas'
    first-block projection shortcut) come from the weight source, inside :func:`create_model`. ``options``: the
    builder's own keyword arguments (on the command line, the ``model`` keys the schema does not declare:
    :func:`paddletrain.config.factory_options`).
    """
    m = cfg.model
    builder_options: dict[str, Any] = {"arch": m.arch} if m.arch else {}
    builder = model_builder(m.name)
    builder_options.update({key: typed_for(builder, m.name, key, m[key]) for key, default in _MODEL_OPTIONS.items()
                            if m[key] != default})
    builder_options.update(options or {})
    model = create_model(
        m.name,
        num_classes=m.num_classes if m.num_classes is not None else num_classes,
        in_chans=m.in_chans if m.in_chans is not None else in_chans,
        pretrained=m.pretrained,
        strict=m.strict,
        trust_pickle=m.trust_pickle,
        **builder_options,
    )
    set_norms(model, momentum=m.get("norm_momentum"), frozen_scale=bool(m.get("norm_frozen_scale", False)))
    return model


# A parameter the optimizer leaves as it is (learning rate 0: paddletrain.optim's groups), while the gradients
# through it still flow: Paddle's batch norm gives its shift no gradient once its scale has stop_gradient.
FROZEN = "paddletrain_frozen"


def set_norms(model: paddle.nn.Layer, momentum: float | None = None, frozen_scale: bool = False) -> int:
    """Every BatchNorm of ``model`` with running-statistics ``momentum`` (Paddle's sense: the share of the old
    statistics kept; None leaves it) and, with ``frozen_scale``, its scale marked :data:`FROZEN`; returns how many
    layers it set (``model.norm_momentum``, ``model.norm_frozen_scale``)."""
    norms = [layer for layer in model.sublayers(include_self=True)
             if isinstance(layer, paddle.nn.layer.norm._BatchNormBase)]
    for layer in norms:
        if momentum is not None:
            layer._momentum = float(momentum)
        if frozen_scale and layer.weight is not None:
            setattr(layer.weight, FROZEN, True)
    return len(norms)
