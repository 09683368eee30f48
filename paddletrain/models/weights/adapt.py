"""Fit a pretrained first-conv weight to another number of input channels (as timm's ``adapt_input_conv``)."""
from __future__ import annotations

import math

import numpy as np

__all__ = ["adapt_input_conv"]


def adapt_input_conv(weight: np.ndarray, in_chans: int) -> tuple[np.ndarray, str]:
    """Return ``weight`` ``[out, C, kh, kw]`` reshaped for ``in_chans`` inputs, and how it was done.

    * one channel: the filters are summed over the ``C`` input channels, so a grey image ``g`` gives the
      response the RGB model gives to ``(g, g, g)``;
    * other counts: the ``C`` channels are repeated until ``in_chans`` and scaled by ``C / in_chans``, so
      the response's magnitude stays that of the original conv.

    Raises:
        ValueError: ``weight`` is not 4-D or ``in_chans`` < 1.
    """
    if weight.ndim != 4:
        raise ValueError(f"expected a 4-D conv weight [out, in, kh, kw], got shape {list(weight.shape)}")
    if in_chans < 1:
        raise ValueError(f"in_chans must be >= 1, got {in_chans}")
    source_chans = weight.shape[1]
    if in_chans == source_chans:
        return weight, "unchanged"
    dtype = weight.dtype
    if in_chans == 1:
        return weight.astype(np.float32).sum(axis=1, keepdims=True).astype(dtype), f"summed {source_chans} -> 1"
    repeats = math.ceil(in_chans / source_chans)
    tiled = np.tile(weight.astype(np.float32), (1, repeats, 1, 1))[:, :in_chans]
    scaled = tiled * (source_chans / in_chans)
    return scaled.astype(dtype), f"repeated {source_chans} -> {in_chans}, scaled by {source_chans}/{in_chans}"
