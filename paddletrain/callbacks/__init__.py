"""The built-in callbacks; the hook contract they implement is :mod:`paddletrain.engine.callback` (its names are
handed on here too)."""
from __future__ import annotations

from paddletrain.engine.callback import Callback, CheckpointCallback, StepOutput, metric_improved

from .checkpoint import ModelCheckpoint
from .early_stopping import EarlyStopping
from .ema import ModelEMA
from .finetune import BackboneFreeze, FreezeBatchNorm
from .history import MetricsHistory
from .lr_monitor import LearningRateMonitor
from .profiler import ProfilerCallback
from .progress import ProgressBar
from .visualdl import VisualDLLogger

__all__ = [
    "Callback",
    "CheckpointCallback",
    "StepOutput",
    "metric_improved",
    "BackboneFreeze",
    "EarlyStopping",
    "FreezeBatchNorm",
    "LearningRateMonitor",
    "MetricsHistory",
    "ModelCheckpoint",
    "ModelEMA",
    "ProfilerCallback",
    "ProgressBar",
    "VisualDLLogger",
]
