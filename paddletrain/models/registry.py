"""Name -> builder registry: ``@register_model``, ``create_model`` and ``list_models``.

A builder is a function that takes keyword options (at least ``num_classes`` and ``in_chans``) and returns a
``paddle.nn.Layer``. Its ``__name__`` is the model's name, so ``create_model("resnet50")`` finds ``resnet50``.
"""
from __future__ import annotations

import difflib
import fnmatch
import inspect
from typing import Any, Callable, Iterable, Mapping, Optional, TypeVar

import paddle

from ..errors import ConfigError

__all__ = [
    "ModelOptionError",
    "UnknownModelError",
    "create_model",
    "is_model",
    "list_models",
    "register_model",
    "check_model_options",
]

Builder = TypeVar("Builder", bound=Callable[..., paddle.nn.Layer])

_BUILDERS: dict[str, Callable[..., paddle.nn.Layer]] = {}


class UnknownModelError(ConfigError):
    """``create_model`` was asked for a name no builder is registered under."""


class ModelOptionError(ConfigError, TypeError):
    """A builder was given an option it does not accept (a ``TypeError`` too, as Python would raise)."""


def _close_matches(word: str, candidates: Iterable[str], n: int = 5) -> list[str]:
    return difflib.get_close_matches(word, list(candidates), n=n, cutoff=0.6)


def register_model(fn: Builder) -> Builder:
    """Register ``fn`` as the builder of the model named ``fn.__name__``.

    Raises:
        ValueError: a builder is already registered under that name (two modules would shadow each other).
    """
    name = fn.__name__
    if name in _BUILDERS:
        existing = _BUILDERS[name]
        raise ValueError(
            f"Model {name!r} is already registered by {existing.__module__}.{existing.__qualname__}; "
            f"rename {fn.__module__}.{fn.__qualname__}."
        )
    _BUILDERS[name] = fn
    return fn


def is_model(name: str) -> bool:
    """True when a builder is registered under ``name``."""
    return name in _BUILDERS


def list_models(pattern: str = "*") -> list[str]:
    """Sorted names of the registered models matching the shell-style ``pattern`` (e.g. ``"resnet*_vd"``)."""
    return sorted(fnmatch.filter(_BUILDERS, pattern))


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
        close = _close_matches(key, accepted, n=3)
        hints.append(f"{key!r}" + (f" (did you mean {', '.join(map(repr, close))}?)" if close else ""))
    raise ModelOptionError(
        f"Model {model_name!r} got unknown option(s) {', '.join(hints)}. "
        f"Accepted options: {', '.join(sorted(accepted))}."
    )


def create_model(
    name: str,
    num_classes: int = 1000,
    in_chans: int = 3,
    pretrained: Optional[str] = None,
    *,
    strict: bool = True,
    trust_pickle: bool = False,
    **kwargs: Any,
) -> paddle.nn.Layer:
    """Build the registered model ``name``, optionally loading weights.

    Args:
        name: a name from :func:`list_models`.
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
    if name not in _BUILDERS:
        close = _close_matches(name, _BUILDERS)
        hint = f" Did you mean: {', '.join(close)}?" if close else ""
        raise UnknownModelError(
            f"Unknown model {name!r}.{hint} See paddletrain.models.list_models() for the "
            f"{len(_BUILDERS)} registered names."
        )
    if pretrained:
        # Imported here so the registry stays importable without the loaders' dependencies.
        from .pretrained import load_pretrained
        from .weights import describe

        # Options the weights need (e.g. PaddleClas' projection shortcut), unless the caller sets them.
        kwargs = {**describe(pretrained).model_options, **kwargs}
    model = _BUILDERS[name](num_classes=num_classes, in_chans=in_chans, **kwargs)
    if pretrained:
        load_pretrained(model, pretrained, strict=strict, trust_pickle=trust_pickle)
    return model
