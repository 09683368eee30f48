"""Layers shared by the model families."""
from __future__ import annotations

import paddle
import paddle.nn as nn

__all__ = ["DropPath", "drop_path", "drop_path_rates"]


def drop_path(x: paddle.Tensor, drop_prob: float = 0.0, training: bool = False) -> paddle.Tensor:
    """Stochastic depth per sample (Huang et al. 2016, "Deep Networks with Stochastic Depth").

    In training each sample of the batch is zeroed with probability ``drop_prob`` and the kept ones are
    scaled by ``1 / (1 - drop_prob)``, so the expected value is unchanged; in evaluation it is the identity.
    Applied to a residual branch, it drops the whole block for that sample. The draws come from Paddle's
    generator, like dropout's, so a checkpoint's RNG state makes them resume exactly.
    """
    if drop_prob == 0.0 or not training:
        return x
    keep_prob = 1.0 - drop_prob
    # One draw per sample, broadcast over every other axis (so the same code serves NCHW, NHWC and tokens).
    shape = [x.shape[0]] + [1] * (x.ndim - 1)
    keep = (paddle.rand(shape, dtype="float32") < keep_prob).astype(x.dtype)
    return x * (keep / keep_prob)


def drop_path_rates(drop_path_rate: float, num_blocks: int) -> list[float]:
    """The linear decay rule of Huang et al.: block ``i`` of ``n`` drops with ``rate * i / (n - 1)``.

    The first block never drops and the last drops with ``drop_path_rate`` (as timm's ResNet).
    """
    if num_blocks <= 1:
        return [0.0] * num_blocks
    return [drop_path_rate * i / (num_blocks - 1) for i in range(num_blocks)]


class DropPath(nn.Layer):
    """:func:`drop_path` as a layer: drops the residual branch per sample in training, identity in eval."""

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= drop_prob < 1.0:
            raise ValueError(f"drop_prob must be in [0, 1), got {drop_prob!r}")
        self.drop_prob = float(drop_prob)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        return drop_path(x, self.drop_prob, self.training)

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob:.3f}"
