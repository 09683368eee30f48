"""Callbacks: the hook contract and the built-in callbacks."""
from .base import Callback, StepOutput, metric_improved
from .early_stopping import EarlyStopping
from .lr_monitor import LearningRateMonitor
from .progress import ProgressBar
from .visualdl import VisualDLLogger

# ModelCheckpoint (checkpoint.py) is exported here by the trainer author.

__all__ = [
    "Callback",
    "StepOutput",
    "metric_improved",
    "EarlyStopping",
    "LearningRateMonitor",
    "ProgressBar",
    "VisualDLLogger",
]
