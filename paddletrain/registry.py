"""Name -> factory registries: one :class:`Registry` class, and every extension point of paddletrain.

One implementation behind every extension point (models, datasets, optimizers, schedulers, losses,
augmentations, callbacks): register under a name, look a name up with an error that names the config key and
suggests close names, list the names. This module imports nothing that registers into it, so any module may
import it without a cycle; the built-in entries register themselves when their modules are imported
(:mod:`paddletrain.validation` imports them all), a downstream package's the same way, found through
:mod:`paddletrain.plugins`. A lookup of a name that is not registered, and a listing of the names, load the
installed plugins (once per process) first.

What each registry holds (the factory's call signature):

A factory's parameters beyond that signature are its own options: ``loss=my_loss loss.my_option=3`` passes
``my_option=3`` to the factory registered as ``my_loss`` (checked against its signature before anything runs).

- ``MODELS``: ``builder(num_classes=..., in_chans=..., **options) -> paddle.nn.Layer``, registered under its
  ``__name__`` by :func:`paddletrain.models.register_model`
- ``DATASETS``: ``builder(cfg: DataConfig, train_transform, eval_transform) -> DatasetSplits``, registered by
  :func:`paddletrain.data.register_dataset`
- ``OPTIMIZERS``: ``factory(param_groups, learning_rate, cfg: OptimConfig) -> paddle.optimizer.Optimizer``
- ``SCHEDULERS``: ``factory(cfg: SchedConfig, base_lr, steps: ScheduleSteps) -> paddle.optimizer.lr.LRScheduler``
- ``LOSSES``: ``factory(cfg: LossConfig) -> loss(logits, targets) -> scalar tensor``; targets are class indices
  or soft targets (``[batch, classes]`` probabilities). A factory that also takes ``class_weights`` (a float64
  ``[classes]`` array, passed only when ``loss.class_weights`` is set) supports per-class weights
- ``AUGMENTATIONS``: ``factory(**options) -> transform`` whose ``stage`` attribute says where it runs:
  ``"image"`` (PIL image -> PIL image, before normalisation) or ``"array"`` (normalised float32 CHW array ->
  array, after it; e.g. random erasing); random draws from python ``random`` / ``numpy.random`` (seeded per
  batch by the loader, so augmentation resumes exactly)
- ``CALLBACKS``: a :class:`~paddletrain.callbacks.Callback` subclass, built with keyword options
"""
from __future__ import annotations

import difflib
import fnmatch
import inspect
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

from paddletrain.errors import ConfigError
from paddletrain.plugins import load_plugins

# An unknown-name message lists every registered name up to this many; beyond it, it says how to list them.
MAX_LISTED = 12

T = TypeVar("T")


class UnknownNameError(ConfigError):
    """A registry was asked for a name nothing is registered under."""


def close_matches(word: str, candidates: Iterable[str], n: int = 5, cutoff: float = 0.6) -> list[str]:
    """Up to ``n`` of ``candidates`` that look like ``word`` (for "did you mean" hints)."""
    return difflib.get_close_matches(word, list(candidates), n=n, cutoff=cutoff)


# A registered name is short: at difflib's 0.6 an unrelated one passes (bars ~ shards), and the hint that a plugin's
# name needs its package would be lost; 0.7 still catches a slip of one letter in a name of four or more.
NAME_CUTOFF = 0.7


class Registry(Generic[T]):
    """Named factories of one kind.

    Args:
        kind: what is registered, for messages ("model", "optimizer", ...).
        config_key: the config key that selects a name (e.g. ``optim.name``), for messages.
        listing: how a user lists the names (e.g. ``paddletrain.models.list_models()``); an unknown-name
            message points there instead of listing more than :data:`MAX_LISTED` names.
        positional: how many leading positional arguments paddletrain passes a factory (e.g. an optimizer's
            ``param_groups, learning_rate, cfg``), and ``keywords`` the keyword arguments it may pass itself;
            every other parameter of a factory is one of its own options (:meth:`options_of`), which the
            command line sets as ``<group>.<option>=value``.
    """

    def __init__(self, kind: str, config_key: str, listing: str | None = None, positional: int = 0,
                 keywords: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self.config_key = config_key
        self.listing = listing
        self.positional = positional
        self.keywords = keywords
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

    def unregister(self, name: str) -> None:
        """Forget ``name`` (a test's temporary entry); an unknown name is ignored."""
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        """The factory registered as ``name``; unknown names load the installed plugins once, then fail."""
        if name not in self._entries:
            load_plugins()
        if name not in self._entries:
            raise UnknownNameError(self._unknown(name))
        return self._entries[name]

    def _unknown(self, name: str) -> str:
        """One line: the key and value, close names (else how another package's name becomes known), the names."""
        names = self.names()
        close = close_matches(name, names, cutoff=NAME_CUTOFF)
        if self.listing and len(names) > MAX_LISTED:
            known = f"{len(names)} registered, listed by {self.listing}"
        else:
            known = f"registered: {', '.join(names) or 'none'}"
        if close:
            return f"unknown {self.kind} {self.config_key}={name!r}; did you mean {', '.join(close)}? ({known})"
        # No close name: more likely another package's name than a typo.
        return (f"unknown {self.kind} {self.config_key}={name!r} ({known}); a {self.kind} of another package needs "
                f"that package installed (a paddletrain plugin) or its module in imports=[...]")

    def options_of(self, name: str) -> list[str] | None:
        """The keyword options of the factory registered as ``name`` beyond what paddletrain passes it: the
        parameters after its first ``positional`` ones, except ``keywords``. None when it takes ``**kwargs``."""
        params = list(inspect.signature(self.get(name)).parameters.values())
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return None
        by_keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        return [p.name for p in params[self.positional:] if p.kind in by_keyword and p.name not in self.keywords]

    def names(self, pattern: str = "*") -> list[str]:
        """Sorted registered names matching the shell-style ``pattern``, the installed plugins' included."""
        load_plugins()
        return sorted(fnmatch.filter(self._entries, pattern))

    def __contains__(self, name: object) -> bool:
        """Registered so far (a cheap check: plugins not loaded yet are not searched; :meth:`names` does)."""
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)


def _origin(factory: object) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', repr(factory))}"


MODELS: Registry[Any] = Registry("model", "model.name", listing="paddletrain.models.list_models()",
                                 keywords=("num_classes", "in_chans"))
DATASETS: Registry[Any] = Registry("dataset", "data.name", listing="paddletrain.data.list_datasets()", positional=3)
OPTIMIZERS: Registry[Any] = Registry("optimizer", "optim.name", positional=3)
SCHEDULERS: Registry[Any] = Registry("scheduler", "sched.name", positional=3)
LOSSES: Registry[Any] = Registry("loss", "loss.name", positional=1, keywords=("class_weights", "multilabel"))
AUGMENTATIONS: Registry[Any] = Registry("augmentation", "data.augment")
CALLBACKS: Registry[Any] = Registry("callback", "callbacks")
