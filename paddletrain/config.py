"""Typed schemas for every configuration key, registered in Hydra's ConfigStore.

Each YAML preset under ``paddletrain/conf/<group>/`` is validated against the schema of its group, so a
misspelt key, a wrong type or a missing required value fails at start-up, before data or model are built.
"""
from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class ModelConfig:
    name: str = "resnet20"
    # None: taken from the dataset (number of classes, image channels).
    num_classes: Optional[int] = None
    in_chans: Optional[int] = None
    # A weight source: local file, checkpoint dir, vision:<arch>, paddleclas:<Name>, hub:<module>.
    pretrained: Optional[str] = None
    # For model=vision: any paddle.vision.models builder name.
    arch: Optional[str] = None
    drop_rate: float = 0.0
    zero_init_residual: bool = False
    data_format: str = "NCHW"
    # Strict loading of pretrained weights (only the classifier head may differ).
    strict: bool = True
    # paddle.load a .pdparams that holds more than arrays (pickles can run code: trust the file first).
    trust_pickle: bool = False
    # Convert BatchNorm to SyncBatchNorm under data parallelism.
    sync_bn: bool = False


@dataclass
class ShapesConfig:
    """The embedded, procedurally generated default dataset."""

    num_train: int = 4000
    num_val: int = 1000
    seed: int = 0


@dataclass
class DataConfig:
    name: str = "shapes"
    root: Optional[str] = None
    download: bool = False
    # Optional text file with one class name per line (imagefolder) .
    class_names: Optional[str] = None
    # image_size, interpolation, mean, std: null = from the pretrained weights (model.pretrained), else these
    # defaults; see docs/finetuning.md.
    image_size: Optional[int] = 32
    # Side of the resize before the centre crop at evaluation (imagenet preset); None = image_size / 0.875.
    eval_resize: Optional[int] = None
    interpolation: Optional[str] = "bilinear"
    mean: Optional[List[float]] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    std: Optional[List[float]] = field(default_factory=lambda: [0.5, 0.5, 0.5])
    # Transform presets: "imagenet" (RandomResizedCrop + flip), "small" (pad-crop + flip), "none" (resize only).
    train_transform: str = "small"
    eval_transform: str = "small"
    hflip: bool = True
    color_jitter: float = 0.0
    auto_augment: bool = False
    batch_size: int = 128
    eval_batch_size: Optional[int] = None
    num_workers: int = 0
    use_shared_memory: bool = True
    persistent_workers: bool = False
    drop_last: bool = True
    # What to do with an unreadable sample: "fail" or "skip".
    bad_sample_policy: str = "fail"
    max_bad_fraction: float = 0.01
    shapes: ShapesConfig = field(default_factory=ShapesConfig)


@dataclass
class OptimConfig:
    name: str = "sgd"  # sgd | adamw
    lr: float = 0.1
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 5e-4
    betas: List[float] = field(default_factory=lambda: [0.9, 0.999])
    eps: float = 1e-8
    # No weight decay on normalisation layers and biases.
    no_decay_norm_bias: bool = True
    # Multiply the classifier head's LR (fine-tuning) and decay LR per stage towards the stem.
    head_lr_mult: float = 1.0
    layer_decay: Optional[float] = None
    # Linear LR scaling: lr * global_batch / base_batch_size when set.
    scale_lr: bool = False
    base_batch_size: int = 256


@dataclass
class SchedConfig:
    name: str = "cosine"  # cosine | step | multistep | onecycle | constant
    warmup_epochs: float = 0.0
    warmup_start_factor: float = 0.01
    min_lr: float = 0.0
    step_size: int = 30  # epochs, for "step"
    milestones: List[int] = field(default_factory=lambda: [30, 60, 80])  # epochs, for "multistep"
    gamma: float = 0.1
    max_lr_factor: float = 1.0  # onecycle peak = lr * max_lr_factor
    pct_start: float = 0.3


@dataclass
class AmpConfig:
    enabled: bool = False
    level: str = "O1"  # O1 | O2
    dtype: str = "float16"  # float16 | bfloat16
    # None: a GradScaler for float16, none for bfloat16.
    use_scaler: Optional[bool] = None
    init_loss_scaling: float = 65536.0
    incr_ratio: float = 2.0
    decr_ratio: float = 0.5
    incr_every_n_steps: int = 2000
    decr_every_n_nan_or_inf: int = 1
    use_dynamic_loss_scaling: bool = True
    # Evaluate under autocast too (default: float32).
    eval_in_amp: bool = False


@dataclass
class CheckpointConfig:
    enabled: bool = True
    monitor: str = "val/top1"
    mode: str = "max"  # max | min
    keep_last: int = 1
    keep_best: int = 1
    every_n_steps: Optional[int] = None
    every_n_epochs: int = 1
    # Load legacy pickled .pdparams/.pdopt checkpoints (runs code from the file: trust it first).
    trust_pickle: bool = False


@dataclass
class EarlyStoppingConfig:
    enabled: bool = False
    monitor: str = "val/top1"
    mode: str = "max"
    patience: int = 10
    min_delta: float = 0.0


@dataclass
class FinetuneConfig:
    # Freeze everything but the classifier head for this many epochs, then unfreeze.
    freeze_backbone_epochs: int = 0
    # Keep BatchNorm running statistics fixed (eval-mode BN) during training.
    freeze_bn: bool = False


@dataclass
class TrainerConfig:
    max_epochs: int = 10
    max_steps: Optional[int] = None
    device: str = "auto"  # auto | cpu | gpu
    # None: the measured default for this machine (see docs/performance.md).
    cpu_threads: Optional[int] = None
    devices: int = 1
    # Several machines: this one is node `node_rank` of `num_nodes`, all meeting at `master` ("host:port" of
    # node 0, a free port). Each node runs `trainer.devices` processes (docs/distributed.md).
    num_nodes: int = 1
    node_rank: int = 0
    master: Optional[str] = None
    find_unused_parameters: bool = False
    seed: int = 42
    # Deterministic cuDNN algorithms on GPUs (slower); CPU kernels are deterministic already.
    deterministic: bool = False
    accumulate_grad_batches: int = 1
    grad_clip_norm: Optional[float] = None
    label_smoothing: float = 0.0
    # Validate every N epochs; 0 disables validation.
    val_every_n_epochs: int = 1
    limit_train_batches: Optional[int] = None
    limit_val_batches: Optional[int] = None
    log_every_n_steps: int = 20
    progress_bar: bool = True
    visualdl: bool = True
    log_images: bool = True
    # Resume: None, "auto" (newest complete checkpoint in the run dir) or a checkpoint directory.
    resume: Optional[str] = None
    # Stop after this many consecutive non-finite steps.
    max_consecutive_nonfinite: int = 20
    # Keep an exponential moving average of the weights (e.g. 0.999), validated with and checkpointed.
    ema_decay: Optional[float] = None
    # paddle.profiler over steps [wait, wait + warmup + active): summary + Chrome trace in <run dir>/profiler.
    profile: bool = False
    profile_wait: int = 2
    profile_warmup: int = 1
    profile_active: int = 5
    amp: AmpConfig = field(default_factory=AmpConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    early_stopping: EarlyStoppingConfig = field(default_factory=EarlyStoppingConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)


@dataclass
class FitConfig:
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    sched: SchedConfig = MISSING
    trainer: TrainerConfig = MISSING
    # Run name used in the run directory and the summary.
    name: str = "paddletrain"
    # Free-form tags: experiment recipes may set them; never read by the library.
    tags: List[str] = field(default_factory=list)


@dataclass
class EvaluateConfig(FitConfig):
    checkpoint: str = MISSING


SCHEMAS: dict[str, Any] = {
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "sched": SchedConfig,
    "trainer": TrainerConfig,
}


def register_configs() -> None:
    """Register the schemas so every preset of a group is validated against ``<group>_schema``."""
    cs = ConfigStore.instance()
    cs.store(name="fit_schema", node=FitConfig)
    cs.store(name="evaluate_schema", node=EvaluateConfig)
    for group, node in SCHEMAS.items():
        cs.store(group=group, name=f"{group}_schema", node=node)


# Keys whose value must be one of a fixed set; checked at start-up, before data or model are built.
CHOICES: dict[str, tuple] = {
    "model.data_format": ("NCHW", "NHWC"),
    "data.train_transform": ("imagenet", "small", "none"),
    "data.eval_transform": ("imagenet", "small", "none"),
    "data.interpolation": ("nearest", "bilinear", "bicubic", "lanczos"),
    "data.bad_sample_policy": ("fail", "skip"),
    "optim.name": ("sgd", "adamw"),
    "sched.name": ("cosine", "step", "multistep", "onecycle", "constant"),
    "trainer.device": ("auto", "cpu", "gpu"),
    "trainer.amp.level": ("O1", "O2"),
    "trainer.amp.dtype": ("float16", "bfloat16"),
    "trainer.checkpoint.mode": ("max", "min"),
    "trainer.early_stopping.mode": ("max", "min"),
}

# Built-in datasets that cannot run without data.root (the others have a default location or need no files).
DATASETS_NEEDING_ROOT = ("imagefolder",)

# Keys that must be positive integers when set.
POSITIVE: tuple = ("data.batch_size", "trainer.max_epochs", "trainer.accumulate_grad_batches",
                   "trainer.max_consecutive_nonfinite", "data.image_size", "trainer.checkpoint.keep_last",
                   "trainer.checkpoint.every_n_epochs", "trainer.checkpoint.every_n_steps",
                   "trainer.profile_active", "trainer.num_nodes")


def _check_nodes(trainer: Any) -> None:
    from paddletrain.errors import ConfigError

    if not 0 <= trainer.node_rank < trainer.num_nodes:
        raise ConfigError(f"trainer.node_rank={trainer.node_rank} must be between 0 and trainer.num_nodes - 1 "
                          f"(trainer.num_nodes={trainer.num_nodes})")
    if trainer.num_nodes > 1:
        host, _, port = str(trainer.master or "").rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"trainer.master={trainer.master} must be host:port of node 0 (a free port there) "
                              f"when trainer.num_nodes={trainer.num_nodes}, e.g. trainer.master=10.0.0.1:29500")


def unknown_keys(node: Any, schema: type, prefix: str = "") -> List[str]:
    """Keys of ``node`` that ``schema`` does not declare.

    Hydra's ``+key=value`` force-adds keys even into typed nodes, so this check is the one that catches them.
    """
    hints = typing.get_type_hints(schema)
    found = []
    for key in node.keys():
        if key not in hints:
            found.append(f"{prefix}{key}")
        elif dataclasses.is_dataclass(hints[key]) and node[key] is not None:
            found.extend(unknown_keys(node[key], hints[key], f"{prefix}{key}."))
    return found


def validate_config(cfg: Any) -> None:
    """Raise :class:`ConfigError` naming the first key that is missing or whose value is not allowed.

    Hydra already rejects unknown keys and wrong types; this adds required values and choices.
    """
    from omegaconf import OmegaConf

    from paddletrain.errors import ConfigError

    unknown = unknown_keys(cfg, EvaluateConfig if "checkpoint" in cfg else FitConfig)
    if unknown:
        raise ConfigError(f"unknown config key {unknown[0]} (not in the schema; check the spelling)")
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConfigError(f"missing required value for {', '.join(missing)} (set it on the command line, "
                          f"e.g. {missing[0]}=...)")

    for key, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value is not None and value not in allowed:
            raise ConfigError(f"{key}={value!r} is not allowed; choose one of: {', '.join(allowed)}")
    for key in POSITIVE:
        value = OmegaConf.select(cfg, key)
        if value is not None and value < 1:
            raise ConfigError(f"{key}={value} must be >= 1")
    if cfg.data.name in DATASETS_NEEDING_ROOT and not cfg.data.root:
        raise ConfigError(f"missing required value for data.root: data.name={cfg.data.name} reads its images from "
                          f"there (e.g. data.root=/data/my_images)")
    for key in ("data.num_workers", "trainer.checkpoint.keep_best", "trainer.profile_wait", "trainer.profile_warmup"):
        value = OmegaConf.select(cfg, key)
        if value is not None and value < 0:
            raise ConfigError(f"{key}={value} must be >= 0")
    _check_nodes(cfg.trainer)
    if cfg.data.mean is not None and cfg.data.std is not None and len(cfg.data.mean) != len(cfg.data.std):
        raise ConfigError(f"data.mean has {len(cfg.data.mean)} values but data.std has {len(cfg.data.std)}")
