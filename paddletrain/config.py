"""Typed schemas for every configuration key, registered in Hydra's ConfigStore, with the values each key allows.

Each YAML preset under ``paddletrain/conf/<group>/`` is validated against the schema of its group, so a
misspelt key, a wrong type or a missing required value fails at start-up, before data or model are built.
Every numeric key (and every key with a fixed set of values) declares what it allows next to its default with
:func:`allowed`; :func:`check_values` walks a schema and checks them all, so a new key cannot be left out.
The command lines' own schemas (export, predict, bench) declare their keys the same way.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from paddletrain.devices import DEVICES
from paddletrain.errors import ConfigError

# trainer.cluster's values (paddletrain/job/slurm.py acts on them).
CLUSTERS = ("auto", "slurm", "none")

# Field metadata key holding an :class:`Allowed`.
ALLOWED = "allowed"
# The largest seed numpy's legacy RNG takes; seeds are also fed to paddle.seed and the samplers.
MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class Allowed:
    """The values a config key accepts: a numeric range or a set of choices (for a list: each element).

    Bounds are inclusive (``ge``/``le``) or strict (``gt``/``lt``); a declaration without bounds or choices
    says on purpose that any finite number is fine. ``None`` is allowed exactly when the key's type is Optional
    (or ``Any``). Choices and bounds together declare a key that takes one of the choices or a list of numbers
    in the bounds (``loss.class_weights``: ``balanced`` or one weight per class).
    """

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple = ()

    @property
    def bounded(self) -> bool:
        return any(bound is not None for bound in (self.ge, self.gt, self.le, self.lt))

    @property
    def choice_or_list(self) -> bool:
        """A key taking one of the choices, or a list of numbers within the bounds."""
        return bool(self.choices) and self.bounded

    def admits(self, value: Any) -> bool:
        """Whether a single value (a list's element is judged by :meth:`admits_element`) is allowed."""
        if self.choices:
            return isinstance(value, str | int | float) and value in self.choices
        return self._in_bounds(value)

    def admits_element(self, value: Any) -> bool:
        """Whether one element of a list value is allowed (the choices of a choice-or-list key name a whole
        value, never an element)."""
        return self._in_bounds(value) if self.choice_or_list else self.admits(value)

    def _in_bounds(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False  # nan and inf are never a meaningful setting
        return ((self.ge is None or value >= self.ge) and (self.gt is None or value > self.gt)
                and (self.le is None or value <= self.le) and (self.lt is None or value < self.lt))

    def describe(self) -> str:
        """``>= 0 and < 1``, ``one of: a, b`` or ``any finite number`` (nan and inf are never allowed)."""
        if self.choice_or_list:
            return " or ".join(map(str, self.choices)) + ", or a list with each value " + self.describe_bounds()
        if self.choices:
            return "one of: " + ", ".join(map(str, self.choices))
        return self.describe_bounds()

    def describe_bounds(self) -> str:
        """The numeric part alone: ``>= 0 and < 1`` or ``any finite number``."""
        bounds = [f"{op} {_number(bound)}" for op, bound in ((">=", self.ge), (">", self.gt), ("<=", self.le),
                                                              ("<", self.lt)) if bound is not None]
        return " and ".join(bounds) or "any finite number"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def allowed(default: Any = dataclasses.MISSING, *, factory: Callable[[], Any] | None = None,
            ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None, choices: tuple = ()) -> Any:
    """A dataclass field with ``default`` (or ``factory``) that declares the values the key allows."""
    rule = {ALLOWED: Allowed(ge=ge, gt=gt, le=le, lt=lt, choices=tuple(choices))}
    if factory is not None:
        return field(default_factory=factory, metadata=rule)
    return field(default=default, metadata=rule)


class CheckedOnConstruction:
    """A schema whose instances made in Python (``OptimConfig(momentum=0.8)``) are checked when constructed, with
    the rules :func:`check_values` applies to a composed config: a config object is valid by construction, so the
    builders that take one trust it and check only what no schema declares. ``KEY`` is the group's place in the
    full config (``optim.``), named in the messages."""

    KEY = ""  # not annotated: a class attribute, not a config key

    def __post_init__(self) -> None:
        check_values(self, prefix=self.KEY)


@dataclass
class ModelConfig(CheckedOnConstruction):
    KEY = "model."
    name: str = "resnet20"
    # None: taken from the dataset (number of classes, image channels).
    num_classes: int | None = allowed(None, ge=1)
    in_chans: int | None = allowed(None, ge=1)
    # A weight source: local file, checkpoint dir, vision:<arch>, paddleclas:<Name>, hub:<module>.
    pretrained: str | None = None
    # For model=vision: any paddle.vision.models builder name.
    arch: str | None = None
    # Channels of the stem and every stage times this (a Wide ResNet's k): resnet20 width=2 has 32/64/128.
    width: float = allowed(1.0, gt=0)
    drop_rate: float = allowed(0.0, ge=0, lt=1)
    # Stochastic depth: the residual branches' drop probability rises linearly over the blocks to this value.
    drop_path_rate: float = allowed(0.0, ge=0, lt=1)
    zero_init_residual: bool = False
    data_format: str = allowed("NCHW", choices=("NCHW", "NHWC"))
    # Strict loading of pretrained weights (only the classifier head may differ).
    strict: bool = True
    # paddle.load a .pdparams that holds more than arrays (pickles can run code: trust the file first).
    trust_pickle: bool = False
    # Convert BatchNorm to SyncBatchNorm under data parallelism (GPUs, trainer.devices >= 2).
    sync_bn: bool = False
    # Every BatchNorm's running-statistics momentum, in Paddle's sense (the share of the old statistics kept each
    # step; Paddle's default 0.9 is PyTorch's 0.1); None: the builder's own.
    norm_momentum: float | None = allowed(None, gt=0, lt=1)
    # Keep every BatchNorm's scale (gamma) fixed at its initial (or pretrained) value; its shift still trains.
    norm_frozen_scale: bool = False
    # CPU training: stride-1 "same" convolutions compute their input gradient as a forward convolution, faster
    # than Paddle's CPU kernel (paddletrain.models.conv_backward); equal to float32 rounding. Ignored on GPUs.
    conv_input_grad: bool = False


@dataclass
class ShapesConfig(CheckedOnConstruction):
    """The embedded, procedurally generated default dataset."""

    KEY = "data.shapes."
    num_train: int = allowed(4000, ge=1)
    num_val: int = allowed(1000, ge=1)
    seed: int = allowed(0, ge=0, le=MAX_SEED)


# Mixup/CutMix draws: one per batch, per pair of samples, or per sample (paddletrain.data.transforms.mixup).
MIX_MODES = ("batch", "pair", "elem")


@dataclass
class MixupConfig(CheckedOnConstruction):
    """Mixup/CutMix on every training batch (paddletrain.data.transforms.mixup); off while both alphas are 0.

    The soft targets are smoothed by ``loss.label_smoothing`` (one key for hard and mixed targets).
    """

    KEY = "data.mixup."
    # Beta(alpha, alpha) of Mixup's blend weight and of CutMix's box area; 0 switches that one off.
    mixup_alpha: float = allowed(0.0, ge=0)
    cutmix_alpha: float = allowed(0.0, ge=0)
    # [min, max] CutMix box side as a fraction of the image side, drawn directly (switches CutMix on).
    cutmix_minmax: list[float] | None = allowed(None, gt=0, le=1)
    # Chance that a draw mixes at all, and of CutMix rather than Mixup when both are on.
    prob: float = allowed(1.0, ge=0, le=1)
    switch_prob: float = allowed(0.5, ge=0, le=1)
    mode: str = allowed("batch", choices=MIX_MODES)
    # CutMix's label weight is the pasted area after the box is clipped to the image.
    correct_lam: bool = True


# Training samplers (data.sampler; null = random): paddletrain.data.sampling.sampler.
SAMPLERS = ("random", "class_balanced")
# Transform presets (paddletrain.data.transforms.presets) and the resampling filters PIL resizes with.
TRANSFORMS = ("imagenet", "small", "none")
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "box", "lanczos", "hamming")


@dataclass
class DataConfig(CheckedOnConstruction):
    KEY = "data."
    name: str = "shapes"
    root: str | None = None
    download: bool = False
    # Optional text file with one class name per line (imagefolder: in sorted directory order; labellist: line i
    # names class i).
    class_names: str | None = None
    # imagefolder: reuse the cached scan of an unchanged folder (a .npz in $PADDLETRAIN_CACHE_DIR/scans, default
    # ~/.cache/paddletrain/scans); false scans the folder at every start. See docs/data.md.
    scan_cache: bool = True
    # labellist: files of '<path relative to root><delimiter><class index>' lines (PaddleClas), or a .csv with a
    # 'path,label' header; relative list paths are looked up from the working directory, then from root.
    train_list: str | None = None
    val_list: str | None = None
    delimiter: str = " "
    # labellist: PaddleClas's multi-label lines, '<path><TAB><0/1 per class, comma-separated>': a sigmoid per class
    # (loss binary_cross_entropy unless loss.name says otherwise), metrics val/mAP and F1, monitor val/mAP.
    multilabel: bool = False
    # data.multilabel: a class is predicted when its sigmoid score is above this (F1/precision/recall, export,
    # predict).
    multilabel_threshold: float = allowed(0.5, gt=0, lt=1)
    # labellist: a bad line refuses the list ("error") or is skipped with a warning ("skip").
    bad_lines: str = allowed("error", choices=("error", "skip"))
    # Share of each class of the training split held out as the validation split (fit validates and picks its
    # best checkpoint on it); the dataset's own validation split becomes the test split (evaluate split=test).
    # 0 = validate on the dataset's own validation split. See docs/data.md#a-held-out-validation-split.
    holdout: float = allowed(0.0, ge=0, lt=1)
    # Seeds which images are held out; not trainer.seed, so that every seed of a recipe sees the same split.
    holdout_seed: int = allowed(0, ge=0)
    # Share of each class of the training split (after holdout) that training uses, chosen by data.holdout_seed:
    # a seeded subset for quick studies (docs/search.md); the validation split stays whole.
    train_subset: float = allowed(1.0, gt=0, le=1)
    # image_size, interpolation, mean, std: null = from the pretrained weights (model.pretrained), else these
    # defaults; see docs/finetuning.md.
    image_size: int | None = allowed(32, ge=1)
    # Side of the evaluation input (validation, evaluate, export, predict) when it differs from the training size
    # (timm's --test-input-size; "ResNet strikes back" A3 trains at 160 and tests at 224); None = image_size.
    eval_image_size: int | None = allowed(None, ge=1)
    # Side of the resize before the centre crop at evaluation (imagenet preset); None = eval size / 0.875.
    eval_resize: int | None = allowed(None, ge=1)
    interpolation: str | None = allowed("bilinear", choices=INTERPOLATIONS)
    # Per channel, in the 0..1 range of the image.
    mean: list[float] | None = allowed(factory=lambda: [0.5, 0.5, 0.5])
    std: list[float] | None = allowed(factory=lambda: [0.5, 0.5, 0.5], gt=0)
    # Transform presets: "imagenet" (RandomResizedCrop + flip), "small" (pad-crop + flip), "none" (resize only).
    train_transform: str = allowed("small", choices=TRANSFORMS)
    eval_transform: str = allowed("small", choices=TRANSFORMS)
    # The "small" preset's translation: pad each side by this many pixels, then crop image_size at random
    # (4 as for CIFAR; airbench94 uses 2 on short schedules). 0 leaves the image where it is.
    crop_padding: int = allowed(4, ge=0)
    hflip: bool = True
    # "random": each image mirrored with probability 1/2 each epoch; "alternating": mirrored on every other epoch
    # from a random start per image (airbench94; deterministic from seed, image and epoch).
    hflip_mode: str = allowed("random", choices=("random", "alternating"))
    color_jitter: float = allowed(0.0, ge=0)
    # RandAugment rand-m9-n2-mstd0.5 (a shorthand for data.augment=[{name: rand_augment}]).
    auto_augment: bool = False
    # Training augmentations, in order, each run at the stage it declares (image or normalised array):
    # entries {name: <registered in paddletrain.registry.AUGMENTATIONS>, <option>: <value>, ...}, e.g.
    # {name: rand_augment, num_ops: 2, magnitude: 9}, {name: random_erasing, probability: 0.25}.
    augment: list[dict[str, Any]] = field(default_factory=list)
    # Repeated augmentation: each image k times per epoch, differently augmented, shared across ranks.
    num_repeats: int = allowed(1, ge=1)
    mixup: MixupConfig = field(default_factory=MixupConfig)
    batch_size: int = allowed(128, ge=1)
    eval_batch_size: int | None = allowed(None, ge=1)
    num_workers: int = allowed(0, ge=0)
    use_shared_memory: bool = True
    persistent_workers: bool = False
    drop_last: bool = True
    # What to do with an unreadable sample: "fail" or "skip".
    bad_sample_policy: str = allowed("fail", choices=("fail", "skip"))
    max_bad_fraction: float = allowed(0.01, ge=0, le=1)
    # How training batches are drawn: null or "random" (a shuffled permutation: every sample once per epoch);
    # "class_balanced" (with replacement, each sample weighted by 1 / its class's count: every class equally often
    # in expectation; an epoch keeps the split's length). See docs/data.md#imbalanced-classes.
    sampler: str | None = allowed(None, choices=SAMPLERS)
    shapes: ShapesConfig = field(default_factory=ShapesConfig)


@dataclass
class OptimConfig(CheckedOnConstruction):
    KEY = "optim."
    # A name registered in paddletrain.registry.OPTIMIZERS: sgd, adamw, adam, rmsprop, lamb, lars, or a plugin's.
    name: str = "sgd"
    lr: float = allowed(0.1, gt=0)
    # sgd and lars: momentum; rmsprop: its momentum term.
    momentum: float = allowed(0.9, ge=0, lt=1)
    nesterov: bool = False
    weight_decay: float = allowed(5e-4, ge=0)
    betas: list[float] = allowed(factory=lambda: [0.9, 0.999], ge=0, lt=1)
    # None: each optimizer's own default (paddletrain.optim.DEFAULT_EPS).
    eps: float | None = allowed(None, gt=0)
    # lars: the trust coefficient of the layer-wise rate.
    trust_coefficient: float = allowed(0.001, gt=0)
    # rmsprop: the decay of the squared-gradient average, and whether to centre it.
    rho: float = allowed(0.9, gt=0, lt=1)
    centered: bool = False
    # No weight decay on normalisation layers and biases.
    no_decay_norm_bias: bool = True
    # Multiply the classifier head's LR (fine-tuning) and decay LR per stage towards the stem.
    # The learning rate of normalisation-layer parameters and biases times this (airbench94 trains them faster).
    norm_bias_lr_mult: float = allowed(1.0, gt=0)
    head_lr_mult: float = allowed(1.0, gt=0)
    layer_decay: float | None = allowed(None, gt=0, le=1)
    # Linear LR scaling: lr * global_batch / base_batch_size when set.
    scale_lr: bool = False
    base_batch_size: int = allowed(256, ge=1)


@dataclass
class SchedConfig(CheckedOnConstruction):
    KEY = "sched."
    # A name registered in paddletrain.registry.SCHEDULERS: cosine, step, multistep, onecycle, constant.
    name: str = "cosine"
    warmup_epochs: float = allowed(0.0, ge=0)
    warmup_start_factor: float = allowed(0.01, ge=0, lt=1)
    min_lr: float = allowed(0.0, ge=0)
    step_size: int = allowed(30, ge=1)  # epochs, for "step"
    milestones: list[int] = allowed(factory=lambda: [30, 60, 80], ge=1)  # epochs, for "multistep"
    gamma: float = allowed(0.1, gt=0, le=1)
    max_lr_factor: float = allowed(1.0, gt=0)  # onecycle peak = lr * max_lr_factor
    pct_start: float = allowed(0.3, gt=0, lt=1)


@dataclass
class AmpConfig(CheckedOnConstruction):
    KEY = "trainer.amp."
    enabled: bool = False
    level: str = allowed("O1", choices=("O1", "O2"))
    dtype: str = allowed("float16", choices=("float16", "bfloat16"))
    # None: a GradScaler for float16, none for bfloat16.
    use_scaler: bool | None = None
    init_loss_scaling: float = allowed(65536.0, gt=0)
    incr_ratio: float = allowed(2.0, gt=1)
    decr_ratio: float = allowed(0.5, gt=0, lt=1)
    incr_every_n_steps: int = allowed(2000, ge=1)
    decr_every_n_nan_or_inf: int = allowed(1, ge=1)
    use_dynamic_loss_scaling: bool = True
    # Evaluate under autocast too (default: float32).
    eval_in_amp: bool = False


@dataclass
class LossConfig(CheckedOnConstruction):
    KEY = "loss."
    # A name registered in paddletrain.registry.LOSSES: cross_entropy, soft_target_cross_entropy,
    # binary_cross_entropy, focal, or a plugin's. None: the task's loss, cross_entropy (binary_cross_entropy with
    # data.multilabel=true).
    name: str | None = None
    # Label smoothing of hard labels (soft targets are smoothed where they are mixed).
    label_smoothing: float = allowed(0.0, ge=0, lt=1)
    # binary_cross_entropy only: targets above this become 1, the others 0 (timm's --bce-target-thresh).
    target_threshold: float | None = allowed(None, ge=0, lt=1)
    # binary_cross_entropy only: sum over classes, then mean over the batch (timm's --bce-sum), instead of the
    # mean over every (sample, class) element.
    bce_sum: bool = False
    # Per-class weights: null (none), "balanced" (sklearn's n_samples / (n_classes * count_c) over the training
    # split) or a list with one positive weight per class. Only their ratios matter: every weighted loss is a
    # weighted mean (paddletrain.losses; docs/data.md#imbalanced-classes). Typed Any: a word or a list.
    class_weights: Any = allowed(None, choices=("balanced",), gt=0)
    # focal only: gamma of the modulating factor (1 - p)^gamma (Lin et al. 2017); 0 is cross-entropy.
    focal_gamma: float = allowed(2.0, ge=0)


DISTILL_KINDS = ("kd", "ssld")


@dataclass
class DistillConfig(CheckedOnConstruction):
    """Knowledge distillation from a frozen teacher (paddletrain.distill); off while ``teacher`` is null."""

    KEY = "trainer.distill."
    # The teacher, given like model.name / model.pretrained: a registered model and its weight source (a file,
    # a paddletrain checkpoint directory, vision:<arch>, paddleclas:<Name>, ...).
    teacher: str | None = None
    pretrained: str | None = None
    # Model options of the teacher's builder (e.g. {arch: resnet152} for teacher=vision).
    teacher_options: dict[str, Any] = field(default_factory=dict)
    # paddle.load a teacher .pdparams that holds more than arrays (pickles can run code: trust the file first).
    trust_pickle: bool = False
    # kd: T^2 KL at the temperature (Hinton et al.); ssld: PaddleClas' label-free symmetric KL.
    kind: str = allowed("kd", choices=DISTILL_KINDS)
    # Weight of the distillation term; the hard-label loss (loss.*) gets 1 - alpha. null: 0.5 for kd, 1 for ssld.
    alpha: float | None = allowed(None, ge=0, le=1)
    temperature: float = allowed(1.0, gt=0)
    # ssld with alpha 1: an image folder (any depth, no labels) whose images join the training set.
    unlabeled_root: str | None = None


@dataclass
class TTAConfig(CheckedOnConstruction):
    """Test-time augmentation (paddletrain.models.tta): the softmax outputs of the views are averaged. Under
    ``trainer.tta`` every validation of ``fit`` uses it, so the best checkpoint is chosen on what ``evaluate``
    reports (it follows the run's unless told otherwise)."""

    KEY = "trainer.tta."
    # Add the horizontally flipped image (doubles the views).
    flip: bool = False
    # 1: the usual centre crop; 5: four corner crops and the centre crop of the eval_resize square.
    crops: int = allowed(1, choices=(1, 5))
    # Pixels of two shifted copies of every view (up-left and down-right, the edge reflected); 0: none.
    translate: int = allowed(0, ge=0, le=8)
    # The shifted views' share of the prediction (airbench94: 1 pixel, half).
    translate_weight: float = allowed(0.5, ge=0, le=1)


@dataclass
class EvaluateTTAConfig:
    """``evaluate``'s test-time augmentation: each key left null takes the run's ``trainer.tta`` value."""

    flip: bool | None = None
    crops: int | None = allowed(None, choices=(1, 5))
    translate: int | None = allowed(None, ge=0, le=8)
    translate_weight: float | None = allowed(None, ge=0, le=1)


@dataclass
class TrainerConfig(CheckedOnConstruction):
    KEY = "trainer."
    max_epochs: int = allowed(10, ge=1)
    max_steps: int | None = allowed(None, ge=1)
    device: str = allowed("auto", choices=DEVICES)
    # None: this process's share of the usable cores, less one per data.num_workers (docs/performance.md).
    cpu_threads: int | None = allowed(None, ge=1)
    devices: int = allowed(1, ge=1)
    # Several machines: this one is node `node_rank` of `num_nodes`, all meeting at `master` ("host:port" of
    # node 0, a free port). Each node runs `trainer.devices` processes (docs/distributed.md).
    num_nodes: int = allowed(1, ge=1)
    node_rank: int = allowed(0, ge=0)
    master: str | None = None
    # Where the job's shape comes from: auto (SLURM's variables when srun started this process, else the keys
    # above), slurm (SLURM's, an error without them) or none (the keys above only). docs/distributed.md#slurm.
    cluster: str = allowed("auto", choices=CLUSTERS)
    # A lost rank (killed, crashed, unreachable) or a hang stops every rank and restarts the job from the newest
    # checkpoint (trainer.resume=auto), at most this many times; 0: the job ends (docs/distributed.md).
    max_restarts: int = allowed(0, ge=0, le=1000)
    # Seconds a collective may wait for the other ranks, and a rank may go without progress, before the job is
    # ended with exit 5 naming the ranks that did not arrive (docs/distributed.md#no-silent-hangs).
    collective_timeout: float = allowed(1800.0, gt=0)
    find_unused_parameters: bool = False
    seed: int = allowed(42, ge=0, le=MAX_SEED)
    # Deterministic cuDNN algorithms on GPUs (slower); CPU kernels are deterministic already.
    deterministic: bool = False
    accumulate_grad_batches: int = allowed(1, ge=1)
    grad_clip_norm: float | None = allowed(None, gt=0)
    # Validate every N epochs; 0 disables validation.
    val_every_n_epochs: int = allowed(1, ge=0)
    limit_train_batches: int | None = allowed(None, ge=1)
    limit_val_batches: int | None = allowed(None, ge=1)
    # Resume: None, "auto" (newest complete checkpoint in the run dir) or a checkpoint directory.
    resume: str | None = None
    # Resume from a legacy pickled .pdparams/.pdopt checkpoint (unpickling runs code: trust the file first).
    trust_pickle: bool = False
    # Stop after this many consecutive non-finite steps.
    max_consecutive_nonfinite: int = allowed(20, ge=1)
    amp: AmpConfig = field(default_factory=AmpConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    # Test-time augmentation of every validation (the monitored metric and the best checkpoint follow it).
    tta: TTAConfig = field(default_factory=TTAConfig)


@dataclass
class FitConfig:
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    sched: SchedConfig = MISSING
    loss: LossConfig = MISSING
    trainer: TrainerConfig = MISSING
    # Callbacks by name: a callback registered in paddletrain.registry.CALLBACKS under that name, with its
    # options (`early_stopping: {patience: 5}`), or any class given by `_target_`. null switches one off.
    callbacks: dict[str, Any] = field(default_factory=dict)
    # The metric that ranks checkpoints and runs (the value a sweeper optimises), and whether higher is better.
    monitor: str = "val/top1"
    monitor_mode: str = allowed("max", choices=("max", "min"))
    # Run name used in the run directory and the summary.
    name: str = "paddletrain"
    # Free-form tags: experiment recipes may set them; never read by the library.
    tags: list[str] = field(default_factory=list)
    # Modules imported before anything is built, so that they register their models, datasets, ... (e.g.
    # imports=[my_package.models]). Installed plugins (the paddletrain.plugins entry points) need no entry.
    imports: list[str] = field(default_factory=list)


# The weights of a checkpoint that evaluate, export, predict and ship use: "auto" = the averaged ones (an EMA) when
# the run validated with them (its best checkpoint was chosen on them), else the trained ones; "averaged" insists
# on the average; "raw" = the trained weights (paddletrain.rebuild.checkpoint_weights).
WEIGHTS = ("auto", "averaged", "raw")


@dataclass
class RuntimeConfig:
    """The keys ``export``, ``predict`` and ``ship`` share: where the model runs, what to import before loading it,
    and which weights of a checkpoint to take."""

    device: str = allowed("auto", choices=DEVICES)
    # Threads of the CPU math library; None = every core this process may use (predict: the cores its decode
    # workers leave free).
    cpu_threads: int | None = allowed(None, ge=1)
    # Modules to import first: ones that register models (see FitConfig.imports; export adds those the
    # checkpoint's config names) or load custom Paddle operators an exported graph uses.
    imports: list[str] = field(default_factory=list)
    weights: str = allowed("auto", choices=WEIGHTS)


@dataclass
class EvaluateConfig(FitConfig):
    checkpoint: str = MISSING
    # The split evaluated: "val", or "test" (the dataset's own validation split when data.holdout kept a
    # validation split apart from the training split; see paddletrain.data.sampling.holdout).
    split: str = allowed("val", choices=("val", "test"))
    tta: EvaluateTTAConfig = field(default_factory=EvaluateTTAConfig)
    weights: str = allowed("auto", choices=WEIGHTS)


SCHEMAS: dict[str, Any] = {
    "model": ModelConfig,
    "data": DataConfig,
    "optim": OptimConfig,
    "sched": SchedConfig,
    "loss": LossConfig,
    "trainer": TrainerConfig,
}


# Groups whose `name` picks a registered factory: besides their schema's keys they take the factory's own keyword
# options (`loss=my_loss loss.my_option=3`), checked against its signature by paddletrain.validation.
COMPONENT_GROUPS = ("model", "data", "optim", "sched", "loss")


def register_configs() -> None:
    """Register the schemas so every preset of a group is validated against ``<group>_schema``.

    A component group's schema is stored open (not in struct mode), so that Hydra lets a command line set a key
    the schema does not declare; its values stay typed, and such a key must be an option of the selected
    factory (:func:`component_options`).
    """
    cli_schema("fit")(FitConfig)
    cli_schema("evaluate")(EvaluateConfig)
    for group, schema in SCHEMAS.items():
        node: Any = schema
        if group in COMPONENT_GROUPS:
            node = OmegaConf.structured(schema)
            OmegaConf.set_struct(node, False)
        ConfigStore.instance().store(group=group, name=f"{group}_schema", node=node)


def component_options(node: Any, schema: type) -> dict[str, Any]:
    """The keys of a component group's ``node`` that ``schema`` does not declare, as plain values: the selected
    factory's own options."""
    if not isinstance(node, DictConfig):  # a schema instance: no undeclared keys
        return {}
    declared = {f.name for f in dataclasses.fields(schema)}
    extra = {key: node[key] for key in node if key not in declared}
    return {key: OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
            for key, value in extra.items()}


def factory_options(cfg: Any) -> dict[str, dict[str, Any]]:
    """Each component group's factory options (:func:`component_options`) in a full config, by group: read once
    by whoever checks or builds the run, and handed to each builder as a value."""
    return {group: component_options(cfg[group], SCHEMAS[group]) for group in COMPONENT_GROUPS}


def cli_schema(command: str) -> Callable[[type], type]:
    """Class decorator: store a command's schema in Hydra's ConfigStore as ``<command>_schema``, the name its
    ``conf/<command>.yaml`` defaults list validates against."""

    def store(schema: type) -> type:
        ConfigStore.instance().store(name=f"{command}_schema", node=schema)
        return schema

    return store


_NUMBERS = (int, float)


def _is_numeric(hint: Any) -> bool:
    """int or float, also inside Optional[...] or List[...] (bool is not a number here)."""
    if hint in _NUMBERS:
        return True
    return any(_is_numeric(arg) for arg in typing.get_args(hint) if arg is not type(None))


def undeclared_keys(schema: type, prefix: str = "") -> list[str]:
    """Numeric keys of ``schema`` (recursively) that declare no allowed values: each one is a schema bug."""
    hints = typing.get_type_hints(schema)
    found = []
    for f in dataclasses.fields(schema):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            found.extend(undeclared_keys(hint, f"{prefix}{f.name}."))
        elif _is_numeric(hint) and ALLOWED not in f.metadata:
            found.append(f"{prefix}{f.name}")
    return found


def _read(node: Any, name: str) -> Any:
    """``node.name`` for a DictConfig, dict or dataclass instance; None when unset or missing (``???``)."""
    if isinstance(node, DictConfig):
        return None if name not in node or OmegaConf.is_missing(node, name) else node[name]
    if isinstance(node, dict):
        return node.get(name)
    value = getattr(node, name, None)
    return None if value is MISSING else value


def _check(rule: Allowed, key: str, value: Any, context: str) -> None:
    if isinstance(value, (list, tuple, ListConfig)):
        values = list(value)
        bad = [v for v in values if not rule.admits_element(v)]
        if bad:
            each = rule.describe_bounds() if rule.choice_or_list else rule.describe()
            raise ConfigError(f"{context}{key}={values} is not allowed: every value must be {each} "
                              f"(got {bad[0]!r})")
    elif not rule.admits(value):
        if rule.choices:
            raise ConfigError(f"{context}{key}={value!r} is not allowed; choose {rule.describe()}")
        finite = "" if not isinstance(value, float) or math.isfinite(value) else "a finite number "
        raise ConfigError(f"{context}{key}={value} must be {finite}{rule.describe()}")


def check_values(node: Any, schema: type | None = None, prefix: str = "", context: str = "") -> None:
    """Raise :class:`ConfigError` for the first key of ``node`` whose value its schema does not allow.

    Args:
        node: a DictConfig, dict or dataclass instance.
        schema: the dataclass declaring the keys (default: ``type(node)``); nested schemas are walked.
        prefix: prepended to key names (``trainer.``).
        context: prepended to the message (``bench train: ``).
    """
    schema = schema or type(node)
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        value = _read(node, f.name)
        if value is None:
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            check_values(value, hints[f.name], f"{prefix}{f.name}.", context)
        elif ALLOWED in f.metadata:
            _check(f.metadata[ALLOWED], f"{prefix}{f.name}", value, context)


def check_option(name: str, value: Any, *, ge: float | None = None, gt: float | None = None,
                 le: float | None = None, lt: float | None = None, choices: tuple = ()) -> None:
    """Raise :class:`ConfigError` when ``value`` of the option ``name`` is not allowed (same rules and messages as
    the schemas'; for constructors whose keyword arguments are their config, e.g. the callbacks)."""
    if value is not None:
        _check(Allowed(ge=ge, gt=gt, le=le, lt=lt, choices=tuple(choices)), name, value, "")


def check_field(schema: type, name: str, value: Any, context: str = "") -> None:
    """Check one argument against the declaration of ``schema.name`` (for library functions that take the
    keys as plain arguments, so the CLI and the API share one rule)."""
    rule = {f.name: f.metadata.get(ALLOWED) for f in dataclasses.fields(schema)}[name]
    if value is not None and rule is not None:
        _check(rule, name, value, context)
