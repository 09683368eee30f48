"""Pretrained weights: sources (local, ``vision:``, ``paddleclas:``, ``hub:``), name conversion, the load report.

:func:`paddletrain.models.load_pretrained` is the entry point; the modules here each do one step of it.
"""
from __future__ import annotations

from .adapt import adapt_input_conv
from .mapping import SCHEMES, Conversion, convert_state
from .report import LoadReport, PretrainedLoadError
from .sources import WeightsInfo, describe, hub_module_dir, read_state_dict, read_weights, weights_cache_dir

__all__ = [
    "SCHEMES",
    "Conversion",
    "LoadReport",
    "PretrainedLoadError",
    "WeightsInfo",
    "adapt_input_conv",
    "convert_state",
    "describe",
    "hub_module_dir",
    "read_state_dict",
    "read_weights",
    "weights_cache_dir",
]
