"""Callbacks from the ``callbacks`` config node: a name -> entry mapping, Lightning-hydra-template style.

An entry is either options for the callback registered under its name in
:data:`paddletrain.registry.CALLBACKS`::

    callbacks:
      early_stopping: {patience: 5}

or any class by ``_target_`` (Hydra instantiates it, so nested ``_target_`` nodes work too)::

    callbacks:
      my_logger: {_target_: my_package.MyLogger, every: 10}

``null`` switches an entry off (``callbacks.visualdl=null`` on the command line). Entries are checked (the
class exists, is a callback, takes every option given, and its ``check_options`` accepts their values) before
anything is built, and each is built once; every failure is one line naming ``callbacks.<name>``.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from paddletrain.engine.callback import Callback
from paddletrain.errors import ConfigError
from paddletrain.registry import CALLBACKS, UnknownNameError, close_matches

TARGET = "_target_"


def _plain(entry: Any) -> dict[str, Any] | None:
    if entry is None:
        return None
    if isinstance(entry, DictConfig):
        entry = OmegaConf.to_container(entry, resolve=True)
    if not isinstance(entry, Mapping):
        raise ConfigError(f"must be a mapping of options (or null to switch it off), got {entry!r}")
    return dict(entry)


def callback_class(name: str, entry: Mapping[str, Any]) -> type:
    """The class an entry builds: its ``_target_``, else the callback registered as ``name``."""
    if TARGET in entry:
        try:
            cls = get_class(str(entry[TARGET]))
        except Exception as exc:  # Hydra wraps import errors in its own types
            raise ConfigError(f"_target_={entry[TARGET]} cannot be imported ({exc})") from None
    else:
        try:
            cls = CALLBACKS.get(name)
        except UnknownNameError:
            close = close_matches(name, CALLBACKS.names())
            raise ConfigError(f"no callback is registered under this name"
                              f"{'; did you mean ' + ', '.join(close) + '?' if close else ''} (registered: "
                              f"{', '.join(CALLBACKS.names())}); give a class with _target_") from None
    if not (inspect.isclass(cls) and issubclass(cls, Callback)):
        raise ConfigError(f"{cls!r} is not a paddletrain.callbacks.Callback subclass")
    return cls


def _check_options(cls: type, options: Mapping[str, Any]) -> None:
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    accepted = [n for n, p in params.items() if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    for key in options:
        if key not in accepted:
            close = close_matches(key, accepted, n=3)
            raise ConfigError(f"{cls.__name__} has no option {key!r}"
                              f"{' (did you mean ' + ', '.join(close) + '?)' if close else ''}; its options: "
                              f"{', '.join(accepted) or 'none'}")


def check_callback_entries(entries: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` for the first entry whose class, options or option values are wrong, without
    building anything: the options must bind to the class's signature and pass its
    :meth:`~paddletrain.engine.callback.Callback.check_options`."""
    for name, raw in entries.items():
        try:
            entry = _plain(raw)
            if entry is None:
                continue
            cls = callback_class(name, entry)
            options = {k: v for k, v in entry.items() if k != TARGET}
            _check_options(cls, options)
            cls.check_options(options)
        except (ConfigError, ValueError, TypeError) as exc:
            raise ConfigError(f"callbacks.{name}: {exc}") from None


def instantiate_callbacks(entries: Mapping[str, Any]) -> list[Callback]:
    """Build every switched-on entry, once, in the order given, after :func:`check_callback_entries` (which builds
    nothing) has checked them all."""
    check_callback_entries(entries)
    callbacks = []
    for name, raw in entries.items():
        entry = _plain(raw)
        if entry is None:
            continue
        try:
            if TARGET in entry:
                callbacks.append(instantiate(entry, _convert_="all"))
            else:
                callbacks.append(callback_class(name, entry)(**entry))
        except InstantiationException as exc:
            cause = exc.__cause__ or exc
            raise ConfigError(f"callbacks.{name}: {cause}") from None
        except (ConfigError, ValueError, TypeError) as exc:
            raise ConfigError(f"callbacks.{name}: {exc}") from None
    return callbacks
