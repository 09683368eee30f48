"""``create_model``: a registered model, built with its options and, optionally, pretrained weights.

Kept apart from the registry so that the registry imports nothing that registers into it: weight loading
(:mod:`paddletrain.models.pretrained`) knows the ResNet layout, and the ResNet module registers its builders.
"""
from __future__ import annotations

from typing import Any

import paddle

from paddletrain.models.pretrained import load_pretrained
from paddletrain.models.registry import model_builder
from paddletrain.models.weights import describe

__all__ = ["create_model"]


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
