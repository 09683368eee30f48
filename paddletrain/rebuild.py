"""Reading a run back: the config saved in a checkpoint made the run's truth again, its weights chosen (averaged
or raw), its model rebuilt, and what ``evaluate`` scores (:func:`build_evaluation`), ``export`` and ``ship``
take (:func:`rebuild_checkpoint`).

The other composition root, beside :mod:`paddletrain.build` (a config made into a training run): both hand
built objects to the components and share their builders (the loss and the meters: :func:`~paddletrain.build.
task_parts`).
"""
from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import paddle
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import ConfigKeyError, ValidationError

import paddletrain
from paddletrain.build import resolve_preprocessing, task_parts
from paddletrain.callbacks.ema import averaged_weights
from paddletrain.checkpoint import Checkpoint, load_checkpoint
from paddletrain.checkpoint.locate import locate_checkpoint
from paddletrain.config import (
    COMPONENT_GROUPS,
    SCHEMAS,
    EvaluateConfig,
    FitConfig,
    TTAConfig,
    check_values,
    component_options,
    factory_options,
)
from paddletrain.data import DatasetError, build_datasets, build_transform, preprocessing_info
from paddletrain.data.datasets import EVAL_SOURCES
from paddletrain.data.loading.bundle import build_data
from paddletrain.data.transforms.presets import eval_image_size
from paddletrain.engine.limits import Limits
from paddletrain.engine.state_checks import check_state_matches
from paddletrain.engine.trainer import Trainer
from paddletrain.errors import UserError
from paddletrain.job.runtime import seed_everything, setup_runtime
from paddletrain.metrics.multilabel import MultiLabelReport
from paddletrain.models.factory import build_model
from paddletrain.models.tta import TestTimeAugmentation
from paddletrain.plugins import prepare
from paddletrain.validation import validate_config

__all__ = ["CheckpointWeights", "Evaluation", "RebuiltCheckpoint", "build_evaluation", "checkpoint_config",
           "checkpoint_model", "checkpoint_weights", "evaluated_checkpoint", "rebuild_checkpoint", "run_tta"]

log = logging.getLogger("paddletrain")


# FitConfig's free-form nodes (a mapping of any names): a run's are taken whole from its saved config, since the
# presets that composed them (callbacks=[default,ema], a recipe's backbone_freeze) are not composed again.
FREE_FORM_KEYS = tuple(name for name, spec in FitConfig.__dataclass_fields__.items()
                       if str(spec.type).startswith("dict"))


def checkpoint_config(saved: Any, overrides: Sequence[str] = (), base: DictConfig | None = None,
                      source: str = "the checkpoint", written_by: str | None = None) -> DictConfig:
    """The training config ``saved`` in a checkpoint, with the dotlist ``overrides`` in place of its values, on top
    of ``base`` (default: the fit schema's defaults); pretrained weights are not fetched again.

    The saved config is the run's truth: every value it holds replaces ``base``'s, and its free-form nodes
    (``callbacks``) replace ``base``'s whole, whatever presets composed them. A saved key or value this version's
    schema cannot read (a run of another paddletrain version, ``written_by``) is one error naming it.
    """
    if not saved or not isinstance(saved, dict):
        raise UserError(f"{source} holds no config; it was not written by paddletrain.fit")
    base = base if base is not None else OmegaConf.structured(FitConfig)
    known = set(base.keys())  # `in` would skip the schema's mandatory (missing) groups
    # The command line's values replace the saved ones before either meets the schema (and can fix a saved one).
    saved = OmegaConf.to_container(OmegaConf.merge({k: v for k, v in saved.items() if k in known},
                                                   OmegaConf.from_dotlist(list(overrides))))
    # A component group may hold its factory's own options beside the schema's keys: merged after the schema's.
    options = {group: component_options(OmegaConf.create(saved[group]), SCHEMAS[group])
               for group in COMPONENT_GROUPS if isinstance(saved.get(group), dict)}
    saved = {k: ({key: v for key, v in value.items() if key not in options.get(k, {})} if k in options else value)
             for k, value in saved.items()}
    free_form = {key: saved.pop(key) for key in FREE_FORM_KEYS if isinstance(saved.get(key), dict)}
    try:
        cfg = OmegaConf.merge(base, saved)
        with open_dict(cfg):
            for key, value in free_form.items():
                cfg[key] = value
        for group, extra in options.items():
            OmegaConf.set_struct(cfg[group], False)  # open this node (config.register_configs stores it so)
            for key, value in extra.items():
                cfg[group][key] = value
    except (ConfigKeyError, ValidationError) as exc:
        raise UserError(_unreadable_saved_key(exc, source, written_by)) from None
    cfg.model.pretrained = None  # the checkpoint's weights replace any pretrained ones
    return cfg


def _unreadable_saved_key(exc: ConfigKeyError | ValidationError, source: str, written_by: str | None) -> str:
    """One line for a saved key (or value) this version's schema does not read, saying what to do."""
    made_by = (f"paddletrain {written_by}, this is {paddletrain.__version__}" if written_by
               and written_by != paddletrain.__version__ else f"paddletrain {paddletrain.__version__}")
    key = exc.full_key or "?"
    if isinstance(exc, ConfigKeyError):
        return (f"the config saved in {source} has the key {key}, which this version does not know (written by "
                f"{made_by}): read the run with the paddletrain version that trained it")
    return (f"the config saved in {source} has {key}={exc.value!r}, which this version refuses "
            f"({str(exc).splitlines()[0]}; written by {made_by}): pass {key}=<value> to replace it, or read the run "
            f"with the paddletrain version that trained it")


@dataclass(frozen=True)
class CheckpointWeights:
    """The model weights of a checkpoint a command uses, and what they are for its record (``{"weights": "raw"}``,
    or ``{"weights": "averaged", "average": "ema", "decay": 0.9999}``)."""

    state: dict
    record: dict


def checkpoint_weights(state: Any, choice: str = "auto", source: str = "the checkpoint") -> CheckpointWeights:
    """The weights ``choice`` (:data:`paddletrain.config.WEIGHTS`) names in a checkpoint's ``state``: with "auto",
    the averaged weights when its run validated with them (its best checkpoint was chosen on them), else the
    trained ones."""
    if not isinstance(state, dict) or "model" not in state:
        raise UserError(f"{source} holds no model weights (no 'model' entry)")
    averaged = averaged_weights(state) if choice != "raw" else None
    if averaged is None:
        if choice == "averaged":
            raise UserError(f"weights=averaged: {source} holds no averaged weights its run validated with (train "
                            f"with callbacks=[default,ema]); use weights=raw or weights=auto")
        return CheckpointWeights(state["model"], {"weights": "raw"})
    shadow, about = averaged
    # The average covers the floating-point entries; any other entry of the model stays as trained.
    return CheckpointWeights({**state["model"], **shadow}, {"weights": "averaged", **about})


def checkpoint_model(cfg: DictConfig, weights: CheckpointWeights, num_classes: int, in_chans: int,
                     source: str = "the checkpoint") -> paddle.nn.Layer:
    """The model of ``cfg`` with a checkpoint's ``weights``; any key that does not fit is refused."""
    model = build_model(cfg, num_classes, in_chans, options=factory_options(cfg)["model"])
    try:
        check_state_matches(model, weights.state)
    except UserError as exc:
        raise UserError(f"{source}: {exc}") from None
    model.set_state_dict(weights.state)
    return model


@dataclass
class RebuiltCheckpoint:
    """A checkpoint's model as trained, the model to export, and the data they were trained on."""

    model: paddle.nn.Layer
    exportable: paddle.nn.Layer
    splits: Any
    eval_transform: Any
    preprocessing: dict
    # A multi-label model's decision threshold (data.multilabel_threshold); None for a single-label one.
    multilabel_threshold: float | None = None
    # Which of the checkpoint's weights the models hold (CheckpointWeights.record).
    weights: dict = field(default_factory=lambda: {"weights": "raw"})


def rebuild_checkpoint(checkpoint_spec: str | Path, data_root: str | None = None,
                       imports: Sequence[str] = (), weights: str = "auto") -> RebuiltCheckpoint:
    """A checkpoint's model and data, rebuilt from the config saved in it, for export and the ship report.

    ``checkpoint_spec`` as :func:`~paddletrain.checkpoint.locate.locate_checkpoint` takes it; ``data_root``
    where its dataset is now, if it moved; ``imports`` modules to import besides the checkpoint's own;
    ``weights`` which of its weights (:func:`checkpoint_weights`).
    """
    checkpoint_dir = locate_checkpoint(checkpoint_spec)
    checkpoint = load_checkpoint(checkpoint_dir)
    prepare({"imports": list(imports)}, checkpoint)  # the checkpoint's `imports` and these
    source = f"checkpoint={checkpoint_dir}"
    cfg = checkpoint_config(checkpoint.state.get("config"), source=source, written_by=checkpoint.written_by)
    if data_root is not None:
        cfg.data.root = data_root
    validate_config(cfg, use="export")
    try:
        splits = build_datasets(cfg.data, options=factory_options(cfg)["data"])
        eval_tf = build_transform(cfg.data, train=False, in_chans=splits.in_chans)
    except DatasetError as exc:
        raise UserError(f"cannot open the checkpoint's dataset ({exc}); if it moved, pass data_root=<dir>") from exc
    chosen = checkpoint_weights(checkpoint.state, weights, source)
    model = checkpoint_model(cfg, chosen, len(splits.classes), splits.in_chans, source)
    exportable = model
    if cfg.model.data_format != "NCHW":
        # oneDNN in Paddle Inference 3.3 cannot run NHWC convolutions; weights do not depend on the layout,
        # so the NCHW twin is exported and the parity check compares it with the model as trained.
        log.info("model.data_format=%s: exporting the NCHW layout of the same weights", cfg.model.data_format)
        exportable = checkpoint_model(OmegaConf.merge(cfg, {"model": {"data_format": "NCHW"}}), chosen,
                                      len(splits.classes), splits.in_chans, source)
    threshold = float(cfg.data.multilabel_threshold) if cfg.data.get("multilabel") else None
    return RebuiltCheckpoint(model, exportable, splits, eval_tf, preprocessing_info(cfg.data, in_chans=splits.in_chans),
                             threshold, chosen.record)


def evaluated_checkpoint(cfg: DictConfig, overrides: Sequence[str]) -> tuple[DictConfig, Checkpoint]:
    """The checkpoint an ``evaluate`` config names, and the config to evaluate it with: the checkpoint's own,
    with the command line's ``overrides`` on top.

    The command line's values are checked first, so a typo is refused before a checkpoint is read.
    """
    check_values(cfg, EvaluateConfig)
    if OmegaConf.is_missing(cfg, "checkpoint"):
        raise UserError("missing required value for checkpoint (e.g. checkpoint=outputs/<name>/<time>:best)")
    checkpoint = load_checkpoint(locate_checkpoint(cfg.checkpoint))
    prepare(cfg, checkpoint)  # the checkpoint's `imports` and the command line's
    source = f"checkpoint={checkpoint.path}"
    evaluated = checkpoint_config(checkpoint.state.get("config"), overrides, base=cfg, source=source,
                                  written_by=checkpoint.written_by)
    if not any(override.startswith("trainer.limit_val_batches=") for override in overrides):
        evaluated.trainer.limit_val_batches = None  # a training run's shortcut: the whole split unless told here
    return evaluated, checkpoint


def run_tta(cfg: DictConfig) -> dict[str, Any]:
    """The test-time augmentation ``evaluate`` scores with: the run's ``trainer.tta`` (what its validation, and so
    its best checkpoint, used), each key given to ``evaluate`` (``tta.flip=true``) in its place."""
    given = {key: value for key, value in (cfg.get("tta") or {}).items() if value is not None}
    return {**OmegaConf.to_container(OmegaConf.structured(TTAConfig)), **(cfg.trainer.get("tta") or {}), **given}


def _reading_only(cfg: DictConfig, options: dict[str, Any], split: str,
                  run: Any) -> tuple[DictConfig, dict[str, Any]]:
    """The data config and builder options that read only the validation split ``evaluate`` scores: its sources in
    place of the training split's (:data:`paddletrain.data.datasets.EVAL_SOURCES`), when the dataset declares them,
    no split is held out of the training data, and the checkpoint recorded the run's classes; else unchanged."""
    sources = EVAL_SOURCES.get(cfg.data.name)
    if split != "val" or cfg.data.holdout or not sources or not isinstance(run, dict) or not isinstance(
            run.get("classes"), list):
        return cfg, options
    cfg, options = copy.deepcopy(cfg), dict(options)
    for train_key, val_key in sources.items():
        if train_key in options or val_key in options:  # a builder's own option (data.urls of shards)
            options[train_key] = options.get(val_key)
        else:
            cfg.data[train_key] = cfg.data[val_key]
    return cfg, options


@dataclass
class Evaluation:
    """A checkpoint rebuilt to be evaluated on one split: a Trainer with the run's loss and meters (no
    optimizer) and that split's loader."""

    trainer: Trainer
    loader: Any
    split: str
    classes: list[str]
    # What was scored, for the record: the checkpoint's weights used (CheckpointWeights.record) and the
    # test-time augmentation ({"flip": ..., "crops": ...}).
    scored_with: dict = field(default_factory=dict)

    def run(self) -> dict[str, float]:
        """The split's metrics, named after it (``test/top1``, ...; the Trainer names what it validates val/...);
        ``scored_with`` gains the number of images scored (``images``, and ``limit_val_batches`` when a limit
        left part of the split out)."""
        metrics = self.trainer.validate(self.loader)
        self.scored_with["images"] = self.trainer.val_samples
        if self.trainer.limits.limit_val_batches is not None:
            self.scored_with["limit_val_batches"] = self.trainer.limits.limit_val_batches
        return {f"{self.split}/{key.removeprefix('val/')}": value for key, value in metrics.items()}

    def per_class(self) -> dict[str, Any]:
        """Log the last validation's per-class table; its entries for the JSON line (``<split>/per_class``, and
        for a single-label run ``<split>/classes`` and ``<split>/confusion_matrix``, as ``val/...`` in
        ``summary.json``)."""
        multilabel = getattr(self.trainer.val_meter, "report", None)
        if isinstance(multilabel, MultiLabelReport):
            log.info("Per class (threshold %g):\n%s", multilabel.threshold, "\n".join(multilabel.table(self.classes)))
            return {f"{self.split}/per_class": multilabel.rows(self.classes)}
        report = self.trainer.val_report
        if report is None:
            return {}
        for row in report.table():
            log.info("%s", row)
        return {f"{self.split}/{key}": value for key, value in report.to_dict().items()}


def build_evaluation(cfg: DictConfig, checkpoint: Checkpoint) -> Evaluation:
    """The model of ``cfg`` (a checkpoint's config, :func:`evaluated_checkpoint`) with the checkpoint's weights,
    behind test-time augmentation if ``tta`` asks for it, and the split ``cfg.split`` names."""
    validate_config(cfg, use="evaluate")
    cfg = resolve_preprocessing(cfg)
    setup_runtime(cfg.trainer.device, cfg.trainer.cpu_threads)
    seed_everything(cfg.trainer.seed)
    tta = run_tta(cfg)
    split = cfg.get("split", "val")
    options = factory_options(cfg)
    run = checkpoint.state.get("run") if isinstance(checkpoint.state, dict) else None
    data_cfg, data_options = _reading_only(cfg, options["data"], split, run)
    data = build_data(data_cfg, seed=cfg.trainer.seed, eval_crop=tta["crops"] == 1, training=False,
                      eval_split=split, options=data_options)
    if data_cfg is not cfg:  # the run's own classes and training counts, not those of the split read twice
        data = replace(data, classes=list(run["classes"]), class_counts=(
            np.asarray(run["class_counts"], dtype=np.int64) if run.get("class_counts") is not None else None))
    source = f"checkpoint={checkpoint.path}"
    weights = checkpoint_weights(checkpoint.state, cfg.get("weights", "auto"), source)
    model = checkpoint_model(cfg, weights, len(data.classes), data.in_chans, source)
    model = TestTimeAugmentation.around(model, tta, eval_image_size(cfg.data)) or model
    # The training run's loss (val/loss as fit reports it) and the task's meters; no optimizer: it only validates.
    loss_fn, meters = task_parts(cfg, data, options["loss"])
    trainer = Trainer(model, num_classes=len(data.classes), limits=Limits.from_config(cfg.trainer), loss_fn=loss_fn,
                      meters=meters, class_names=data.classes)
    scored_with = {**weights.record, "tta": tta}
    return Evaluation(trainer, data.val_loader, split, data.classes, scored_with)
