"""Test-time augmentation: a classifier evaluated on several views of each image, its predictions averaged.

``TestTimeAugmentation(model, flip=True, crops=5, crop_size=224)`` is a layer whose output, for a batch of
images, is ``log(weighted mean over views of softmax(model(view)))``: logits whose softmax is the averaged
prediction, so the usual cross-entropy and top-k metrics apply unchanged. Views are the image itself (or,
with ``crops=5``, its four corner crops and its centre crop of ``crop_size``, as torchvision's ``FiveCrop``
takes them), each also horizontally flipped with ``flip``. ``translate=t`` adds each of those shifted by ``t``
pixels up-left and down-right (the edge reflected into the gap), which share ``translate_weight`` of the
prediction (airbench94's "TTA level 2": 1 pixel, half the weight). Averaging probabilities rather than logits is
what PaddleClas and timm's inference scripts do for flip and multi-crop evaluation.

For multi-crop the loader must hand over more than the crop: ``paddletrain.evaluate`` then builds its eval
transform with ``crop=False`` (the centred square of side ``data.eval_resize``), and the crops are taken here.
"""
from __future__ import annotations

from typing import Any

import paddle
import paddle.nn.functional as F

CROPS = (1, 5)


def five_crops(images: paddle.Tensor, size: int) -> list[paddle.Tensor]:
    """Top-left, top-right, bottom-left, bottom-right and centre ``size`` x ``size`` crops of NCHW ``images``."""
    height, width = int(images.shape[-2]), int(images.shape[-1])
    if size > min(height, width):
        raise ValueError(f"a {size}-pixel crop does not fit images of {height}x{width}")
    top, left = (height - size) // 2, (width - size) // 2
    corners = [(0, 0), (0, width - size), (height - size, 0), (height - size, width - size), (top, left)]
    return [images[:, :, y:y + size, x:x + size] for y, x in corners]


class TestTimeAugmentation(paddle.nn.Layer):
    """Average ``model``'s softmax over flipped and/or cropped views; see the module docstring.

    Args:
        model: the classifier.
        flip: add the horizontal mirror of every view.
        crops: 1 (the image as given) or 5 (corner and centre crops of ``crop_size``).
        crop_size: side of the crops; required with ``crops=5``.
        translate: pixels of the two shifted copies of every view (0: none).
        translate_weight: the shifted views' share of the prediction (the others share the rest).
    """

    __test__ = False  # not a pytest test class, despite its name

    @classmethod
    def around(cls, model: paddle.nn.Layer, tta: Any, crop_size: int) -> TestTimeAugmentation | None:
        """``model`` behind the views ``tta`` asks for (a ``TTAConfig`` or its keys; ``crop_size``: the evaluation
        image size), or None when it asks for one view only."""
        layer = cls(model, flip=tta["flip"], crops=tta["crops"], crop_size=crop_size, translate=tta["translate"],
                    translate_weight=tta["translate_weight"])
        return layer if layer.active else None

    def __init__(self, model: paddle.nn.Layer, flip: bool = False, crops: int = 1,
                 crop_size: int | None = None, translate: int = 0, translate_weight: float = 0.5) -> None:
        super().__init__()
        if crops not in CROPS:
            raise ValueError(f"tta.crops={crops} is not supported; choose one of: {', '.join(map(str, CROPS))}")
        if crops > 1 and not crop_size:
            raise ValueError("tta.crops=5 needs the crop size (data.image_size)")
        if translate < 0 or not 0 <= translate_weight <= 1:
            raise ValueError(f"tta.translate={translate} must be >= 0 and tta.translate_weight={translate_weight} "
                             "in [0, 1]")
        self.model = model
        self.flip = bool(flip)
        self.crops = crops
        self.crop_size = crop_size
        self.translate = int(translate)
        self.translate_weight = float(translate_weight) if translate else 0.0

    @property
    def active(self) -> bool:
        """Whether it runs more than the one view the model would."""
        return self.flip or self.crops > 1 or self.translate > 0

    def weighted_views(self, images: paddle.Tensor) -> list[tuple[paddle.Tensor, float]]:
        """Every view of ``images`` the prediction averages over, in a fixed order, with its weight (summing to 1)."""
        views = five_crops(images, self.crop_size) if self.crops > 1 else [images]
        if self.flip:
            views += [paddle.flip(view, axis=[3]) for view in views]
        if not self.translate:
            return [(view, 1.0 / len(views)) for view in views]
        shifted = [shift(view, dy, dx) for view in views for dy, dx in ((-self.translate,) * 2, (self.translate,) * 2)]
        base = (1.0 - self.translate_weight) / len(views)
        return [(view, base) for view in views] + [(view, self.translate_weight / len(shifted)) for view in shifted]

    def views(self, images: paddle.Tensor) -> list[paddle.Tensor]:
        """Every view of ``images`` the prediction averages over, in a fixed order."""
        return [view for view, _ in self.weighted_views(images)]

    def forward(self, images: paddle.Tensor) -> paddle.Tensor:
        probs = sum(weight * F.softmax(self.model(view).astype("float32"), axis=-1)
                    for view, weight in self.weighted_views(images))
        return paddle.log(paddle.clip(probs, min=1e-12))  # a class no view believes in stays finite


def shift(images: paddle.Tensor, dy: int, dx: int) -> paddle.Tensor:
    """NCHW ``images`` moved ``dy`` pixels down and ``dx`` right (negative: up, left), the edge reflected into the
    gap, the size kept."""
    pad = max(abs(dy), abs(dx))
    height, width = int(images.shape[-2]), int(images.shape[-1])
    padded = F.pad(images, [pad, pad, pad, pad], mode="reflect")
    top, left = pad - dy, pad - dx
    return padded[:, :, top:top + height, left:left + width]
