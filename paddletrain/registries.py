"""Every extension point of paddletrain, one :class:`~paddletrain.registry.Registry` each.

This module imports nothing that registers into it, so any module may import it without a cycle. The
built-in entries register themselves when their modules are imported (``paddletrain.builtins`` imports them
all); a downstream package registers its own the same way (see :mod:`paddletrain.registry` for plugins).

What each registry holds (the factory's call signature):

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

from typing import Any

from paddletrain.registry import Registry

MODELS: Registry[Any] = Registry("model", "model.name", listing="paddletrain.models.list_models()")
DATASETS: Registry[Any] = Registry("dataset", "data.name", listing="paddletrain.data.list_datasets()")
OPTIMIZERS: Registry[Any] = Registry("optimizer", "optim.name")
SCHEDULERS: Registry[Any] = Registry("scheduler", "sched.name")
LOSSES: Registry[Any] = Registry("loss", "loss.name")
AUGMENTATIONS: Registry[Any] = Registry("augmentation", "data.augment")
CALLBACKS: Registry[Any] = Registry("callback", "callbacks")
