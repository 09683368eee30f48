"""Parameter groups and optimizers (the learning-rate schedules are in :mod:`paddletrain.schedules`).

Paddle parameter groups are dicts ``{"params": [...], "weight_decay": float, "learning_rate": mult}``; a group's
``learning_rate`` multiplies the optimizer's (scheduled) learning rate, and its ``weight_decay`` replaces the
optimizer's: L2 added to the gradient for SGD/Momentum, Adam and RMSProp, decoupled decay for AdamW, and the
decay inside LAMB's and LARS' own update (their factories move it to ``lamb_weight_decay``/``lars_weight_decay``).

Optimizers are registered in :data:`paddletrain.registry.OPTIMIZERS` as
``factory(param_groups, learning_rate, cfg) -> paddle.optimizer.Optimizer``; :func:`build_optimizer` picks one
by ``optim.name``.

Gradient clipping is not configured on the optimizer: :meth:`paddletrain.engine.precision.Precision.step` clips the
unscaled gradients itself.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import paddle
from paddle import nn
from paddle.incubate.optimizer import LarsMomentumOptimizer
from paddle.optimizer.lr import LRScheduler

from paddletrain.config import OptimConfig, check_field
from paddletrain.errors import ConfigError
from paddletrain.models.factory import FROZEN
from paddletrain.registry import OPTIMIZERS
from paddletrain.schedules import build_scheduler, optimizer_steps_per_epoch, schedule_steps

log = logging.getLogger("paddletrain")

NORM_LAYERS: tuple[type, ...] = (
    nn.BatchNorm,
    nn.BatchNorm1D,
    nn.BatchNorm2D,
    nn.BatchNorm3D,
    nn.SyncBatchNorm,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.InstanceNorm1D,
    nn.InstanceNorm2D,
    nn.InstanceNorm3D,
)


# ---------------------------------------------------------------------------------------------- param groups
def _unwrap(model: nn.Layer) -> nn.Layer:
    return model._layers if isinstance(model, paddle.DataParallel) else model


def _no_decay_ids(model: nn.Layer) -> set:
    """Parameters of normalisation layers (found by type) and every 1-D parameter (biases)."""
    ids = set()
    for layer in model.sublayers(include_self=True):
        is_norm = isinstance(layer, NORM_LAYERS)
        for param in layer.parameters(include_sublayers=False):
            if is_norm or len(param.shape) <= 1:
                ids.add(id(param))
    return ids


def _head_layer(model: nn.Layer, head_name: str) -> nn.Layer | None:
    head = getattr(model, head_name, None)
    if isinstance(head, nn.Layer):
        return head
    if hasattr(model, "get_classifier"):
        return model.get_classifier()
    return None


def _stage_names(model: nn.Layer, children: OrderedDict[str, nn.Layer], head: nn.Layer | None) -> list[str]:
    declared = getattr(model, "stage_names", None)
    if declared:
        return list(declared)
    with_params = [name for name, child in children.items() if child.parameters() and child is not head]
    stem = with_params[0] if with_params else None
    return [
        name
        for name, child in children.items()
        if isinstance(child, (nn.Sequential, nn.LayerList)) and child is not head and name != stem
    ]


def _lr_multipliers(
    model: nn.Layer, head: nn.Layer | None, head_lr_mult: float, layer_decay: float | None
) -> dict[int, float]:
    """LR multiplier per parameter id: stem decay^(S+1), stage i decay^(S+1-i), head head_lr_mult."""
    children = OrderedDict(model.named_children())
    stages = _stage_names(model, children, head) if layer_decay is not None else []
    if layer_decay is not None and not stages:
        raise ConfigError(
            "optim.layer_decay needs a model with stages: declare `stage_names` or use top-level "
            "nn.Sequential/nn.LayerList stages after the stem"
        )
    num_stages = len(stages)
    depth = num_stages + 1  # the stem sits one step below the first stage
    mults: dict[int, float] = {}
    for name, child in children.items():
        if child is head:
            continue
        if name in stages:
            depth = num_stages - stages.index(name)
        mult = layer_decay**depth if layer_decay is not None else 1.0
        for param in child.parameters():
            mults[id(param)] = mult
    stem_mult = layer_decay ** (num_stages + 1) if layer_decay is not None else 1.0
    for param in model.parameters(include_sublayers=False):  # e.g. a class token registered on the model
        mults[id(param)] = stem_mult
    if head is not None:
        for param in head.parameters():
            mults[id(param)] = head_lr_mult
    return mults


def param_groups(
    model: nn.Layer,
    weight_decay: float,
    no_decay_norm_bias: bool = True,
    head_lr_mult: float = 1.0,
    layer_decay: float | None = None,
    head_name: str = "fc",
    norm_bias_lr_mult: float = 1.0,
) -> list[dict[str, Any]]:
    """Split ``model``'s parameters into Paddle parameter groups.

    - No weight decay on normalisation-layer parameters (BatchNorm*, SyncBatchNorm, LayerNorm, GroupNorm,
      InstanceNorm*) and 1-D parameters (biases) when ``no_decay_norm_bias``.
    - ``head_lr_mult`` multiplies the classifier head's LR (the child ``head_name``, else ``get_classifier()``).
    - ``layer_decay`` d: the LR decays per stage towards the input. Stages are ``model.stage_names`` when the
      model declares them, else the top-level ``nn.Sequential``/``nn.LayerList`` children after the first
      parameter-holding child (the stem). Walking the top-level children in order, everything before the
      first stage is the stem (d^(S+1)), stage i of S gets d^(S+1-i), children after a stage join it, and the
      head gets 1.0 (times ``head_lr_mult``).
    - ``norm_bias_lr_mult`` multiplies the LR of normalisation-layer parameters and biases (on top of the above).

    Frozen parameters are kept, so unfreezing later trains them; Paddle's optimizers skip them meanwhile.
    """
    for key, value in (("weight_decay", weight_decay), ("head_lr_mult", head_lr_mult), ("layer_decay", layer_decay),
                       ("norm_bias_lr_mult", norm_bias_lr_mult)):
        _check(key, value)
    return _grouped(model, weight_decay, no_decay_norm_bias, head_lr_mult, layer_decay, head_name, norm_bias_lr_mult)


def _grouped(model: nn.Layer, weight_decay: float, no_decay_norm_bias: bool, head_lr_mult: float,
             layer_decay: float | None, head_name: str = "fc",
             norm_bias_lr_mult: float = 1.0) -> list[dict[str, Any]]:
    """:func:`param_groups` of values already checked (an optim config is, by validation or construction)."""
    model = _unwrap(model)
    head = _head_layer(model, head_name)
    if head is None and (head_lr_mult != 1.0 or layer_decay is not None):
        raise ConfigError(
            f"optim.head_lr_mult/optim.layer_decay need the classifier head: {type(model).__name__} has no "
            f"child {head_name!r} and no get_classifier()"
        )
    mults = _lr_multipliers(model, head, head_lr_mult, layer_decay)
    norm_bias = _no_decay_ids(model)
    no_decay = norm_bias if no_decay_norm_bias else set()

    groups: OrderedDict[tuple[float, bool], list[paddle.Tensor]] = OrderedDict()
    for param in model.parameters():
        mult = mults.get(id(param), 1.0) * (norm_bias_lr_mult if id(param) in norm_bias else 1.0)
        if getattr(param, FROZEN, False):  # model.norm_frozen_scale: kept as it is, decay included
            mult = 0.0
        key = (mult, id(param) not in no_decay)
        groups.setdefault(key, []).append(param)
    return [
        # float(): Paddle maps a float weight_decay to L2Decay but treats an int as a regularizer object.
        {"params": params, "weight_decay": float(weight_decay) if decay else 0.0, "learning_rate": float(mult)}
        for (mult, decay), params in groups.items()
    ]


# ---------------------------------------------------------------------------------------------- optimizers
def build_optimizer(
    model: nn.Layer, cfg: OptimConfig, scheduler_or_lr: LRScheduler | float,
    options: Mapping[str, Any] | None = None,
) -> paddle.optimizer.Optimizer:
    """The optimizer registered as ``optim.name`` (case-insensitive) over :func:`param_groups` of ``model``.

    Built in: ``sgd`` (Momentum, Nesterov optional; plain SGD when momentum == 0), ``adamw``, ``adam``,
    ``rmsprop``, ``lamb`` and ``lars``. Every one keeps the groups' decay rules: a group with
    ``weight_decay`` 0 is not decayed (nor, for LAMB/LARS, layer-wise adapted).

    ``cfg`` is a validated ``optim`` node or an :class:`OptimConfig` (checked when constructed); ``options`` are
    the factory's own keyword arguments (on the command line, the ``optim`` keys the schema does not declare:
    :func:`paddletrain.config.factory_options`).
    """
    return _optimizer_over(model, cfg, options)(scheduler_or_lr)


def _optimizer_over(model: nn.Layer, cfg: OptimConfig,
                    options: Mapping[str, Any] | None) -> Callable[[LRScheduler | float], paddle.optimizer.Optimizer]:
    """The optimizer of ``cfg`` over ``model``'s parameter groups, still to be given its learning rate."""
    factory = OPTIMIZERS.get(str(cfg.name).lower())
    groups = _grouped(model, cfg.weight_decay, cfg.no_decay_norm_bias, cfg.head_lr_mult, cfg.layer_decay,
                      norm_bias_lr_mult=cfg.norm_bias_lr_mult)
    return lambda scheduler_or_lr: factory(groups, scheduler_or_lr, cfg, **(options or {}))


def _check(key: str, value: Any) -> None:
    """``optim.<key>=value`` against the schema's declaration (the range's one home, :class:`OptimConfig`): the
    entry point validated a config already; this is for the Python API's hand-made configs."""
    check_field(OptimConfig, key, value, context="optim.")


def _momentum(cfg: Any) -> float:
    _check("momentum", cfg.momentum)
    return float(cfg.momentum)


def _betas(cfg: Any) -> tuple[float, float]:
    betas = list(cfg.betas)
    if len(betas) != 2:
        raise ConfigError(f"optim.betas must be two values (beta1, beta2), got {cfg.betas!r}")
    _check("betas", betas)
    return float(betas[0]), float(betas[1])


# The epsilon of each built-in optimizer when optim.eps is null: the default of the implementation its update
# follows (PyTorch/timm for adam, adamw and rmsprop; Paddle's Lamb and LarsMomentum kernels). Paddle's own RMSProp
# defaults to 1e-6; paddletrain keeps PyTorch's 1e-8, with which timm's RMSProp recipes were tuned.
DEFAULT_EPS = {"adam": 1e-8, "adamw": 1e-8, "rmsprop": 1e-8, "lamb": 1e-6, "lars": 1e-8}


def _eps(cfg: Any, name: str) -> float:
    """``optim.eps``, or the optimizer's own default (:data:`DEFAULT_EPS`) when it is None."""
    eps = getattr(cfg, "eps", None)
    if eps is None:
        return DEFAULT_EPS[name]
    _check("eps", eps)
    return float(eps)


# The built-in optimizers that have no Nesterov variant: optim.nesterov is refused with them (validation.py).
WITHOUT_NESTEROV = ("adam", "adamw", "rmsprop", "lamb", "lars")


def _decay_under(groups: Sequence[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Move each group's ``weight_decay`` to ``key`` for optimizers that decay inside their own update.

    Paddle turns a group's float ``weight_decay`` into an L2 term added to the gradient; LAMB and LARS must
    see the raw gradient and apply the decay themselves, so that term is switched off (None).
    """
    moved = []
    for group in groups:
        group = dict(group)
        group[key] = float(group.pop("weight_decay", 0.0) or 0.0)
        group["weight_decay"] = None
        moved.append(group)
    return moved


def _adam(optimizer: type[paddle.optimizer.Optimizer], name: str, groups: Sequence[dict[str, Any]],
          learning_rate: Any, cfg: OptimConfig) -> paddle.optimizer.Optimizer:
    """Adam or AdamW from the same settings; the class decides how the weight decay applies."""
    beta1, beta2 = _betas(cfg)
    return optimizer(learning_rate=learning_rate, beta1=beta1, beta2=beta2, epsilon=_eps(cfg, name),
                     parameters=list(groups), weight_decay=float(cfg.weight_decay))


@OPTIMIZERS.register("sgd")
def build_sgd(
    groups: Sequence[dict[str, Any]], learning_rate: Any, cfg: OptimConfig
) -> paddle.optimizer.Optimizer:
    """SGD with momentum (Polyak), or Nesterov momentum with ``optim.nesterov``; L2 decay in the gradient.

    Nesterov follows Sutskever et al. 2013 as PyTorch writes it: ``v = mu * v + g``, ``w -= lr * (g + mu * v)``.
    """
    momentum = _momentum(cfg)
    decay = float(cfg.weight_decay)
    if momentum == 0:  # optim.nesterov needs momentum (validation.py)
        return paddle.optimizer.SGD(learning_rate=learning_rate, parameters=list(groups), weight_decay=decay)
    return paddle.optimizer.Momentum(
        learning_rate=learning_rate,
        momentum=momentum,
        use_nesterov=bool(cfg.nesterov),
        parameters=list(groups),
        weight_decay=decay,
    )


@OPTIMIZERS.register("adamw")
def build_adamw(
    groups: Sequence[dict[str, Any]], learning_rate: Any, cfg: OptimConfig
) -> paddle.optimizer.Optimizer:
    """AdamW (Loshchilov & Hutter 2019): Adam with decoupled weight decay ``w -= lr * wd * w``."""
    return _adam(paddle.optimizer.AdamW, "adamw", groups, learning_rate, cfg)


@OPTIMIZERS.register("adam")
def build_adam(
    groups: Sequence[dict[str, Any]], learning_rate: Any, cfg: OptimConfig
) -> paddle.optimizer.Optimizer:
    """Adam (Kingma & Ba 2015) with L2 decay added to the gradient (as ``torch.optim.Adam``)."""
    return _adam(paddle.optimizer.Adam, "adam", groups, learning_rate, cfg)


@OPTIMIZERS.register("rmsprop")
def build_rmsprop(
    groups: Sequence[dict[str, Any]], learning_rate: Any, cfg: OptimConfig
) -> paddle.optimizer.Optimizer:
    """RMSProp (Tieleman & Hinton 2012) with momentum, L2 decay in the gradient.

    ``r = rho * r + (1 - rho) * g^2``, ``v = momentum * v + lr * g / sqrt(r + eps)``, ``w -= v``: the epsilon
    sits inside the square root as in TensorFlow (and timm's ``rmsproptf``); ``optim.rho`` is PyTorch's
    ``alpha``. ``optim.centered`` divides by the variance instead of the second moment.
    """
    rho = getattr(cfg, "rho", 0.9)
    _check("rho", rho)
    return paddle.optimizer.RMSProp(
        learning_rate=learning_rate,
        rho=float(rho),
        epsilon=_eps(cfg, "rmsprop"),
        momentum=_momentum(cfg),
        centered=bool(getattr(cfg, "centered", False)),
        parameters=list(groups),
        weight_decay=float(cfg.weight_decay),
    )


@OPTIMIZERS.register("lamb")
def build_lamb(
    groups: Sequence[dict[str, Any]], learning_rate: Any, cfg: OptimConfig
) -> paddle.optimizer.Optimizer:
    """LAMB (You et al. 2019, "Large Batch Optimization for Deep Learning"), Paddle's kernel.

    Adam's bias-corrected step ``r = m_hat / (sqrt(v_hat) + eps)`` plus decoupled decay ``wd * w``, scaled per
    parameter tensor by the trust ratio ``||w|| / ||r + wd * w||``. Groups without decay (norms, biases) take
    the plain step without the trust ratio (Paddle's and timm's default). ``optim.weight_decay`` is LAMB's
    decay (timm's RSB recipes use 0.01 with lr 5e-3 to 8e-3).
    """
    beta1, beta2 = _betas(cfg)
    return paddle.optimizer.Lamb(
        learning_rate=learning_rate,
        lamb_weight_decay=float(cfg.weight_decay),
        beta1=beta1,
        beta2=beta2,
        epsilon=_eps(cfg, "lamb"),
        parameters=_decay_under(groups, "lamb_weight_decay"),
    )


class LarsMomentum(LarsMomentumOptimizer):
    """LARS with momentum (You, Gitman & Ginsburg 2017, "Large Batch Training of Convolutional Networks").

    Per parameter tensor: ``local_lr = lr * trust_coefficient * ||w|| / (||g|| + wd * ||w|| + eps)``,
    ``v = momentum * v + local_lr * (g + wd * w)``, ``w -= v``. Where ``wd``, ``||w||`` or ``||g||`` is zero the
    step is plain momentum SGD (``local_lr = lr``), so groups without decay (norms, biases) are neither decayed
    nor adapted, as in the MLPerf reference and timm. Paddle's ``LarsMomentumOptimizer`` kernel does the
    arithmetic; this subclass adds parameter groups, each with its own ``lars_weight_decay``, instead of
    Paddle's exclusion by parameter-name substring.
    """

    def __init__(
        self,
        learning_rate: Any,
        momentum: float,
        parameters: Sequence[dict[str, Any]],
        trust_coefficient: float = 0.001,
        weight_decay: float = 0.0,
        epsilon: float = 0.0,
        multi_precision: bool = False,
    ) -> None:
        super().__init__(
            learning_rate=learning_rate,
            momentum=momentum,
            lars_coeff=trust_coefficient,
            lars_weight_decay=weight_decay,
            parameter_list=list(parameters),
            epsilon=epsilon,
            multi_precision=multi_precision,
        )
        self._default_lars_weight_decay = float(weight_decay)

    def _create_accumulators(self, block: Any, parameters: Any) -> None:
        if isinstance(parameters, dict):  # a parameter group: Paddle's LARS only knows flat lists
            parameters = parameters["params"]
        super()._create_accumulators(block, parameters)

    def _append_optimize_op(self, block: Any, param_and_grad: Any) -> Any:
        decay = self._default_lars_weight_decay
        if isinstance(param_and_grad, dict):
            decay = float(param_and_grad.get("lars_weight_decay", decay))
            param_and_grad = param_and_grad["params"]
        self._lars_weight_decay = decay  # read by the parent for this one parameter
        return super()._append_optimize_op(block, param_and_grad)


@OPTIMIZERS.register("lars")
def build_lars(
    groups: Sequence[dict[str, Any]], learning_rate: Any, cfg: OptimConfig
) -> paddle.optimizer.Optimizer:
    """:class:`LarsMomentum` with ``optim.momentum``, ``optim.weight_decay``, ``optim.trust_coefficient``."""
    momentum = _momentum(cfg)
    trust = getattr(cfg, "trust_coefficient", 0.001)
    _check("trust_coefficient", trust)
    return LarsMomentum(
        learning_rate=learning_rate,
        momentum=momentum,
        parameters=_decay_under(groups, "lars_weight_decay"),
        trust_coefficient=float(trust),
        weight_decay=float(cfg.weight_decay),
        epsilon=_eps(cfg, "lars"),
    )


def check_optim_config(optim: Any) -> None:
    """The ``optim.*`` rules beyond each key's declared range: Nesterov momentum is SGD's, with momentum."""
    name = str(optim.name).lower()
    if optim.nesterov and name in WITHOUT_NESTEROV:
        raise ConfigError(f"optim.nesterov applies to optim.name=sgd only, not {name!r}")
    if optim.nesterov and name == "sgd" and optim.momentum == 0:
        raise ConfigError("optim.nesterov needs optim.momentum > 0")


def run_lr(cfg: OptimConfig, global_batch: int) -> float:
    """The learning rate a run starts from: ``optim.lr``, scaled to ``global_batch`` when ``optim.scale_lr``."""
    return scaled_lr(cfg.lr, global_batch, cfg.base_batch_size) if cfg.scale_lr else cfg.lr


def scaled_lr(lr: float, global_batch: int, base_batch_size: int) -> float:
    """Linear LR scaling (Goyal et al.): ``lr * global_batch / base_batch_size``."""
    if global_batch <= 0:
        raise ConfigError(f"the global batch size must be > 0, got {global_batch!r}")
    if base_batch_size <= 0:  # a plain argument (in a config, the schema's optim.base_batch_size rule holds)
        raise ConfigError(f"optim.base_batch_size={base_batch_size} must be >= 1")
    return lr * global_batch / base_batch_size


def build_optimization(optim: OptimConfig, sched: Any, model: paddle.nn.Layer, batches_per_epoch: int, *,
                       max_epochs: int, accumulate: int = 1, batch_size: int, world_size: int = 1,
                       options: Mapping[str, Mapping[str, Any]] | None = None,
                       ) -> tuple[paddle.optimizer.Optimizer, paddle.optimizer.lr.LRScheduler]:
    """The optimizer of ``optim`` and the schedule of ``sched``, whose length is the run's optimizer steps:
    ``batches_per_epoch`` (the loop's own count, :func:`paddletrain.engine.trainer.count_batches`) in steps of
    ``accumulate`` batches, for ``max_epochs``. ``batch_size`` is a process's; the global batch scales the rate
    when ``optim.scale_lr``. ``options``: the factories' own options by group (``{"optim": ..., "sched": ...}``,
    :func:`paddletrain.config.factory_options`)."""
    options = options or {}
    global_batch = batch_size * world_size * accumulate
    lr = run_lr(optim, global_batch)
    # The parameter groups first: the optimizer then only waits for the schedule's rate.
    optimizer_over = _optimizer_over(model, optim, options.get("optim"))
    per_epoch = optimizer_steps_per_epoch(batches_per_epoch, accumulate)
    steps = schedule_steps(per_epoch, max_epochs, sched.warmup_epochs)
    scheduler = build_scheduler(sched, lr, steps, options.get("sched"))
    log.info("Global batch %d (%d per process x %d process(es) x %d accumulation), learning rate %g%s, "
             "%d optimizer steps", global_batch, batch_size, world_size, accumulate, lr,
             f" (optim.lr={optim.lr:g} scaled by {global_batch}/{optim.base_batch_size})"
             if optim.scale_lr else "", steps.total)
    return optimizer_over(scheduler), scheduler
