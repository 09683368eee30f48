"""Does a saved training state fit the objects it is about to be loaded into? Checked before anything changes.

Paddle's ``set_state_dict`` only warns about missing or mis-shaped weights, and an optimizer accepts moments of
any shape until its first step fails mid-run. The values are untrusted (:mod:`paddletrain.checkpoint.untrusted`):
the layout of what ``Trainer.state_dict`` saves is written here as data (:func:`training_state`), checked in one
pass, and then each part is held against its object (shapes against the model's, the scheduler's kinds against
its own), naming the key of the first that does not fit.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import paddle

from paddletrain.checkpoint.untrusted import (
    Check,
    StateValueError,
    anything,
    checked_bool,
    checked_int,
    checked_mapping,
    checked_number,
    like,
    list_of,
    mapping_of,
    record,
    required,
    show,
    tensor,
)
from paddletrain.engine.optimizer_state import BY_PARAMETER, LR_STATE, MASTER_WEIGHTS
from paddletrain.errors import UserError

# What Trainer.state_dict saves (engine.state.save_state), part by part. A part checked by its own reader (a
# callback's, the sampler's, the precision's load_state_dict) is taken as it is here.
MODEL = mapping_of(tensor, what="parameter names")
PROGRESS = record({"epoch": checked_int, "global_step": checked_int},
                  optional={"batch_in_epoch": checked_int, "epoch_finished": checked_bool,
                            "nonfinite_steps": checked_int},
                  defaults={"batch_in_epoch": 0, "epoch_finished": False, "nonfinite_steps": 0})
# Logged metrics, NaN and inf included: a diverged run logs them.
METRICS = mapping_of(checked_number, what="metric names")
RNG = list_of(anything, what="per-rank random states", min_items=1)  # each rank's, checked by checkpoint.rng


def optimizer_layout(scheduler_state: Any = None) -> Check:
    """An optimizer's saved state: by structured parameter name (:mod:`paddletrain.engine.optimizer_state`), or
    Paddle's flat ``state_dict`` (every other key an accumulator); the scheduler's part like ``scheduler_state``."""
    return record(optional={BY_PARAMETER: mapping_of(mapping_of(tensor, what="accumulator kinds"),
                                                     what="parameter names"),
                            MASTER_WEIGHTS: mapping_of(tensor, what="parameter names"),
                            LR_STATE: anything if scheduler_state is None else like(scheduler_state)},
                  others=tensor)


def training_state(optimizer: paddle.optimizer.Optimizer | None = None,
                   scheduler: paddle.optimizer.lr.LRScheduler | None = None) -> Check:
    """The check of a whole saved training state: every part's type, and the optimizer's and scheduler's parts
    when the state goes back into an ``optimizer`` and a ``scheduler``."""
    required: dict[str, Check] = {"model": MODEL, "progress": PROGRESS, "rng": RNG}
    optional: dict[str, Check] = {"metrics": METRICS, "callbacks": mapping_of(anything, what="callback names")}
    if optimizer is not None:
        required["optimizer"] = optimizer_layout(_scheduler_state(optimizer))
    if scheduler is not None:
        optional["scheduler"] = like(scheduler.state_dict())
    return record(required, optional=optional, defaults={"metrics": {}, "callbacks": {}}, others=anything)


def _scheduler_state(optimizer: paddle.optimizer.Optimizer) -> Any:
    learning_rate = getattr(optimizer, "_learning_rate", None)
    return learning_rate.state_dict() if isinstance(learning_rate, paddle.optimizer.lr.LRScheduler) else None


# Optimizers whose every accumulator is shaped like its parameter or holds one value (beta powers, step
# counters). Others (e.g. ASGD's per-batch history) are only checked to hold tensors.
_PARAMETER_SHAPED = tuple(getattr(paddle.optimizer, name) for name in (
    "SGD", "Momentum", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSProp", "Lamb", "NAdam", "RAdam")
    if hasattr(paddle.optimizer, name))


def _shape(value: Any) -> list[int]:
    return [int(n) for n in value.shape]


@dataclass
class StateDiff:
    """How a saved state dict differs from a model's: the one comparison behind resuming, exporting,
    evaluating and loading pretrained weights."""

    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    # (key, saved shape, model shape)
    mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.missing or self.unexpected or self.mismatched)


def compare_state(expected: Mapping[str, Any], saved: Mapping[str, Any]) -> StateDiff:
    """Keys of ``expected`` (a model's state dict) missing from ``saved``, keys of ``saved`` it does not have,
    and common keys whose shapes differ, each sorted."""
    diff = StateDiff(missing=sorted(set(expected) - set(saved)), unexpected=sorted(set(saved) - set(expected)))
    for key in sorted(set(expected) & set(saved)):
        have, want = tuple(int(n) for n in saved[key].shape), tuple(int(n) for n in expected[key].shape)
        if have != want:
            diff.mismatched.append((key, have, want))
    return diff


def check_state_matches(model: paddle.nn.Layer, saved: Any, key: str = "model") -> None:
    """Raise :class:`UserError` listing missing, unexpected and shape-mismatched keys.

    Paddle's ``set_state_dict`` only warns about them, which would resume a different model silently. A value
    that is not a tensor raises :class:`StateValueError` naming it.
    """
    diff = compare_state(model.state_dict(), MODEL(saved, key))
    if diff:
        mismatched = [f"{k}: checkpoint {list(have)} vs model {list(want)}" for k, have, want in diff.mismatched]
        parts = [f"{label} ({len(keys)}): {', '.join(keys[:8])}{' ...' if len(keys) > 8 else ''}"
                 for label, keys in (("missing", diff.missing), ("unexpected", diff.unexpected),
                                     ("shape mismatch", mismatched)) if keys]
        raise UserError("the checkpoint's weights do not fit this model (a different architecture or number of "
                        "classes?): " + "; ".join(parts))


def check_optimizer_state(optimizer: paddle.optimizer.Optimizer, model: paddle.nn.Layer, saved: Any,
                          key: str = "optimizer") -> None:
    """Check a saved optimizer state against the parameters of ``model`` before it is put back.

    The state is keyed by each parameter's structured name (:mod:`paddletrain.engine.optimizer_state`), or, in a
    checkpoint written before that and in a PaddleClas ``.pdopt``, by Paddle's automatic names
    (``conv2d_0.w_0_moment1_0``), which must then be this process's. Each accumulator must be a tensor shaped like
    its parameter or holding one value, and ``master_weights`` like their parameters. The learning rate
    scheduler's part is checked like the scheduler's own state.

    Raises:
        StateValueError: naming the accumulator, its shape and the parameter's.
    """
    saved = optimizer_layout(_scheduler_state(optimizer))(saved, key)
    strict = isinstance(optimizer, _PARAMETER_SHAPED)
    if BY_PARAMETER in saved:
        _check_by_parameter(model, saved, key, strict)
        return
    _check_flat_names(model, saved, key)
    params = {p.name: p for p in model.parameters()}
    for name, value in saved.items():
        where = f"{key}.{name}"
        if name == LR_STATE:
            continue
        if name == MASTER_WEIGHTS:
            for param_name, weight in value.items():
                shape = _shape(weight)
                if param_name in params and shape != list(params[param_name].shape):
                    raise StateValueError(f"{where}.{param_name}", f"has shape {shape}, but the parameter has "
                                                                   f"{list(params[param_name].shape)}")
            continue
        shape = _shape(value)
        param = _owner(name, params)
        if param is None or not strict:
            continue  # paddle keeps state of unknown parameters aside and never uses it
        expected = list(param.shape)
        if shape != expected and math.prod(shape) != 1:
            raise StateValueError(where, f"has shape {shape}, but its parameter {param.name} has shape {expected} "
                                         "(an optimizer state of another model?)")


def _check_by_parameter(module: paddle.nn.Layer, saved: Mapping, key: str, strict: bool) -> None:
    """Every saved entry (of a state :func:`optimizer_layout` checked) names a parameter of ``module`` and is
    shaped like it (or holds one value, when ``strict``); raises :class:`StateValueError` naming the first that
    does not."""
    params = dict(module.named_parameters())
    for group in (BY_PARAMETER, MASTER_WEIGHTS):
        for name, value in saved.get(group, {}).items():
            where = f"{key}.{group}.{name}"
            if name not in params:
                raise StateValueError(where, "belongs to no parameter of this model (an optimizer state of another "
                                             "model?)")
            for kind, accumulator in (value if group == BY_PARAMETER else {"": value}).items():
                shape = _shape(accumulator)
                expected = list(params[name].shape)
                if (strict or group == MASTER_WEIGHTS) and shape != expected and (group == MASTER_WEIGHTS
                                                                                  or math.prod(shape) != 1):
                    raise StateValueError(f"{where}.{kind}" if kind else where,
                                          f"has shape {shape}, but its parameter {name} has shape {expected} (an "
                                          "optimizer state of another model?)")


def _check_flat_names(module: paddle.nn.Layer, saved: Mapping, key: str) -> None:
    """A flat (pre-``by_parameter``) state can only be put back where its names are this process's: refuse it in
    one line where an accumulator belongs to no parameter of ``module``."""
    names = [param.name for param in module.parameters()]
    for entry in saved:
        if entry in (LR_STATE, MASTER_WEIGHTS):
            continue
        if not any(entry.startswith(name + "_") for name in names):
            raise StateValueError(f"{key}.{entry}", "is keyed by Paddle's automatic parameter name, which no "
                                  "parameter of this model has in this process (an optimizer state written before "
                                  "paddletrain keyed it by parameter, or a .pdopt, read into a model built after "
                                  "other layers): resume it in a fresh process, where the model is built first")


def _owner(accumulator: str, params: dict[str, Any]) -> Any:
    """The parameter an accumulator belongs to: the longest parameter name it starts with, plus ``_``."""
    owners = [name for name in params if accumulator.startswith(name + "_")]
    return params[max(owners, key=len)] if owners else None


def check_scheduler_state(scheduler: paddle.optimizer.lr.LRScheduler, saved: Any, key: str = "scheduler") -> None:
    """Every value the scheduler keeps must come back with the kind it has now (a count stays an int >= -1)."""
    like(scheduler.state_dict())(saved, key)


def checked_progress(progress: Any, key: str = "progress") -> dict[str, Any]:
    """The trainer's position (epoch, batch, step counters), every counter an int in range."""
    return PROGRESS(progress, key)


def checked_metrics(metrics: Any, key: str = "metrics") -> dict[str, float]:
    """Logged metrics: names to numbers (NaN and inf included: a diverged run logs them)."""
    return METRICS(metrics, key)


def checked_scaler_state(saved: Any) -> dict[str, Any]:
    """The saved loss-scaler state (``Precision.state_dict()["scaler"]``) with every value in the range paddle's
    ``GradScaler`` assumes (else StateValueError naming the key)."""
    saved = dict(checked_mapping(saved, "scaler"))
    scale = required(saved, "scale", "scaler.scale")
    saved["scale"] = scale[0] if isinstance(scale, (list, tuple)) and len(scale) == 1 else scale
    for name, allowed, wanted in (("scale", lambda x: x > 0, "> 0"), ("incr_ratio", lambda x: x >= 1, ">= 1"),
                                  ("decr_ratio", lambda x: 0 < x <= 1, "in (0, 1]")):
        number = checked_number(required(saved, name, f"scaler.{name}"), f"scaler.{name}", finite=True)
        if not allowed(number):
            raise StateValueError(f"scaler.{name}", f"is {show(saved[name])}: expected a number {wanted}")
        saved[name] = number
    for name, low in (("incr_every_n_steps", 1), ("decr_every_n_nan_or_inf", 1), ("incr_count", 0),
                      ("decr_count", 0)):
        saved[name] = checked_int(required(saved, name, f"scaler.{name}"), f"scaler.{name}", minimum=low)
    key = "scaler.use_dynamic_loss_scaling"
    saved["use_dynamic_loss_scaling"] = checked_bool(required(saved, "use_dynamic_loss_scaling", key), key)
    return saved
