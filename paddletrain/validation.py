"""Validate a composed config before any work, cheapest first: unknown keys, missing values, every key's declared
range (:func:`paddletrain.config.check_values`), the rules that compare keys, the names looked up in registries,
each component's own rules, and what this machine can run. Each component's rules live beside its builder
(``check_loss_config``, ``check_optim_config``, ``check_sched_config``, ``check_transform_config``,
``Mixup.check_config``, ``check_distill_config``, ``check_callback_entries``, ``job.runtime.check_machine``); this
module runs them and holds the rules that compare keys of different groups. A rule that needs a component's view
of the config (the run's learning rate, the loss the task uses, whether Mixup is on) gets it as a value from that
component, so the config goes to each module once. Nothing is built to be checked.

Once per process: the entry point validates (``fit``: :class:`RunDirGuard` before Hydra
writes the run directory, else :func:`validate_once` in ``build.train``); later calls with the same config
skip the work (:func:`validate_once`). The ranks a launcher starts inherit its verdict through
:data:`VALIDATED_ENV`.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import re
import typing
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from omegaconf import OmegaConf, open_dict, read_write

import paddletrain.callbacks  # noqa: F401  (registers the callbacks)
import paddletrain.data.transforms.augment  # noqa: F401  (the augmentations)
import paddletrain.losses  # noqa: F401  (the losses)
import paddletrain.models  # noqa: F401  (the models)
import paddletrain.optim  # noqa: F401  (the optimizers and schedulers)
from paddletrain.callbacks.instantiate import check_callback_entries
from paddletrain.config import COMPONENT_GROUPS, SCHEMAS, EvaluateConfig, FitConfig, check_values, factory_options
from paddletrain.data import register_builtin_datasets
from paddletrain.data.transforms.mixup import Mixup
from paddletrain.data.transforms.presets import build_augmentations, check_transform_config
from paddletrain.distill import check_distill_config
from paddletrain.engine.resume import refuse_replacing_a_run
from paddletrain.errors import ConfigError, StartRefused, UserError
from paddletrain.job import distributed, slurm
from paddletrain.job.rundir import hold_new_run_dir
from paddletrain.job.runtime import check_machine
from paddletrain.losses import check_loss_config
from paddletrain.optim import check_optim_config, run_lr
from paddletrain.plugins import prepare
from paddletrain.registry import DATASETS, LOSSES, MODELS, OPTIMIZERS, SCHEDULERS, close_matches
from paddletrain.schedules import check_sched_config

# The built-in names a config may use register themselves when their modules are imported, and the registries
# import none of them (paddletrain.registry): the config's checks load them here, once.
register_builtin_datasets()

# Built-in datasets that cannot run without data.root (the others have a default location or need no files).
DATASETS_NEEDING_ROOT = ("imagefolder", "labellist")
# Built-in datasets of one class per image: data.multilabel=true cannot apply to them.
SINGLE_LABEL_DATASETS = ("shapes", "imagefolder", "cifar10", "cifar100", "mnist", "fashion_mnist")
# The monitor that build.py replaces by val/mAP in a multi-label run (a schema default, not a user's choice).
DEFAULT_MONITOR = "val/top1"
_TOPK_METRIC = re.compile(r"(train|val)/top[0-9]+")

def _check_nodes(trainer: Any) -> None:
    """The multi-node keys agree with each other (each one's own range is declared on the field)."""

    # A config saved before these keys existed (an older checkpoint's) ran on one node.
    num_nodes, node_rank, master = trainer.get("num_nodes", 1), trainer.get("node_rank", 0), trainer.get("master")
    if node_rank >= num_nodes:
        raise ConfigError(f"trainer.node_rank={node_rank} must be between 0 and trainer.num_nodes - 1 "
                          f"(trainer.num_nodes={num_nodes})")
    if num_nodes > 1:
        host, _, port = str(master or "").rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"trainer.master={master} must be host:port of node 0 (a free port there) "
                              f"when trainer.num_nodes={num_nodes}, e.g. trainer.master=10.0.0.1:29500")


def unknown_keys(node: Any, schema: type, prefix: str = "") -> list[str]:
    """Keys of ``node`` that ``schema`` does not declare, but for the top level of a component group, whose extra
    keys are its factory's options (:func:`check_component_options`, once the registries are complete).

    Hydra's ``+key=value`` force-adds keys even into typed nodes, so this check is the one that catches them.
    """
    hints = typing.get_type_hints(schema)
    found = []
    for key in node.keys():
        if key not in hints:
            if prefix.rstrip(".") not in COMPONENT_GROUPS:
                found.append(f"{prefix}{key}")
        elif dataclasses.is_dataclass(hints[key]) and node[key] is not None:
            found.extend(unknown_keys(node[key], hints[key], f"{prefix}{key}."))
    return found


def validate_config(cfg: Any, use: str = "fit") -> None:
    """Raise :class:`ConfigError` naming the first key that is missing or whose value is not allowed.

    Hydra already rejects wrong types; this adds, cheapest first: unknown ``+keys`` and required values, every
    key's declared range or choices (:func:`check_values`), the config's ``imports``, the rules that compare keys
    and the names and options looked up in registries (:func:`check_key_rules`), each component's own rules from
    the module that builds it, and what this machine can run. ``use`` says what the config is used for on this
    machine: ``fit`` (every rule), ``evaluate`` (a saved training config run here: the device must exist,
    training-only rules are skipped) or ``export`` (no machine rules). Every call runs every check;
    :func:`validate_once` is the one entry points call.

    The config is handed to each module once, in this order; the rules between groups that need a component's
    view (the run's learning rate, whether Mixup is on) get it as a value from that component.
    """
    global _last
    if use not in VALIDATION_USES:
        raise ValueError(f"use={use!r} is not one of {VALIDATION_USES}")
    schema = EvaluateConfig if "checkpoint" in cfg else FitConfig
    fingerprint = config_fingerprint(cfg)
    unknown = unknown_keys(cfg, schema)
    if unknown:
        raise ConfigError(f"unknown config key {unknown[0]} (not in the schema; check the spelling)")
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"missing required value for {', '.join(missing)} (set it on the command line, "
                          f"e.g. {missing[0]}=...)")
    check_values(cfg, schema)
    options = factory_options(cfg)
    prepare(cfg)  # the config's `imports` register their names before the names are looked up
    multilabel = bool(cfg.data.get("multilabel"))
    loss = check_loss_config(cfg.loss, multilabel)  # the loss's own rules; it says which loss the task uses
    check_key_rules(cfg, loss, options)
    # Each other component's own rules, from the module that builds it; nothing is built to be checked.
    t = cfg.trainer
    check_optim_config(cfg.optim)
    lr = run_lr(cfg.optim, cfg.data.batch_size * t.devices * t.get("num_nodes", 1) * t.accumulate_grad_batches)
    check_sched_config(cfg.sched, run_lr=lr, lr=cfg.optim.lr)
    check_transform_config(cfg.data)
    # The augmentations' factories are their checks (each also declares its stage): a few tiny objects, rebuilt
    # with the data pipeline.
    build_augmentations(cfg.data.get("augment") or [])
    Mixup.check_config(cfg.data.get("mixup"), cfg.loss.label_smoothing)
    mixing = Mixup.enabled(cfg.data.get("mixup"))
    if t.get("distill") is not None:
        check_distill_config(t.distill, sampler=cfg.data.get("sampler"), mixing=mixing)
    check_callback_entries(cfg.get("callbacks") or {})
    if use != "export":
        check_machine(t, sync_bn=cfg.model.sync_bn, training=use == "fit")
    _last = Validated(fingerprint, use)


def check_key_rules(cfg: Any, loss: str, options: dict[str, dict[str, Any]]) -> None:
    """The rules that compare keys with each other (no file or constructor needed), then every name the config
    looks up in a registry (installed plugins included; the config's ``imports`` must have been imported,
    :func:`paddletrain.plugins.prepare`) and the options of the factories they select; ``loss`` is the loss's
    registered name (:func:`paddletrain.losses.check_loss_config`), ``options`` each group's keys its schema does not
    declare (:func:`paddletrain.config.factory_options`).

    A key a component group's schema does not declare is an option of the factory its ``name`` selects
    (:meth:`paddletrain.registry.Registry.options_of`); a misspelt one is refused with the close names.
    """
    if cfg.data.name in DATASETS_NEEDING_ROOT and not cfg.data.root:
        raise ConfigError(f"missing required value for data.root: data.name={cfg.data.name} reads its images from "
                          f"there (e.g. data.root=/data/my_images)")
    if cfg.data.name == "labellist":
        _check_label_lists(cfg.data)
    if cfg.data.multilabel:
        _check_multilabel(cfg)
    _check_nodes(cfg.trainer)
    # The registries last, in this function: every rule of this module has run before the config leaves it.
    selected = {"model": (MODELS, cfg.model.name), "data": (DATASETS, cfg.data.name),
                "optim": (OPTIMIZERS, cfg.optim.name), "sched": (SCHEDULERS, cfg.sched.name),
                "loss": (LOSSES, loss)}
    for group in ("data", "model", "optim", "sched", "loss"):  # the order a user reads the names in
        registry, name = selected[group]
        registry.get(name)
    for group in COMPONENT_GROUPS:
        registry, name = selected[group]
        extra = options[group]
        accepted = registry.options_of(name) if extra else None
        if accepted is None:
            continue
        declared = [f.name for f in dataclasses.fields(SCHEMAS[group])]
        own = [option for option in accepted if option not in declared]
        for key in extra:
            if key not in accepted:
                close = close_matches(key, dict.fromkeys([*own, *declared]), n=3)
                hint = f"; did you mean {', '.join(f'{group}.{c}' for c in close)}?" if close else ""
                takes = f"whose options are: {', '.join(own)}" if own else "which takes none"
                raise ConfigError(f"unknown config key {group}.{key} (neither a {group} key nor an option of "
                                  f"{registry.config_key}={name}, {takes}{hint})")


# ---------------------------------------------------------------------------------------------- once per process
# Set by a launcher for the ranks it starts: "<use>:<fingerprint>" of the config it validated.
VALIDATED_ENV = "PADDLETRAIN_VALIDATED_CONFIG"


@dataclasses.dataclass
class Validated:
    """The last config this process validated: its fingerprint and its use."""

    fingerprint: str
    use: str


_last: Validated | None = None


def config_fingerprint(cfg: Any) -> str:
    """A digest of ``cfg`` as written (interpolations unresolved): equal configs, equal fingerprints."""
    return hashlib.sha256(OmegaConf.to_yaml(cfg).encode()).hexdigest()


def validated_marker(cfg: Any, use: str = "fit") -> str:
    """The value of :data:`VALIDATED_ENV` that tells a started process ``cfg`` was validated for ``use``."""
    return f"{use}:{config_fingerprint(cfg)}"


def is_validated(cfg: Any, use: str = "fit") -> bool:
    """Whether this process, or the launcher that started it (:data:`VALIDATED_ENV`), validated ``cfg`` for
    ``use``."""
    marker = validated_marker(cfg, use)
    return os.environ.get(VALIDATED_ENV) == marker or (_last is not None and f"{_last.use}:{_last.fingerprint}"
                                                        == marker)


def validate_once(cfg: Any, use: str = "fit") -> None:
    """:func:`validate_config`, unless ``cfg`` was validated for ``use`` already (:func:`is_validated`).

    The config's ``imports`` are imported either way: a rank whose launcher validated still needs them.
    """
    if not is_validated(cfg, use):
        validate_config(cfg, use)
    else:
        prepare(cfg)


VALIDATION_USES = ("fit", "evaluate", "export")


def _check_label_lists(data: Any) -> None:
    missing = [key for key in ("train_list", "val_list") if not data.get(key)]
    if missing:
        raise ConfigError(f"missing required value for data.{missing[0]}: data.name=labellist reads its samples from "
                          f"list files (data.train_list=<file> data.val_list=<file>, '<path> <label>' a line)")


def _check_multilabel(cfg: Any) -> None:
    """data.multilabel=true: data that has multi-hot labels, and no key that needs one class per image."""
    if cfg.data.name in SINGLE_LABEL_DATASETS:
        raise ConfigError(f"data.multilabel=true but data.name={cfg.data.name} has one class per image; multi-label "
                          "data comes from data=labellist (PaddleClas's '<path><TAB>0,1,0,...' lists)")
    if (cfg.trainer.get("distill") or {}).get("teacher"):
        raise ConfigError("trainer.distill.teacher is set but data.multilabel=true: distillation compares softmax "
                          "distributions over one class per image; set trainer.distill.teacher=null")
    for prefix, tta in (("tta", cfg.get("tta") or {}), ("trainer.tta", cfg.trainer.get("tta") or {})):
        if tta.get("flip") or (tta.get("crops") or 1) > 1 or tta.get("translate"):
            raise ConfigError(f"{prefix}.flip/crops/translate average softmax outputs over the views, and "
                              "data.multilabel=true scores each class with a sigmoid: set "
                              f"{prefix}.flip=false {prefix}.crops=1 {prefix}.translate=0")
    if cfg.data.get("sampler") == "class_balanced":
        raise ConfigError("data.sampler=class_balanced weighs each image by its one class, but data.multilabel=true "
                          "images have several: set data.sampler=random, or give loss.class_weights as a list")
    if cfg.loss.get("class_weights") == "balanced":
        raise ConfigError("loss.class_weights=balanced counts each image's one class, but data.multilabel=true images "
                          "have several: give one weight per class as a list")
    for key, value in _monitors(cfg):
        if _TOPK_METRIC.fullmatch(str(value)):
            raise ConfigError(f"{key}={value} does not exist with data.multilabel=true (top-k accuracy needs one "
                              "class per image): monitor val/mAP, val/f1 or val/loss")


def _monitors(cfg: Any) -> list[tuple[str, Any]]:
    """The monitor keys a user set: ``monitor`` unless it is the default, and every callback's own ``monitor``
    that does not follow ``${monitor}``."""
    found = [("monitor", cfg.monitor)] if cfg.get("monitor") not in (None, DEFAULT_MONITOR) else []
    for name, entry in (cfg.get("callbacks") or {}).items():
        if OmegaConf.is_config(entry) and "monitor" in entry and not OmegaConf.is_interpolation(entry, "monitor"):
            found.append((f"callbacks.{name}.monitor", entry.monitor))
    return found


class RunDirGuard(Callback):
    """Hydra callback for `paddletrain.fit`: validates the config (the run's one validation,
    below) and locks the run directory before Hydra creates it and writes ``.hydra/``
    there, so a bad value or a busy directory stops the run before any work. It raises
    :class:`~paddletrain.errors.StartRefused`; the command's wrapper (:func:`paddletrain.cli.run_command`) says why.

    Enabled in ``conf/fit.yaml`` under ``hydra.callbacks``. Ranks of a ``trainer.devices=N`` job skip it:
    their launcher already checked and holds the directory.
    """

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        if distributed.is_launched():
            return
        try:
            # Resolving hydra.run.dir may use ${hydra:...}; Hydra sets this itself just after this hook, and
            # resolves the same node (its ${now:...} is cached), so this is the directory the run will use.
            HydraConfig.instance().set_config(config)
            run_dir = Path(os.path.abspath(str(OmegaConf.select(config, "hydra.run.dir"))))
            task = copy.deepcopy(config)  # what the task function will get, as Hydra builds it
            with read_write(task), open_dict(task):
                del task["hydra"]
        except Exception:  # an odd config: fit's own checks report it once Hydra has set up logging
            return
        try:
            validate_config(task)
            # Several nodes share one run directory: node 0's launcher (under SLURM, task 0) holds it for the job.
            if slurm.holds_run_dir(task):
                hold_new_run_dir(run_dir)  # first: a directory another run holds is "in use", whatever it holds
                refuse_replacing_a_run(task.trainer.resume, run_dir)
        except UserError as exc:
            # Not an exit of its own: the command's wrapper (paddletrain.cli.run_command) says it in one line.
            raise StartRefused(exc) from None
