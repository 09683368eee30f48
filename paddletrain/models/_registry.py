"""Model names -> builders: ``@register_model``, ``list_models``, ``is_model`` and the builders' option check.

A builder is a function that takes keyword options (at least ``num_classes`` and ``in_chans``) and returns a
``paddle.nn.Layer``; its ``__name__`` is the model's name, so ``create_model("resnet50")`` finds ``resnet50``.
Builders live in :data:`paddletrain.registry.MODELS`. This module imports none of them (``paddletrain.models``
imports the built-in ones; a plugin package registers its own) and nothing about weights: building a model,
with or without pretrained weights, is :func:`paddletrain.models.factory.create_model`.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from paddletrain.errors import ConfigError
from paddletrain.registry import MODELS, UnknownNameError, close_matches

__all__ = [
    "ModelOptionError",
    "UnknownModelError",
    "check_model_options",
    "is_model",
    "list_models",
    "model_builder",
    "register_model",
]

Builder = TypeVar("Builder", bound=Callable[..., Any])


class UnknownModelError(UnknownNameError):
    """No builder is registered under the name asked for (a :class:`~paddletrain.errors.ConfigError`)."""


class ModelOptionError(ConfigError, TypeError):
    """A builder was given an option it does not accept (a ``TypeError`` too, as Python would raise)."""


def register_model(fn: Builder) -> Builder:
    """Register ``fn`` as the builder of the model named ``fn.__name__``.

    Raises:
        ValueError: another builder is already registered under that name (two modules would shadow each other).
    """
    return MODELS.register()(fn)


def is_model(name: str) -> bool:
    """True when a builder is registered under ``name`` (an installed plugin's included)."""
    return name in MODELS or name in MODELS.names()


def list_models(pattern: str = "*") -> list[str]:
    """Sorted names of the registered models matching the shell-style ``pattern`` (e.g. ``"resnet*_vd"``)."""
    return MODELS.names(pattern)


def model_builder(name: str) -> Callable[..., Any]:
    """The builder registered as ``name``.

    Raises:
        UnknownModelError: nothing is registered under ``name``, not even by an installed plugin (the
            message names ``model.name`` and close names).
    """
    try:
        return MODELS.get(name)
    except UnknownNameError as exc:
        raise UnknownModelError(str(exc)) from None


def check_model_options(model_name: str, options: Mapping[str, Any], target: Callable[..., Any]) -> None:
    """Raise :class:`ModelOptionError` if ``options`` holds a keyword that ``target`` does not accept.

    Builders forward ``**kwargs`` to a model class; checking here turns Python's bare "unexpected keyword
    argument" into a message naming the model, the option and the ones it could have meant.
    """
    params = inspect.signature(target).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if n != "self" and p.kind is not inspect.Parameter.VAR_POSITIONAL]
    unknown = [k for k in options if k not in accepted]
    if not unknown:
        return
    hints = []
    for key in unknown:
        close = close_matches(key, accepted, n=3)
        hints.append(f"{key!r}" + (f" (did you mean {', '.join(map(repr, close))}?)" if close else ""))
    raise ModelOptionError(
        f"Model {model_name!r} got unknown option(s) {', '.join(hints)}. "
        f"Accepted options: {', '.join(sorted(accepted))}."
    )
