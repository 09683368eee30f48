"""Validate a composed config before any work, cheapest first: unknown keys, missing values, every key's declared
range (:func:`paddletrain.config.check_values`), the rules that compare keys, the names looked up in registries,
what needs building to check (callback entries, augmentations, mixup, distillation), and what this machine can run.
Each component's own rules live beside its builder (``check_loss_config``, ``check_optim_config``,
``check_sched_config``, ``check_distill_config``, ``Mixup.check_config``, ``check_callback_entries``); this module
runs them, cheapest first, and holds the rules that compare keys of different groups. Nothing is built to be checked.

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

import paddletrain.builtin_components  # noqa: F401  (registers the built-in names the config may use)
from paddletrain.callbacks.instantiate import check_callback_entries
from paddletrain.config import COMPONENT_GROUPS, SCHEMAS, EvaluateConfig, FitConfig, check_values, component_options
from paddletrain.data.mixup import Mixup
from paddletrain.data.transforms import DEFAULT_CROP_PCT, build_augmentations, eval_image_size
from paddletrain.distill import check_distill_config
from paddletrain.errors import ConfigError, StartRefused, UserError
from paddletrain.job import distributed, slurm
from paddletrain.job.rundir import hold_new_run_dir
from paddletrain.job.runtime import select_device
from paddletrain.losses import check_loss_config, loss_name
from paddletrain.optim import check_optim_config, run_lr
from paddletrain.plugins import prepare
from paddletrain.registry import DATASETS, LOSSES, MODELS, OPTIMIZERS, SCHEDULERS, close_matches
from paddletrain.schedules import check_sched_config

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

    Hydra already rejects wrong types; this adds unknown ``+keys``, required values, every key's declared
    range or choices (:func:`check_values`), the rules that compare keys (:func:`check_key_rules`), then what
    needs the registries or a constructor. ``use`` says what the config is used for on this machine: ``fit``
    (every rule), ``evaluate`` (a saved training config run here: the device must exist, training-only rules
    are skipped) or ``export`` (no machine rules). Every call runs every check; :func:`validate_once` is the
    one entry points call.
    """
    global _last
    if use not in VALIDATION_USES:
        raise ValueError(f"use={use!r} is not one of {VALIDATION_USES}")
    schema = EvaluateConfig if "checkpoint" in cfg else FitConfig
    unknown = unknown_keys(cfg, schema)
    if unknown:
        raise ConfigError(f"unknown config key {unknown[0]} (not in the schema; check the spelling)")
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"missing required value for {', '.join(missing)} (set it on the command line, "
                          f"e.g. {missing[0]}=...)")
    check_values(cfg, schema)
    check_key_rules(cfg)
    prepare(cfg)  # the config's `imports` register their names before the names are looked up
    check_names(cfg)
    check_component_options(cfg)
    check_components(cfg)
    if use != "export":
        _check_machine(cfg, training=use == "fit")
    _last = Validated(config_fingerprint(cfg), use)


def check_key_rules(cfg: Any) -> None:
    """The rules that compare keys with each other: no registry, file or constructor needed."""
    if cfg.data.name in DATASETS_NEEDING_ROOT and not cfg.data.root:
        raise ConfigError(f"missing required value for data.root: data.name={cfg.data.name} reads its images from "
                          f"there (e.g. data.root=/data/my_images)")
    if cfg.data.name == "labellist":
        _check_label_lists(cfg.data)
    if cfg.data.multilabel:
        _check_multilabel(cfg)
    _check_nodes(cfg.trainer)
    _check_data(cfg.data)
    _check_min_lr(cfg)


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
    if is_validated(cfg, use):
        prepare(cfg)
        return
    validate_config(cfg, use)


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
    tta = cfg.get("tta") or {}
    if tta.get("flip") or tta.get("crops", 1) > 1:
        raise ConfigError("tta.flip/tta.crops average softmax outputs over the views, and data.multilabel=true scores "
                          "each class with a sigmoid: set tta.flip=false tta.crops=1")
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


def _check_data(data: Any) -> None:
    if data.mean is not None and data.std is not None and len(data.mean) != len(data.std):
        raise ConfigError(f"data.mean has {len(data.mean)} values but data.std has {len(data.std)}")
    eval_size = eval_image_size(data)  # None while data.image_size is still to come from the weights
    if data.eval_transform == "imagenet" and data.eval_resize and eval_size and data.eval_resize < eval_size:
        size_key = "data.eval_image_size" if data.get("eval_image_size") else "data.image_size"
        raise ConfigError(f"data.eval_resize={data.eval_resize} is smaller than the evaluation crop {size_key}="
                          f"{eval_size}: the centre crop is cut from the resized image, so raise data.eval_resize "
                          f"(e.g. {round(eval_size / DEFAULT_CROP_PCT)}) or leave it null")


def check_names(cfg: Any) -> None:
    """Every name the config looks up in a registry is registered (installed plugins included; the config's
    ``imports`` must have been imported, :func:`paddletrain.plugins.prepare`)."""
    loss = loss_name(cfg.loss.get("name"), bool(cfg.data.get("multilabel")))
    for registry, name in ((DATASETS, cfg.data.name), (MODELS, cfg.model.name), (OPTIMIZERS, cfg.optim.name),
                           (SCHEDULERS, cfg.sched.name), (LOSSES, loss)):
        registry.get(name)


def check_component_options(cfg: Any) -> None:
    """A key a component group's schema does not declare is an option of the factory its ``name`` selects
    (:meth:`paddletrain.registry.Registry.options_of`); a misspelt one is refused with the close names."""
    selected = {"model": (MODELS, cfg.model.name), "data": (DATASETS, cfg.data.name),
                "optim": (OPTIMIZERS, cfg.optim.name), "sched": (SCHEDULERS, cfg.sched.name),
                "loss": (LOSSES, loss_name(cfg.loss.get("name"), bool(cfg.data.get("multilabel"))))}
    for group in COMPONENT_GROUPS:
        registry, name = selected[group]
        extra = component_options(cfg[group], SCHEMAS[group])
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


def _check_min_lr(cfg: Any) -> None:
    """``sched.min_lr`` against the run's learning rate (``optim.lr`` scaled to the global batch)."""
    s, t = cfg.sched, cfg.trainer
    if str(s.name).lower() != "cosine":
        return
    world = t.devices * t.get("num_nodes", 1)
    lr = run_lr(cfg.optim, cfg.data.batch_size * world * t.accumulate_grad_batches)
    if s.min_lr > lr:
        scaled = f" (optim.lr={cfg.optim.lr:g} scaled to the global batch)" if lr != cfg.optim.lr else ""
        raise ConfigError(f"sched.min_lr={s.min_lr} must be <= optim.lr={lr:g}{scaled}")


def check_components(cfg: Any) -> None:
    """Each component's own rules, from the module that builds it, then the rules between them."""
    multilabel = bool(cfg.data.get("multilabel"))
    check_optim_config(cfg.optim)
    check_sched_config(cfg.sched)
    check_loss_config(cfg.loss, multilabel)
    Mixup.check_config(cfg.data.get("mixup"), cfg.loss.label_smoothing)
    # The augmentations' factories are their checks (each also declares its stage): a few tiny objects, rebuilt
    # with the data pipeline.
    build_augmentations(cfg.data.get("augment") or [])
    distill = cfg.trainer.get("distill")
    if distill is not None:
        check_distill_config(distill)
    check_callback_entries(cfg.get("callbacks") or {})
    _check_between_components(cfg)


def _check_between_components(cfg: Any) -> None:
    """Unlabeled images (distillation) have no class: no class-balanced sampler, no Mixup/CutMix."""
    unlabeled = (cfg.trainer.get("distill") or {}).get("unlabeled_root")
    if not unlabeled:
        return
    if cfg.data.get("sampler") == "class_balanced":
        raise ConfigError("data.sampler=class_balanced weighs each image by its class, but the images of "
                          "trainer.distill.unlabeled_root have none: set data.sampler=random")
    if Mixup.enabled(cfg.data.get("mixup")):
        raise ConfigError("trainer.distill.unlabeled_root cannot be combined with data.mixup: mixed targets need "
                          "every image's label; set data.mixup.mixup_alpha=0 and data.mixup.cutmix_alpha=0")


def _check_machine(cfg: Any, training: bool) -> None:
    """Rules that depend on this machine: the device exists, and SyncBatchNorm has GPUs to synchronise."""

    t = cfg.trainer
    try:
        device = select_device(t.device)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if not training or not cfg.model.sync_bn:
        return
    if t.devices < 2:
        raise ConfigError(f"model.sync_bn=true needs trainer.devices >= 2 (it averages BatchNorm statistics across "
                          f"processes); this run has trainer.devices={t.devices}: set model.sync_bn=false")
    if not device.startswith("gpu"):
        raise ConfigError(f"model.sync_bn=true needs GPUs (Paddle runs SyncBatchNorm only there); this run trains on "
                          f"the CPU (trainer.device={t.device}): set model.sync_bn=false")


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
                hold_new_run_dir(run_dir)
        except UserError as exc:
            # Not an exit of its own: the command's wrapper (paddletrain.cli.run_command) says it in one line.
            raise StartRefused(exc) from None
