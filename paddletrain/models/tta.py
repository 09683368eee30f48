"""Test-time augmentation: a classifier evaluated on several views of each image, its predictions averaged.

``TestTimeAugmentation(model, flip=True, crops=5, crop_size=224)`` is a layer whose output, for a batch of
images, is ``log(mean over views of softmax(model(view)))``: logits whose softmax is the averaged
prediction, so the usual cross-entropy and top-k metrics apply unchanged. Views are the image itself (or,
with ``crops=5``, its four corner crops and its centre crop of ``crop_size``, as torchvision's ``FiveCrop``
takes them), each also horizontally flipped with ``flip``. Averaging probabilities rather than logits is
what PaddleClas and timm's inference scripts do for flip and multi-crop evaluation.

For multi-crop the loader must hand over more than the crop: ``paddletrain.evaluate`` then builds its eval
transform with ``crop=False`` (the centred square of side ``data.eval_resize``), and the crops are taken here.
"""
from __future__ import annotations

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
    """

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, model: paddle.nn.Layer, flip: bool = False, crops: int = 1,
                 crop_size: int | None = None) -> None:
        super().__init__()
        if crops not in CROPS:
            raise ValueError(f"tta.crops={crops} is not supported; choose one of: {', '.join(map(str, CROPS))}")
        if crops > 1 and not crop_size:
            raise ValueError("tta.crops=5 needs the crop size (data.image_size)")
        self.model = model
        self.flip = bool(flip)
        self.crops = crops
        self.crop_size = crop_size

    def views(self, images: paddle.Tensor) -> list[paddle.Tensor]:
        """Every view of ``images`` the prediction averages over, in a fixed order."""
        views = five_crops(images, self.crop_size) if self.crops > 1 else [images]
        if self.flip:
            views += [paddle.flip(view, axis=[3]) for view in views]
        return views

    def forward(self, images: paddle.Tensor) -> paddle.Tensor:
        views = self.views(images)
        probs = sum(F.softmax(self.model(view).astype("float32"), axis=-1) for view in views) / len(views)
        return paddle.log(paddle.clip(probs, min=1e-12))  # a class no view believes in stays finite
