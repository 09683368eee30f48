"""Batch-level Mixup and CutMix with soft targets, drawing from a generator whose state is checkpointed.

Mixup (Zhang et al., 2018, "mixup: Beyond empirical risk minimization") blends two images with weight
``lam ~ Beta(alpha, alpha)``; CutMix (Yun et al., 2019, "CutMix: Regularization strategy to train strong
classifiers with localizable features") pastes a box of area ``(1 - lam) * H * W`` from one image into the
other. The target is ``lam * y_a + (1 - lam) * y_b`` with label-smoothed one-hot vectors ``y``. The options
are timm's ``Mixup``:

- ``mode="batch"``: one draw (mixup or cutmix, lam, box) for the whole batch; ``"pair"``: one per pair of
  samples; ``"elem"``: one per sample. Sample ``i`` is always mixed with sample ``B - 1 - i`` of the
  unmixed batch (the batch is already shuffled); in an odd batch the middle sample pairs with itself and so
  stays as it is, with its own target.
- ``prob``: chance that a draw mixes at all; ``switch_prob``: chance of CutMix rather than Mixup when both
  alphas are positive.
- ``correct_lam``: after the box is clipped to the image, lam becomes ``1 - box area / image area``, so the
  target matches the pixels (always so with ``cutmix_minmax``, whose box sizes are drawn directly).

Use in a training step (images are paddle tensors on the device, labels class indices)::

    mixup = Mixup(num_classes=1000, mixup_alpha=0.2, cutmix_alpha=1.0, label_smoothing=0.1, seed=seed, rank=rank)
    images, targets = mixup(images, labels)        # targets: float32 [B, num_classes], rows sum to 1
    loss = (-targets * F.log_softmax(model(images), axis=-1)).sum(-1).mean()   # soft-target cross-entropy

Multi-label batches: ``labels`` may be multi-hot rows (float ``[B, num_classes]``); the targets are then
``lam * y_a + (1 - lam) * y_b`` of the rows themselves, so a class present in either image keeps a weight. Their
label smoothing belongs to the multi-label loss (:func:`paddletrain.losses.smooth_multi_hot`, linear, so it may
come after the mixing), and a Mixup with ``label_smoothing`` refuses multi-hot rows.

Every draw comes from the object's own numpy ``Generator`` (seeded from ``(seed, rank)``), never from the
global generators the loader reseeds, and :meth:`Mixup.state_dict` / :meth:`Mixup.load_state_dict` save and
restore it, so a resumed run draws the same lam and boxes as an uninterrupted one. Each rank has its own
stream: save every rank's state, as the trainer does for its RNGs.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import paddle

from paddletrain.config import MIX_MODES
from paddletrain.errors import ConfigError, UserError


@dataclass
class MixParams:
    """The random draws for one batch, one row per sample (sample i is mixed with sample B - 1 - i).

    Attributes:
        lam: weight of each sample's own label in its target (after the CutMix area correction).
        blend: weight of each sample's own pixels outside its box: lam for Mixup, 1 for CutMix or no mixing.
        boxes: CutMix box ``(top, bottom, left, right)`` per sample, half-open; empty (top == bottom) if none.
    """

    lam: np.ndarray
    blend: np.ndarray
    boxes: np.ndarray

    def mask(self, height: int, width: int) -> np.ndarray:
        """Boolean ``[B, 1, H, W]``: True where a sample shows its partner's pixels."""
        return _box_mask(self.boxes, height, width)


def _box_mask(boxes: np.ndarray, height: int, width: int) -> np.ndarray:
    rows, cols = np.arange(height), np.arange(width)
    top, bottom, left, right = (boxes[:, k, None] for k in range(4))
    in_rows = (rows >= top) & (rows < bottom)
    in_cols = (cols >= left) & (cols < right)
    return (in_rows[:, :, None] & in_cols[:, None, :])[:, None]


class Mixup:
    """Mixup and CutMix on a batch, returning mixed images and soft targets.

    Args:
        num_classes: classes of the soft targets.
        mixup_alpha: Beta(alpha, alpha) for Mixup; 0 disables Mixup.
        cutmix_alpha: Beta(alpha, alpha) for CutMix; 0 disables CutMix.
        cutmix_minmax: (min, max) box side as a fraction of the image side, drawn uniformly per side instead
            of from lam (enables CutMix; lam then always comes from the box area).
        prob: probability that a draw (per batch, pair or sample) mixes.
        switch_prob: probability of CutMix rather than Mixup when both are enabled.
        mode: "batch", "pair" or "elem": one draw per batch, per pair of samples, or per sample.
        correct_lam: set CutMix's lam to the pasted area after clipping the box to the image.
        label_smoothing: eps of the smoothed one-hot targets (1 - eps + eps / C on the class, eps / C else).
        seed, rank: seed the generator from (seed, rank), so that ranks draw differently.

    ``enabled = False`` turns mixing off (timm's ``mixup_off_epoch``): images pass through unchanged and the
    targets are the smoothed one-hot labels.
    """

    def __init__(self, num_classes: int, mixup_alpha: float = 1.0, cutmix_alpha: float = 0.0,
                 cutmix_minmax: tuple[float, float] | None = None, prob: float = 1.0, switch_prob: float = 0.5,
                 mode: str = "batch", correct_lam: bool = True, label_smoothing: float = 0.1, seed: int = 0,
                 rank: int = 0) -> None:
        self.check_options(num_classes, mixup_alpha, cutmix_alpha, cutmix_minmax, prob, switch_prob, mode,
                           label_smoothing)
        if cutmix_minmax is not None:
            cutmix_minmax = tuple(float(v) for v in cutmix_minmax)
            cutmix_alpha = cutmix_alpha or 1.0  # only decides how often CutMix is picked; the box ignores lam
        self.num_classes = int(num_classes)
        self.mixup_alpha = float(mixup_alpha)
        self.cutmix_alpha = float(cutmix_alpha)
        self.cutmix_minmax = cutmix_minmax
        self.prob = float(prob)
        self.switch_prob = float(switch_prob)
        self.mode = mode
        self.correct_lam = bool(correct_lam)
        self.label_smoothing = float(label_smoothing)
        self.enabled = True
        self._rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed) % 2**64, int(rank)])))

    @staticmethod
    def check_options(num_classes: int, mixup_alpha: float, cutmix_alpha: float,
                      cutmix_minmax: Sequence[float] | None, prob: float, switch_prob: float, mode: str,
                      label_smoothing: float) -> None:
        """Raise :class:`ConfigError` (``mixup.<option>=...``) for options a mixer cannot work with."""
        if int(num_classes) != num_classes or num_classes < 1:
            raise ConfigError(f"mixup.num_classes={num_classes} must be a whole number >= 1")
        for key, value in (("mixup_alpha", mixup_alpha), ("cutmix_alpha", cutmix_alpha)):
            if not value >= 0:
                raise ConfigError(f"mixup.{key}={value} must be >= 0 (0 disables it)")
        for key, value in (("prob", prob), ("switch_prob", switch_prob)):
            if not 0 <= value <= 1:
                raise ConfigError(f"mixup.{key}={value} must be between 0 and 1")
        if not 0 <= label_smoothing < 1:
            raise ConfigError(f"mixup.label_smoothing={label_smoothing} must be in [0, 1)")
        if mode not in MIX_MODES:
            raise ConfigError(f"mixup.mode={mode!r} is not supported; valid values: {', '.join(MIX_MODES)}")
        if cutmix_minmax is not None:
            minmax = [float(v) for v in cutmix_minmax]
            if len(minmax) != 2 or not 0 < minmax[0] <= minmax[1] <= 1:
                raise ConfigError(f"mixup.cutmix_minmax={minmax} must be [min, max] with 0 < min <= max <= 1")
        elif mixup_alpha == 0 and cutmix_alpha == 0:
            raise ConfigError("mixup: mixup_alpha and cutmix_alpha are both 0; enable one (or don't use Mixup)")

    @staticmethod
    def enabled(cfg: Any) -> bool:
        """Whether ``data.mixup`` (a :class:`~paddletrain.config.MixupConfig`) mixes at all."""
        return cfg is not None and bool(cfg.mixup_alpha or cfg.cutmix_alpha or cfg.cutmix_minmax is not None)

    @classmethod
    def check_config(cls, cfg: Any, label_smoothing: float = 0.0) -> None:
        """Check ``data.mixup`` without building the mixer: every problem names ``data.mixup.<option>``."""
        if not cls.enabled(cfg):
            return
        try:
            cls.check_options(1, float(cfg.mixup_alpha), float(cfg.cutmix_alpha), cfg.cutmix_minmax,
                              float(cfg.prob), float(cfg.switch_prob), str(cfg.mode), float(label_smoothing))
        except ConfigError as exc:
            raise ConfigError(str(exc).replace("mixup.", "data.mixup.", 1)) from None

    @classmethod
    def from_config(cls, cfg: Any, num_classes: int, label_smoothing: float = 0.0, seed: int = 0,
                    rank: int = 0) -> Mixup | None:
        """The mixer ``data.mixup`` (a :class:`~paddletrain.config.MixupConfig`) describes, or None when it is
        off (both alphas 0 and no ``cutmix_minmax``). ``label_smoothing`` is ``loss.label_smoothing``."""
        if not cls.enabled(cfg):
            return None
        minmax = None if cfg.cutmix_minmax is None else tuple(float(v) for v in cfg.cutmix_minmax)
        return cls(num_classes, mixup_alpha=float(cfg.mixup_alpha), cutmix_alpha=float(cfg.cutmix_alpha),
                   cutmix_minmax=minmax, prob=float(cfg.prob), switch_prob=float(cfg.switch_prob), mode=str(cfg.mode),
                   correct_lam=bool(cfg.correct_lam), label_smoothing=float(label_smoothing), seed=seed, rank=rank)

    # ------------------------------------------------------------------------------------------ draws
    def draw(self, batch_size: int, height: int, width: int) -> MixParams:
        """Draw the mixing of one batch of ``batch_size`` images of ``height`` x ``width`` pixels."""
        draws = {"batch": 1, "pair": (batch_size + 1) // 2, "elem": batch_size}[self.mode]
        rng = self._rng
        # A fixed sequence of draws whatever their outcome, so the stream position depends only on the batch.
        if self.mixup_alpha > 0 and self.cutmix_alpha > 0:
            use_cutmix = rng.random(draws) < self.switch_prob
        else:
            use_cutmix = np.full(draws, self.cutmix_alpha > 0)
        lam_cutmix = rng.beta(self.cutmix_alpha, self.cutmix_alpha, draws) if self.cutmix_alpha > 0 else None
        lam_mixup = rng.beta(self.mixup_alpha, self.mixup_alpha, draws) if self.mixup_alpha > 0 else None
        lam = np.where(use_cutmix, lam_cutmix if lam_cutmix is not None else 1.0,
                       lam_mixup if lam_mixup is not None else 1.0)
        mixes = rng.random(draws) < self.prob
        lam = np.where(mixes, lam, 1.0)
        use_cutmix &= mixes
        boxes = self._boxes(lam, height, width)
        boxes[~use_cutmix] = 0
        if self.correct_lam or self.cutmix_minmax is not None:
            area = (boxes[:, 1] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 2])
            lam = np.where(use_cutmix, 1.0 - area / float(height * width), lam)
        blend = np.where(use_cutmix, 1.0, lam)
        # Draw k serves samples k and B - 1 - k in pair mode, sample k in elem mode, all in batch mode.
        index = np.minimum(np.arange(batch_size), np.arange(batch_size)[::-1]) if self.mode == "pair" else (
            np.zeros(batch_size, int) if self.mode == "batch" else np.arange(batch_size))
        return MixParams(lam=lam[index], blend=blend[index], boxes=boxes[index])

    def _boxes(self, lam: np.ndarray, height: int, width: int) -> np.ndarray:
        """One box per draw, ``(top, bottom, left, right)`` clipped to the image."""
        n = len(lam)
        if self.cutmix_minmax is not None:
            low, high = self.cutmix_minmax
            cut_h = self._rng.integers(int(height * low), int(height * high) + 1, n)
            cut_w = self._rng.integers(int(width * low), int(width * high) + 1, n)
            top = self._rng.integers(0, height - cut_h + 1)
            left = self._rng.integers(0, width - cut_w + 1)
            return np.stack([top, top + cut_h, left, left + cut_w], axis=1)
        # CutMix's definition: sides sqrt(1 - lam) of the image's, centred uniformly, clipped to the image.
        ratio = np.sqrt(1.0 - lam)
        cut_h, cut_w = (height * ratio).astype(np.int64), (width * ratio).astype(np.int64)
        centre_y = self._rng.integers(0, height, n)
        centre_x = self._rng.integers(0, width, n)
        top, left = centre_y - cut_h // 2, centre_x - cut_w // 2
        return np.stack([np.clip(top, 0, height), np.clip(top + cut_h, 0, height),
                         np.clip(left, 0, width), np.clip(left + cut_w, 0, width)], axis=1)

    # ------------------------------------------------------------------------------------------ apply
    def __call__(self, images: paddle.Tensor, labels: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        """Mix a batch: ``images`` ``[B, C, H, W]`` and class-index ``labels`` ``[B]`` -> (images, targets)."""
        if images.ndim != 4:
            raise ValueError(f"Mixup expects NCHW images, got shape {list(images.shape)}")
        batch, _, height, width = images.shape
        if not self.enabled:
            return images, self.targets(labels)
        return self.apply(images, labels, self.draw(batch, height, width))

    def apply(self, images: paddle.Tensor, labels: paddle.Tensor,
              params: MixParams) -> tuple[paddle.Tensor, paddle.Tensor]:
        """Mix ``images`` and build the targets as ``params`` says (no random draws)."""
        batch, _, height, width = images.shape
        if not isinstance(labels, paddle.Tensor):
            labels = paddle.to_tensor(np.asarray(labels))
        if labels.ndim != 2:
            labels = labels.reshape([-1])
        if labels.shape[0] != batch:
            raise ValueError(f"Mixup got {batch} images but {labels.shape[0]} labels")
        partner = paddle.flip(images, axis=[0])
        # One draw for the whole batch (mode "batch"): broadcast one row instead of sending B to the device.
        rows = slice(0, 1) if (np.all(params.blend == params.blend[0])
                              and np.all(params.boxes == params.boxes[0])) else slice(None)
        mixed = images
        if np.any(params.blend != 1.0):
            weight = paddle.to_tensor(params.blend[rows].reshape(-1, 1, 1, 1), dtype=images.dtype)
            mixed = images * weight + partner * (1.0 - weight)
        if np.any(params.boxes[:, 0] < params.boxes[:, 1]):
            mask = paddle.to_tensor(_box_mask(params.boxes[rows], height, width))
            mixed = paddle.where(mask, partner, mixed)
        targets = self.targets(labels)
        lam = paddle.to_tensor(params.lam.reshape(-1, 1), dtype=targets.dtype)
        return mixed, targets * lam + paddle.flip(targets, axis=[0]) * (1.0 - lam)

    def targets(self, labels: paddle.Tensor) -> paddle.Tensor:
        """The unmixed float32 ``[B, num_classes]`` targets: :meth:`smooth_one_hot` of class indices, or multi-hot
        rows ``[B, num_classes]`` as they are (see the module notes on their smoothing)."""
        if not isinstance(labels, paddle.Tensor):
            labels = paddle.to_tensor(np.asarray(labels))
        if labels.ndim != 2 or not paddle.is_floating_point(labels):  # class indices, [B] or [B, 1]
            return self.smooth_one_hot(labels)
        if labels.shape[1] != self.num_classes:
            raise ValueError(f"Mixup got multi-hot rows of {labels.shape[1]} classes, not {self.num_classes}")
        if self.label_smoothing:
            raise ValueError(f"Mixup(label_smoothing={self.label_smoothing}) got multi-hot rows: their smoothing "
                             "belongs to the multi-label loss (paddletrain.losses.smooth_multi_hot); use "
                             "label_smoothing=0 here")
        return labels.astype("float32")

    def smooth_one_hot(self, labels: paddle.Tensor) -> paddle.Tensor:
        """float32 ``[B, num_classes]``: 1 - eps + eps / C on the label, eps / C elsewhere."""
        if not isinstance(labels, paddle.Tensor):
            labels = paddle.to_tensor(np.asarray(labels))
        off = self.label_smoothing / self.num_classes
        one_hot = paddle.nn.functional.one_hot(labels.reshape([-1]).astype("int64"), self.num_classes)
        return one_hot.astype("float32") * (1.0 - self.label_smoothing) + off

    # ------------------------------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """The generator's position (plain ints and strings), to store in a checkpoint."""
        return {"bit_generator": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the stream saved by :meth:`state_dict`; anything but a saved PCG64 state is refused."""
        saved = state.get("bit_generator") if isinstance(state, dict) else None
        inner = saved.get("state") if isinstance(saved, dict) else None
        if (not isinstance(saved, dict) or saved.get("bit_generator") != "PCG64" or not isinstance(inner, dict)
                or not all(isinstance(inner.get(k), int) for k in ("state", "inc"))
                or not all(isinstance(saved.get(k), int) for k in ("has_uint32", "uinteger"))):
            raise UserError(f"the saved Mixup state is not a PCG64 generator state: {str(state)[:200]}")
        self._rng.bit_generator.state = {"bit_generator": "PCG64", "state": {"state": inner["state"],
                                         "inc": inner["inc"]}, "has_uint32": saved["has_uint32"],
                                         "uinteger": saved["uinteger"]}

    def __repr__(self) -> str:
        return (f"Mixup(mixup_alpha={self.mixup_alpha}, cutmix_alpha={self.cutmix_alpha}, "
                f"cutmix_minmax={self.cutmix_minmax}, prob={self.prob}, switch_prob={self.switch_prob}, "
                f"mode={self.mode!r}, correct_lam={self.correct_lam}, label_smoothing={self.label_smoothing}, "
                f"num_classes={self.num_classes})")
