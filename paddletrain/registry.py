"""Name -> factory registries and the plugins that fill them.

One implementation behind every extension point (models, datasets, optimizers, schedulers, losses,
augmentations, callbacks): register under a name, look a name up with an error that names the config key and
suggests close names, list the names. A registry module imports nothing that registers into it.

Downstream packages make their names visible to every paddletrain command line (``fit``, ``evaluate``,
``export``, ``predict``, ``bench``) in one of two ways:

* an entry point in the ``paddletrain.plugins`` group naming a module to import, e.g. in ``pyproject.toml``::

      [project.entry-points."paddletrain.plugins"]
      my_models = "my_package.models"

* or the ``imports`` config key: ``python -m paddletrain.fit imports=[my_package.models] model.name=my_net``.

A name that is not registered loads the installed plugins once before it is reported unknown.
"""
from __future__ import annotations

import difflib
import fnmatch
import importlib
import logging
from collections.abc import Callable, Iterable
from importlib.metadata import entry_points
from typing import Generic, TypeVar

from paddletrain.errors import ConfigError, UserError

log = logging.getLogger("paddletrain")

PLUGIN_GROUP = "paddletrain.plugins"

T = TypeVar("T")


class UnknownNameError(ConfigError):
    """A registry was asked for a name nothing is registered under."""


class PluginError(UserError):
    """A plugin module (entry point or ``imports`` entry) could not be imported."""


def close_matches(word: str, candidates: Iterable[str], n: int = 5) -> list[str]:
    """Up to ``n`` of ``candidates`` that look like ``word`` (for "did you mean" hints)."""
    return difflib.get_close_matches(word, list(candidates), n=n, cutoff=0.6)


class Registry(Generic[T]):
    """Named factories of one kind.

    Args:
        kind: what is registered, for messages ("model", "optimizer", ...).
        config_key: the config key that selects a name (e.g. ``optim.name``), for messages.
    """

    def __init__(self, kind: str, config_key: str) -> None:
        self.kind = kind
        self.config_key = config_key
        self._entries: dict[str, T] = {}

    def register(self, name: str | None = None) -> Callable[[T], T]:
        """Decorator registering a factory under ``name`` (default: its ``__name__``).

        Registering a second, different factory under a taken name is an error: two modules would shadow
        each other silently.
        """

        def decorator(factory: T) -> T:
            key = name or getattr(factory, "__name__", None)
            if not key:
                raise ValueError(f"register a {self.kind} under an explicit name")
            existing = self._entries.get(key)
            if existing is not None and existing is not factory:
                raise ValueError(f"{self.kind} {key!r} is already registered by {_origin(existing)}; "
                                 f"rename {_origin(factory)}")
            self._entries[key] = factory
            return factory

        return decorator

    def get(self, name: str) -> T:
        """The factory registered as ``name``; unknown names load the installed plugins once, then fail."""
        if name not in self._entries:
            load_plugins()
        if name not in self._entries:
            close = close_matches(name, self._entries)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise UnknownNameError(f"unknown {self.kind} {self.config_key}={name!r}{hint} "
                                   f"(registered: {', '.join(self.names()) or 'none'})")
        return self._entries[name]

    def names(self, pattern: str = "*") -> list[str]:
        """Sorted registered names matching the shell-style ``pattern``."""
        return sorted(fnmatch.filter(self._entries, pattern))

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)


def _origin(factory: object) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}"


_plugins_loaded = False


def load_plugins() -> list[str]:
    """Import every module of the ``paddletrain.plugins`` entry-point group (once per process).

    Returns the names of the entry points loaded by this call. A plugin that fails to import is an error
    naming it and its package: a half-registered plugin would fail later in a more confusing place.
    """
    global _plugins_loaded
    if _plugins_loaded:
        return []
    _plugins_loaded = True
    loaded = []
    for entry in entry_points(group=PLUGIN_GROUP):
        try:
            entry.load()
        except Exception as exc:
            dist = getattr(entry.dist, "name", "?")
            raise PluginError(f"the paddletrain plugin {entry.name!r} ({entry.value}, from the package {dist}) "
                              f"failed to import: {type(exc).__name__}: {exc}") from exc
        loaded.append(entry.name)
    if loaded:
        log.debug("Loaded paddletrain plugins: %s", ", ".join(loaded))
    return loaded


def import_modules(modules: Iterable[str], config_key: str = "imports") -> None:
    """Import each module of the ``imports`` config key so that it registers its names."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise PluginError(f"{config_key}: cannot import {module!r}: {exc}") from exc
