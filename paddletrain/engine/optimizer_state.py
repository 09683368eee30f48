"""An optimizer's state keyed by each parameter's place in the model, not by Paddle's automatic names.

Paddle keys an optimizer's accumulators ``<parameter.name>_<kind>_<n>`` (``conv2d_0.w_0_velocity_0``), and a
parameter's ``name`` comes from a process-wide counter: the same model built after another layer (a sweep's
second job, a script, a notebook) gets other names, and Paddle fails at the first step ("Optimizer set error").
Saved here by structured name::

    {"by_parameter": {"conv1.weight": {"velocity": <tensor>}, ...},
     "master_weights": {"conv1.weight": <tensor>}, "LR_Scheduler": {...}}

and restored into whatever names this process gave the parameters. A checkpoint written before this layout (Paddle's
flat ``state_dict``) still loads where its names are this process's, and is refused in one line where they are not.
"""
from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import paddle

from paddletrain.checkpoint.untrusted import StateValueError

BY_PARAMETER = "by_parameter"
LR_STATE = "LR_Scheduler"  # Paddle's key for the learning-rate scheduler inside an optimizer's state
MASTER_WEIGHTS = "master_weights"


def _structured_names(optimizer: paddle.optimizer.Optimizer, module: paddle.nn.Layer) -> dict[str, str]:
    """Paddle's name of each parameter (and of its fp32 master copy, which multi-precision accumulators are keyed
    by) -> the parameter's structured name in ``module``."""
    names = {param.name: name for name, param in module.named_parameters()}
    for param_name, master in getattr(optimizer, "_master_weights", {}).items():
        if param_name in names and hasattr(master, "name"):
            names[master.name] = names[param_name]
    return names


def optimizer_state(optimizer: paddle.optimizer.Optimizer, module: paddle.nn.Layer) -> dict[str, Any]:
    """``optimizer``'s state with every accumulator and master weight keyed by its parameter's structured name in
    ``module`` (the names of ``module.state_dict()``)."""
    flat = optimizer.state_dict()
    names = _structured_names(optimizer, module)
    by_parameter: dict[str, dict[str, Any]] = {}
    for kind, accumulators in optimizer._accumulators.items():  # Paddle's own state_dict walks the same table
        for owner, variable in accumulators.items():
            if owner not in names:
                raise ValueError(f"the optimizer holds state for {owner}, which is not a parameter of the model")
            by_parameter.setdefault(names[owner], {})[kind] = flat[variable.name]
    state: dict[str, Any] = {BY_PARAMETER: by_parameter}
    if flat.get(MASTER_WEIGHTS):
        state[MASTER_WEIGHTS] = {names[name]: weight for name, weight in flat[MASTER_WEIGHTS].items()}
    if LR_STATE in flat:
        state[LR_STATE] = flat[LR_STATE]
    return state


def is_by_parameter(saved: Any) -> bool:
    """Whether a saved optimizer state has this module's layout (else: Paddle's flat ``state_dict``)."""
    return isinstance(saved, Mapping) and BY_PARAMETER in saved


def load_optimizer_state(optimizer: paddle.optimizer.Optimizer, module: paddle.nn.Layer, saved: Mapping) -> None:
    """Put back a saved optimizer state, checked first (:func:`paddletrain.engine.state_checks.check_optimizer_state`):
    this module's layout by structured name, or Paddle's flat one by this process's names."""
    if is_by_parameter(saved):
        load_by_parameter(optimizer, module, saved)
    elif saved.get(MASTER_WEIGHTS):  # Paddle's own path: accumulators keyed by master copies it names itself
        with quiet_scheduler_restore(getattr(optimizer, "_learning_rate", None), saved.get(LR_STATE)):
            optimizer.set_state_dict(dict(saved))
    else:
        load_by_parameter(optimizer, module, by_parameter_from_flat(module, saved))


def by_parameter_from_flat(module: paddle.nn.Layer, saved: Mapping) -> dict[str, Any]:
    """A flat state (``conv2d_0.w_0_velocity_0``, by this process's names, checked first) in the
    ``by_parameter`` layout, so that it loads whatever counter Paddle would give a new accumulator's name."""
    names = {param.name: name for name, param in module.named_parameters()}
    by_parameter: dict[str, dict[str, Any]] = {}
    for entry, value in saved.items():
        if entry == LR_STATE:
            continue
        owner = max((name for name in names if entry.startswith(name + "_")), key=len)
        kind, _, counter = entry[len(owner) + 1:].rpartition("_")
        by_parameter.setdefault(names[owner], {})[kind if counter.isdigit() else f"{kind}_{counter}"] = value
    return {BY_PARAMETER: by_parameter, **({LR_STATE: saved[LR_STATE]} if LR_STATE in saved else {})}


def load_by_parameter(optimizer: paddle.optimizer.Optimizer, module: paddle.nn.Layer, saved: Mapping) -> None:
    """Put back a state :func:`optimizer_state` made (checked first, as :func:`load_optimizer_state` says).

    The accumulators of each parameter with saved state are created now, as its first step would create them, and
    take the saved values; any other parameter's (a frozen backbone's) are created at its first step, as they would
    have been. Paddle's ``set_state_dict`` is not used: it keys by the names this process generates, and fails a
    later step that creates an accumulator it was not given.
    """
    params = dict(module.named_parameters())
    by_parameter = saved.get(BY_PARAMETER, {})
    masters = {params[name].name: weight for name, weight in saved.get(MASTER_WEIGHTS, {}).items()}
    if masters and hasattr(optimizer, "_master_weights"):
        optimizer._master_weights.update(masters)  # the accumulators created next are keyed by these copies
    block = paddle.static.default_main_program().global_block()
    optimizer._create_accumulators(block, [params[name] for name in by_parameter])
    names = _structured_names(optimizer, module)
    missing = [f"{name}.{kind}" for name, kinds in by_parameter.items() for kind in kinds
               if kind not in optimizer._accumulators]
    if missing:
        raise StateValueError(f"optimizer.{BY_PARAMETER}.{missing[0]}", f"is state this optimizer "
                              f"({type(optimizer).__name__}, keeping {', '.join(optimizer._accumulators)}) does not "
                              "have: the checkpoint was written with another optimizer")
    for kind, accumulators in optimizer._accumulators.items():
        for owner, variable in accumulators.items():
            value = by_parameter.get(names.get(owner, ""), {}).get(kind)
            if value is not None:
                variable.set_value(value)
    scheduler = getattr(optimizer, "_learning_rate", None)
    if LR_STATE in saved and isinstance(scheduler, paddle.optimizer.lr.LRScheduler):
        with quiet_scheduler_restore(scheduler, saved[LR_STATE]):
            scheduler.set_state_dict(saved[LR_STATE])


@contextlib.contextmanager
def quiet_scheduler_restore(scheduler: Any, saved: Any) -> Iterator[None]:
    """Paddle's ``LinearWarmup`` saves its inner schedule's state beside its own keys and then warns, loading it,
    that the state holds "unused values". The warning is silenced where the saved state has exactly the keys the
    scheduler's own state has (the restore is exact); any other mismatch still warns."""
    own = scheduler.state_dict() if isinstance(scheduler, paddle.optimizer.lr.LRScheduler) else None
    if not isinstance(saved, Mapping) or own is None or set(saved) != set(own):
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="There are some unused values in state_dict")
        yield
