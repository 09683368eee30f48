"""The modules that register names: installed plugins (entry points) and a config's ``imports``.

Downstream packages make their names visible to every paddletrain command line (``fit``, ``evaluate``,
``export``, ``predict``, ``bench``) in one of two ways:

* an entry point in the ``paddletrain.plugins`` group naming a module to import, e.g. in ``pyproject.toml``::

      [project.entry-points."paddletrain.plugins"]
      my_models = "my_package.models"

* or the ``imports`` config key: ``python -m paddletrain.fit imports=[my_package.models] model.name=my_net``.

Registries (:mod:`paddletrain.registry`) load the installed plugins on the first name they do not know. Every
command line calls :func:`prepare` once with its config before it builds anything.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import re
import sys
from collections.abc import Iterable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any

from paddletrain.errors import ConfigError, UserError

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.checkpoint import Checkpoint

log = logging.getLogger("paddletrain")

PLUGIN_GROUP = "paddletrain.plugins"
# Bounds on the ``imports`` of a config (it may come from someone else's checkpoint).
MAX_IMPORTS = 64
_MODULE_NAME = re.compile(r"[A-Za-z_]\w{0,99}(\.[A-Za-z_]\w{0,99}){0,15}")


class PluginError(UserError):
    """A plugin module (entry point or ``imports`` entry) could not be imported."""


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
            hint = ("; make it importable: the working directory, PYTHONPATH or an installed package"
                    if isinstance(exc, ModuleNotFoundError) else "")
            raise PluginError(f"{config_key}: cannot import {module!r}: {exc}{hint}") from exc


def prepare(cfg: Any, checkpoint: Checkpoint | None = None) -> list[str]:
    """Import the modules that register the names a run refers to; every command line calls it once, first.

    Imports the config's ``imports`` and, when a checkpoint is rebuilt (evaluate, export), the ``imports`` of
    the config saved in it too: those are checked not to bring code from the checkpoint's own directory (see
    :func:`check_importable_from_outside`). Installed plugins need no call: registries load them on the
    first name they do not know. Returns the modules named, in import order.
    """
    given = _imports_of(cfg, "imports")
    import_modules(given)
    saved: list[str] = []
    if checkpoint is not None:
        config = checkpoint.state.get("config") if isinstance(checkpoint.state, Mapping) else None
        saved = [m for m in _imports_of(config or {}, f"the imports of checkpoint={checkpoint.path}")
                 if m not in given]
        for module in saved:
            check_importable_from_outside(module, Path(checkpoint.path), f"checkpoint={checkpoint.path}")
        if saved:
            log.info("Importing %s (the imports of the checkpoint's config)", ", ".join(saved))
        import_modules(saved, config_key=f"the imports saved in checkpoint={checkpoint.path}")
    return [*given, *saved]


def _imports_of(cfg: Any, what: str) -> list[str]:
    """The ``imports`` list of a config (DictConfig, dict or dataclass), checked to be plain module names."""
    modules = cfg.get("imports") if isinstance(cfg, Mapping) else getattr(cfg, "imports", None)
    if modules is None:
        return []
    if isinstance(modules, (str, bytes)) or not isinstance(modules, Iterable):
        raise ConfigError(f"{what} must be a list of module names, e.g. imports=[my_package.models]; "
                          f"got {modules!r}")
    modules = list(modules)
    if len(modules) > MAX_IMPORTS:
        raise ConfigError(f"{what} names {len(modules)} modules; at most {MAX_IMPORTS} are allowed")
    for module in modules:
        if not isinstance(module, str) or not _MODULE_NAME.fullmatch(module):
            raise ConfigError(f"{what}: {str(module)[:200]!r} is not a module name (dotted identifiers, "
                              f"e.g. my_package.models)")
    return modules


def check_importable_from_outside(module: str, directory: Path, owner: str) -> None:
    """Refuse ``module`` when importing it would run code from ``directory`` or from a bare folder.

    A checkpoint may come from someone else, with Python files beside its weights; the working directory is
    on ``sys.path``, so its folders import as namespace packages. Each dotted prefix is located (which runs
    only the parents already checked, never the module itself) before the next one is; a module already
    imported is fine. Modules named on the command line are the user's own and are not checked.
    """
    directory = directory.resolve()
    parts = module.split(".")
    for depth in range(1, len(parts) + 1):
        name = ".".join(parts[:depth])
        if name in sys.modules:
            continue
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return  # the import itself reports it, naming the module
        if spec is None:
            return
        if spec.origin is None:
            raise PluginError(f"{owner}: its config imports {module!r}, whose {name!r} is a bare folder "
                              f"(a namespace package), not an installed module; to import it anyway, name "
                              f"it on the command line: imports=[{module}]")
        places = [spec.origin] if spec.has_location else []  # built-in and frozen modules have none
        for place in [*places, *(spec.submodule_search_locations or [])]:
            if Path(place).resolve().is_relative_to(directory):
                raise PluginError(f"{owner}: its config imports {module!r}, whose code lies inside the "
                                  f"checkpoint ({place}); a checkpoint is data and its files are never "
                                  f"imported")
