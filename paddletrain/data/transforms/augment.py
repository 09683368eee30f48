"""Per-image augmentation policies: RandAugment, AutoAugment, TrivialAugment and RandomErasing.

Every class here is registered in :data:`paddletrain.registry.AUGMENTATIONS` and built with keyword options.
Each one says where it runs in the transform pipeline through its ``stage`` attribute:

- ``"image"``: a PIL image ("RGB" or "L") in, a PIL image of the same size and mode out; it runs after the
  crop and flip and before :class:`~paddletrain.data.transforms.presets.ToNormalizedArray` (RandAugment,
  AutoAugment, TrivialAugment).
- ``"array"``: a normalised float32 CHW array in and out; it runs after ``ToNormalizedArray``
  (RandomErasing, as in timm: erasing with zeros then means "the dataset mean", and the random fills are
  drawn from the normalised pixels' distribution).

All random draws come from python ``random`` and ``numpy.random``, which the loader reseeds per batch from
(seed, epoch, rank, batch) (see :class:`~paddletrain.data.loading.loaders.SeededDataset`), so augmentation is
identical for any worker count and after a resume.

The image operations are PIL primitives: paddle.vision has no posterize, solarize, equalize, autocontrast,
invert or sharpness, and its ``affine`` shears by an angle about the image centre rather than by the
papers' shear factor about the origin. (paddle.vision's own PIL backend calls the same primitives.)

Magnitudes
----------
An operation's strength is a *level* in [0, 1] (beyond 1 only with ``magnitude_max > 10``), mapped to its
argument by a *magnitude space* (:data:`MAGNITUDE_SPACES`): ``rand`` is timm's RandAugment space
(``rand-m9-n2``), ``rand_increasing`` timm's ``inc1`` variant (used by the "ResNet strikes back" recipes),
``original`` the AutoAugment paper's ranges (posterize keeps 4..8 bits) and ``wide`` TrivialAugment's.
RandAugment and AutoAugment use the 0..10 magnitude scale of the AutoAugment authors' code and timm (level =
magnitude / 10); TrivialAugment draws one of 31 bins (level = bin / 30). Rotate, shear, translate and, in
the increasing and wide spaces, the colour enhancements are negated with probability 1/2. docs/data.md
("Augmentation") tables every range and lists the operations that are not the identity at level 0.
"""
from __future__ import annotations

import functools
import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from PIL import Image, ImageChops, ImageEnhance, ImageOps

from paddletrain.errors import ConfigError
from paddletrain.registry import AUGMENTATIONS

# Magnitude scale of RandAugment/AutoAugment: magnitude 10 is level 1 (the top of the paper's ranges).
MAGNITUDE_SCALE = 10.0

_RESAMPLE = {"nearest": Image.Resampling.NEAREST, "bilinear": Image.Resampling.BILINEAR,
             "bicubic": Image.Resampling.BICUBIC}
INTERPOLATIONS = (*_RESAMPLE, "random")


class _OpContext:
    """What a geometric operation needs besides its argument: the fill colour and the resampling filter."""

    def __init__(self, owner: str, fill: int | Sequence[int], interpolation: str) -> None:
        if interpolation not in INTERPOLATIONS:
            raise ConfigError(f"{owner}.interpolation={interpolation!r} is not supported; valid values: "
                              f"{', '.join(INTERPOLATIONS)}")
        values = [int(fill)] if isinstance(fill, (int, float)) else [int(v) for v in fill]
        if len(values) not in (1, 3) or not all(0 <= v <= 255 for v in values):
            raise ConfigError(f"{owner}.fill={fill!r} must be one grey level or three RGB values in 0..255")
        self.fill_rgb = tuple(values * 3 if len(values) == 1 else values)
        # The grey level PIL's own RGB -> L conversion gives that colour (ITU-R 601-2 luma).
        red, green, blue = self.fill_rgb
        self.fill_l = round((299 * red + 587 * green + 114 * blue) / 1000)
        self.interpolation = interpolation

    def fill(self, image: Image.Image) -> int | tuple[int, ...]:
        return self.fill_l if image.mode == "L" else self.fill_rgb

    def resample(self) -> Image.Resampling:
        # timm's default: bilinear or bicubic at random per operation.
        if self.interpolation == "random":
            return random.choice((Image.Resampling.BILINEAR, Image.Resampling.BICUBIC))
        return _RESAMPLE[self.interpolation]


# ---------------------------------------------------------------------------------------------- operations
# Each takes (image, argument, context); the argument comes from a magnitude space below.

def _affine(image: Image.Image, coeffs: tuple[float, ...], ctx: _OpContext) -> Image.Image:
    return image.transform(image.size, Image.Transform.AFFINE, coeffs, resample=ctx.resample(),
                           fillcolor=ctx.fill(image))


def _rotate(image: Image.Image, degrees: float, ctx: _OpContext) -> Image.Image:
    return image.rotate(degrees, resample=ctx.resample(), fillcolor=ctx.fill(image))


def _shear_x(image: Image.Image, factor: float, ctx: _OpContext) -> Image.Image:
    return _affine(image, (1, factor, 0, 0, 1, 0), ctx)


def _shear_y(image: Image.Image, factor: float, ctx: _OpContext) -> Image.Image:
    return _affine(image, (1, 0, 0, factor, 1, 0), ctx)


def _translate_x(image: Image.Image, pixels: float, ctx: _OpContext) -> Image.Image:
    return _affine(image, (1, 0, pixels, 0, 1, 0), ctx)


def _translate_y(image: Image.Image, pixels: float, ctx: _OpContext) -> Image.Image:
    return _affine(image, (1, 0, 0, 0, 1, pixels), ctx)


def _translate_x_rel(image: Image.Image, fraction: float, ctx: _OpContext) -> Image.Image:
    return _translate_x(image, fraction * image.size[0], ctx)


def _translate_y_rel(image: Image.Image, fraction: float, ctx: _OpContext) -> Image.Image:
    return _translate_y(image, fraction * image.size[1], ctx)


def _enhancer(kind: type) -> Callable[[Image.Image, float, _OpContext], Image.Image]:
    def op(image: Image.Image, factor: float, ctx: _OpContext) -> Image.Image:
        return kind(image).enhance(factor)
    return op


# Image.point() first rounds every entry of a python table in python (~0.1 ms at any size, as much as a
# whole 32 px operation), numpy indexing costs per pixel: small images take the numpy route.
_NUMPY_LOOKUP_MAX_PIXELS = 96 * 96


def _lookup(image: Image.Image, table: np.ndarray) -> Image.Image:
    if image.width * image.height <= _NUMPY_LOOKUP_MAX_PIXELS:
        return Image.fromarray(np.take(table, np.asarray(image)))
    return image.point(table.tolist() * len(image.getbands()))


@functools.cache
def _posterize_table(bits: int) -> np.ndarray:
    mask = (0xFF << (8 - max(bits, 0))) & 0xFF
    return np.arange(256, dtype=np.uint8) & np.uint8(mask)


@functools.cache
def _solarize_table(threshold: int) -> np.ndarray:
    values = np.arange(256)
    return np.where(values < threshold, values, 255 - values).astype(np.uint8)


@functools.cache
def _solarize_add_table(amount: int) -> np.ndarray:
    values = np.arange(256)
    return np.where(values < 128, np.minimum(values + amount, 255), values).astype(np.uint8)


def _posterize(image: Image.Image, bits: int, ctx: _OpContext) -> Image.Image:
    # Keep the `bits` most significant bits; 0 bits (the bottom of timm's range) is black, which
    # ImageOps.posterize refuses.
    return image if bits >= 8 else _lookup(image, _posterize_table(int(bits)))


def _solarize(image: Image.Image, threshold: int, ctx: _OpContext) -> Image.Image:
    # Invert the pixels >= threshold: 256 leaves every pixel, 0 inverts all.
    return _lookup(image, _solarize_table(int(threshold)))


def _solarize_add(image: Image.Image, amount: int, ctx: _OpContext) -> Image.Image:
    # Brighten the dark pixels (below 128) by `amount`, clipped at 255.
    return _lookup(image, _solarize_add_table(int(amount)))


_OPERATIONS: dict[str, Callable[[Image.Image, Any, _OpContext], Image.Image]] = {
    "identity": lambda image, arg, ctx: image,
    "auto_contrast": lambda image, arg, ctx: ImageOps.autocontrast(image),
    "equalize": lambda image, arg, ctx: ImageOps.equalize(image),
    "invert": lambda image, arg, ctx: ImageChops.invert(image),
    "rotate": _rotate,
    "shear_x": _shear_x,
    "shear_y": _shear_y,
    "translate_x": _translate_x_rel,
    "translate_y": _translate_y_rel,
    "translate_x_abs": _translate_x,
    "translate_y_abs": _translate_y,
    "color": _enhancer(ImageEnhance.Color),
    "contrast": _enhancer(ImageEnhance.Contrast),
    "brightness": _enhancer(ImageEnhance.Brightness),
    "sharpness": _enhancer(ImageEnhance.Sharpness),
    "posterize": _posterize,
    "solarize": _solarize,
    "solarize_add": _solarize_add,
}


# ---------------------------------------------------------------------------------------- magnitude spaces
def _signed(value: float) -> float:
    """The papers' ranges are symmetric: negate half of the time."""
    return -value if random.random() < 0.5 else value


def _none(level: float) -> None:
    return None


LevelToArg = Callable[[float], Any]

_COMMON: dict[str, LevelToArg] = {
    "identity": _none,
    "auto_contrast": _none,
    "equalize": _none,
    "invert": _none,
    "rotate": lambda level: _signed(30.0 * level),
    "shear_x": lambda level: _signed(0.3 * level),
    "shear_y": lambda level: _signed(0.3 * level),
    "translate_x": lambda level: _signed(0.45 * level),
    "translate_y": lambda level: _signed(0.45 * level),
    "solarize_add": lambda level: int(110 * level),
}
_ENHANCEMENTS = ("color", "contrast", "brightness", "sharpness")


def _enhance_rand(level: float) -> float:
    return 0.1 + 1.8 * level  # 1.0 (no change) at level 0.5


def _enhance_increasing(level: float) -> float:
    return max(0.1, 1.0 + _signed(0.9 * level))


def _enhance_wide(level: float) -> float:
    return 1.0 + _signed(0.99 * level)


# Space name -> operation name -> (operation key in _OPERATIONS, level -> argument).
MagnitudeSpace = dict[str, tuple[str, LevelToArg]]


def _make_space(enhance: LevelToArg, posterize: LevelToArg, solarize: LevelToArg,
                overrides: dict[str, tuple[str, LevelToArg]] | None = None,
                without: tuple[str, ...] = ()) -> MagnitudeSpace:
    space: MagnitudeSpace = {name: (name, to_arg) for name, to_arg in _COMMON.items() if name not in without}
    space.update({name: (name, enhance) for name in _ENHANCEMENTS})
    space["posterize"] = ("posterize", posterize)
    space["solarize"] = ("solarize", solarize)
    space.update(overrides or {})
    return space


MAGNITUDE_SPACES: dict[str, MagnitudeSpace] = {
    "rand": _make_space(_enhance_rand, lambda level: int(4 * level), lambda level: int(256 * level)),
    "rand_increasing": _make_space(_enhance_increasing, lambda level: 4 - int(4 * level),
                                   lambda level: 256 - int(256 * level)),
    "original": _make_space(_enhance_rand, lambda level: 4 + int(4 * level), lambda level: int(256 * level)),
    "wide": _make_space(_enhance_wide, lambda level: 8 - round(6 * level),
                        lambda level: 256 - int(256 * level), {
                            "rotate": ("rotate", lambda level: _signed(135.0 * level)),
                            "shear_x": ("shear_x", lambda level: _signed(0.99 * level)),
                            "shear_y": ("shear_y", lambda level: _signed(0.99 * level)),
                            "translate_x": ("translate_x_abs", lambda level: _signed(32.0 * level)),
                            "translate_y": ("translate_y_abs", lambda level: _signed(32.0 * level)),
                        }, without=("invert", "solarize_add")),
}


def apply_op(image: Image.Image, name: str, level: float, space: str = "rand", fill: int | Sequence[int] = 128,
             interpolation: str = "bilinear") -> Image.Image:
    """Apply one named operation at ``level`` (0..1, the top of the space's range at 1) in a magnitude space.

    The building block of every policy here, public so that a custom policy (or a test) can apply one
    operation by name. Signs are drawn from python ``random``.
    """
    return _apply(image, name, level, MAGNITUDE_SPACES[space], _OpContext("apply_op", fill, interpolation))


def _apply(image: Image.Image, name: str, level: float, space: MagnitudeSpace, ctx: _OpContext) -> Image.Image:
    key, to_arg = space[name]
    return _OPERATIONS[key](image, to_arg(level), ctx)


def _check_image(owner: str, image: Any) -> None:
    if not isinstance(image, Image.Image) or image.mode not in ("RGB", "L"):
        kind = f"a PIL image of mode {image.mode}" if isinstance(image, Image.Image) else type(image).__name__
        raise TypeError(f"{owner} expects an RGB or L PIL image (run it after ToPILImage), got {kind}")


def _check_ops(owner: str, ops: Sequence[str] | None, default: Sequence[str], space: MagnitudeSpace) -> list[str]:
    if ops is None:
        return list(default)
    ops = [str(op) for op in ops]
    unknown = [op for op in ops if op not in space]
    if unknown or not ops:
        raise ConfigError(f"{owner}.ops={ops!r}: {'unknown ' + ', '.join(unknown) if unknown else 'empty'}; "
                          f"valid operations: {', '.join(sorted(space))}")
    return ops


def _check_range(key: str, value: float, low: float, high: float) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}={value!r} must be a number between {low} and {high}") from None
    if not low <= number <= high:
        raise ConfigError(f"{key}={value} must be between {low} and {high}")
    return number


# ------------------------------------------------------------------------------------------------ policies
# timm's RandAugment operations (Cubuk et al. 2020 list, plus invert and solarize_add, without identity).
RAND_AUGMENT_OPS = ("auto_contrast", "equalize", "invert", "rotate", "posterize", "solarize", "solarize_add",
                    "color", "contrast", "brightness", "sharpness", "shear_x", "shear_y", "translate_x",
                    "translate_y")

# TrivialAugment's operations (Müller & Hutter 2021, Table 1).
TRIVIAL_AUGMENT_OPS = ("identity", "auto_contrast", "equalize", "rotate", "solarize", "color", "posterize",
                       "contrast", "brightness", "sharpness", "shear_x", "shear_y", "translate_x", "translate_y")


@AUGMENTATIONS.register("rand_augment")
class RandAugment:
    """RandAugment (Cubuk et al., 2020, "RandAugment: Practical automated data augmentation with a reduced
    search space") with timm's options: ``rand-m9-n2-mstd0.5`` is the default.

    Per image: ``num_ops`` operations drawn uniformly with replacement from ``ops``; each one runs with
    probability ``prob`` at ``magnitude`` (0..10), plus Gaussian noise of std ``magnitude_std`` drawn per
    operation and clipped to [0, ``magnitude_max``] (``float("inf")``: uniform in [0, magnitude]).

    Args:
        num_ops: operations per image (the paper's N).
        magnitude: the paper's M on the 0..10 scale (10 = the top of each operation's range).
        magnitude_std: per-operation Gaussian noise on the magnitude (timm's ``mstd``); 0 = fixed.
        magnitude_max: upper clip of the noisy magnitude (timm's ``mmax``).
        prob: probability of applying each drawn operation (timm's 0.5; the paper applies always: 1.0).
        increasing: use the severity-increasing ranges (timm's ``inc1``; the RSB recipes), where magnitude 0
            leaves the image unchanged for every operation with a magnitude except posterize.
        ops: operation names (default :data:`RAND_AUGMENT_OPS`).
        fill: colour of the pixels that geometric operations uncover (grey level or RGB).
        interpolation: "nearest", "bilinear", "bicubic" or "random" (bilinear or bicubic per operation).
    """

    stage = "image"

    def __init__(self, num_ops: int = 2, magnitude: float = 9.0, magnitude_std: float = 0.5,
                 magnitude_max: float = MAGNITUDE_SCALE, prob: float = 0.5, increasing: bool = False,
                 ops: Sequence[str] | None = None, fill: int | Sequence[int] = 128,
                 interpolation: str = "bilinear") -> None:
        if int(num_ops) != num_ops or num_ops < 0:
            raise ConfigError(f"rand_augment.num_ops={num_ops} must be a whole number >= 0")
        self.num_ops = int(num_ops)
        self.magnitude_max = _check_range("rand_augment.magnitude_max", magnitude_max, 0.0, math.inf)
        self.magnitude = _check_range("rand_augment.magnitude", magnitude, 0.0, self.magnitude_max)
        self.magnitude_std = _check_range("rand_augment.magnitude_std", magnitude_std, 0.0, math.inf)
        self.prob = _check_range("rand_augment.prob", prob, 0.0, 1.0)
        self.increasing = bool(increasing)
        self.space = MAGNITUDE_SPACES["rand_increasing" if self.increasing else "rand"]
        self.ops = _check_ops("rand_augment", ops, RAND_AUGMENT_OPS, self.space)
        self.ctx = _OpContext("rand_augment", fill, interpolation)

    def _draw_magnitude(self) -> float:
        if self.magnitude_std == math.inf:
            magnitude = random.uniform(0.0, self.magnitude)
        elif self.magnitude_std > 0:
            magnitude = random.gauss(self.magnitude, self.magnitude_std)
        else:
            magnitude = self.magnitude
        return min(max(magnitude, 0.0), self.magnitude_max)

    def __call__(self, image: Image.Image) -> Image.Image:
        _check_image("rand_augment", image)
        for name in random.choices(self.ops, k=self.num_ops):
            if self.prob < 1.0 and random.random() >= self.prob:
                continue
            image = _apply(image, name, self._draw_magnitude() / MAGNITUDE_SCALE, self.space, self.ctx)
        return image

    def __repr__(self) -> str:
        return (f"RandAugment(num_ops={self.num_ops}, magnitude={self.magnitude}, magnitude_std={self.magnitude_std}"
                f", prob={self.prob}, increasing={self.increasing}, ops={len(self.ops)})")


# AutoAugment's ImageNet policy (Cubuk et al. 2019, "AutoAugment: Learning augmentation strategies from
# data", appendix): 25 sub-policies of two (operation, probability, magnitude 0..9) steps each; None marks
# an operation without a magnitude. Posterize uses the paper's range (keep 4..8 bits): the "original" space.
IMAGENET_POLICY: tuple[tuple[tuple[str, float, int | None], ...], ...] = (
    (("posterize", 0.4, 8), ("rotate", 0.6, 9)),
    (("solarize", 0.6, 5), ("auto_contrast", 0.6, None)),
    (("equalize", 0.8, None), ("equalize", 0.6, None)),
    (("posterize", 0.6, 7), ("posterize", 0.6, 6)),
    (("equalize", 0.4, None), ("solarize", 0.2, 4)),
    (("equalize", 0.4, None), ("rotate", 0.8, 8)),
    (("solarize", 0.6, 3), ("equalize", 0.6, None)),
    (("posterize", 0.8, 5), ("equalize", 1.0, None)),
    (("rotate", 0.2, 3), ("solarize", 0.6, 8)),
    (("equalize", 0.6, None), ("posterize", 0.4, 6)),
    (("rotate", 0.8, 8), ("color", 0.4, 0)),
    (("rotate", 0.4, 9), ("equalize", 0.6, None)),
    (("equalize", 0.0, None), ("equalize", 0.8, None)),
    (("invert", 0.6, None), ("equalize", 1.0, None)),
    (("color", 0.6, 4), ("contrast", 1.0, 8)),
    (("rotate", 0.8, 8), ("color", 1.0, 2)),
    (("color", 0.8, 8), ("solarize", 0.8, 7)),
    (("sharpness", 0.4, 7), ("invert", 0.6, None)),
    (("shear_x", 0.6, 5), ("equalize", 1.0, None)),
    (("color", 0.4, 0), ("equalize", 0.6, None)),
    (("equalize", 0.4, None), ("solarize", 0.2, 4)),
    (("solarize", 0.6, 5), ("auto_contrast", 0.6, None)),
    (("invert", 0.6, None), ("equalize", 1.0, None)),
    (("color", 0.6, 4), ("contrast", 1.0, 8)),
    (("equalize", 0.8, None), ("equalize", 0.6, None)),
)

AUTO_AUGMENT_POLICIES = {"imagenet": IMAGENET_POLICY}


@AUGMENTATIONS.register("auto_augment")
class AutoAugment:
    """AutoAugment (Cubuk et al., 2019) with a named learned policy (``"imagenet"``: timm's "original").

    Per image one sub-policy is drawn uniformly; each of its steps runs with its own probability at its
    fixed magnitude (level = magnitude / 10, as in the authors' code and timm).

    Args:
        policy: a name in :data:`AUTO_AUGMENT_POLICIES`.
        fill: colour of the pixels that geometric operations uncover (grey level or RGB).
        interpolation: "nearest", "bilinear", "bicubic" or "random".
    """

    stage = "image"

    def __init__(self, policy: str = "imagenet", fill: int | Sequence[int] = 128,
                 interpolation: str = "bilinear") -> None:
        if policy not in AUTO_AUGMENT_POLICIES:
            raise ConfigError(f"auto_augment.policy={policy!r} is not supported; valid values: "
                              f"{', '.join(AUTO_AUGMENT_POLICIES)}")
        self.policy_name = policy
        self.policy = AUTO_AUGMENT_POLICIES[policy]
        self.space = MAGNITUDE_SPACES["original"]
        self.ctx = _OpContext("auto_augment", fill, interpolation)

    def __call__(self, image: Image.Image) -> Image.Image:
        _check_image("auto_augment", image)
        for name, prob, magnitude in random.choice(self.policy):
            if random.random() < prob:
                image = _apply(image, name, (magnitude or 0) / MAGNITUDE_SCALE, self.space, self.ctx)
        return image

    def __repr__(self) -> str:
        return f"AutoAugment(policy={self.policy_name!r})"


@AUGMENTATIONS.register("trivial_augment")
class TrivialAugment:
    """TrivialAugment "wide" (Müller & Hutter, 2021, "TrivialAugment: Tuning-free yet state-of-the-art data
    augmentation"): one operation drawn uniformly, always applied, at a magnitude bin drawn uniformly.

    Args:
        num_magnitude_bins: magnitude bins; bin b is level b / (bins - 1) (31 in the paper: 0..30).
        ops: operation names (default :data:`TRIVIAL_AUGMENT_OPS`).
        fill: colour of the pixels that geometric operations uncover (grey level or RGB).
        interpolation: "nearest", "bilinear", "bicubic" or "random".
    """

    stage = "image"

    def __init__(self, num_magnitude_bins: int = 31, ops: Sequence[str] | None = None,
                 fill: int | Sequence[int] = 128, interpolation: str = "bilinear") -> None:
        if int(num_magnitude_bins) != num_magnitude_bins or num_magnitude_bins < 2:
            raise ConfigError(f"trivial_augment.num_magnitude_bins={num_magnitude_bins} must be a whole number >= 2")
        self.num_magnitude_bins = int(num_magnitude_bins)
        self.space = MAGNITUDE_SPACES["wide"]
        self.ops = _check_ops("trivial_augment", ops, TRIVIAL_AUGMENT_OPS, self.space)
        self.ctx = _OpContext("trivial_augment", fill, interpolation)

    def __call__(self, image: Image.Image) -> Image.Image:
        _check_image("trivial_augment", image)
        name = random.choice(self.ops)
        level = random.randrange(self.num_magnitude_bins) / (self.num_magnitude_bins - 1)
        return _apply(image, name, level, self.space, self.ctx)

    def __repr__(self) -> str:
        return f"TrivialAugment(num_magnitude_bins={self.num_magnitude_bins}, ops={len(self.ops)})"


ERASE_MODES = ("const", "rand", "pixel")


@AUGMENTATIONS.register("random_erasing")
class RandomErasing:
    """Random Erasing (Zhong et al., 2020, "Random erasing data augmentation") with timm's options, on the
    normalised float32 CHW array (``stage = "array"``: after ``ToNormalizedArray``).

    With probability ``probability`` the image gets between ``min_count`` and ``max_count`` rectangles
    (count uniform). Each one draws a target area ``uniform(*scale) * H * W / count`` and an aspect ratio
    h/w log-uniform in ``ratio``, rounds its sides, and is placed uniformly; a box that does not fit inside
    the image is redrawn, up to 10 times, then skipped. Geometry is drawn from python ``random``, random
    fills from ``numpy.random``.

    Args:
        probability: chance that an image is erased at all.
        scale: (min, max) erased area as a fraction of the image (split evenly among the rectangles).
        ratio: (min, max) aspect ratio h/w, sampled log-uniformly.
        mode: fill with "const" (zeros: the dataset mean after normalisation), "rand" (one standard-normal
            value per channel) or "pixel" (standard-normal noise per pixel and channel).
        min_count, max_count: number of rectangles per erased image (``max_count`` None = ``min_count``).

    A paddle.vision ``RandomErasing`` exists, but it erases HWC arrays, has no per-channel fill and draws
    ``numpy.random`` and paddle's own generator for tensors.
    """

    stage = "array"

    def __init__(self, probability: float = 0.5, scale: Sequence[float] = (0.02, 1 / 3),
                 ratio: Sequence[float] = (0.3, 1 / 0.3), mode: str = "const", min_count: int = 1,
                 max_count: int | None = None) -> None:
        self.probability = _check_range("random_erasing.probability", probability, 0.0, 1.0)
        scale = tuple(float(v) for v in scale)
        if len(scale) != 2 or not 0 < scale[0] <= scale[1] <= 1:
            raise ConfigError(f"random_erasing.scale={list(scale)} must be [min, max] with 0 < min <= max <= 1")
        ratio = tuple(float(v) for v in ratio)
        if len(ratio) != 2 or not 0 < ratio[0] <= ratio[1]:
            raise ConfigError(f"random_erasing.ratio={list(ratio)} must be [min, max] with 0 < min <= max")
        if mode not in ERASE_MODES:
            raise ConfigError(f"random_erasing.mode={mode!r} is not supported; valid values: {', '.join(ERASE_MODES)}")
        max_count = min_count if max_count is None else max_count
        if int(min_count) != min_count or min_count < 1 or int(max_count) != max_count or max_count < min_count:
            raise ConfigError(f"random_erasing.min_count={min_count}, max_count={max_count}: need whole numbers "
                              "with 1 <= min_count <= max_count")
        self.scale, self.ratio, self.mode = scale, ratio, mode
        self.log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
        self.min_count, self.max_count = int(min_count), int(max_count)

    def __call__(self, array: np.ndarray) -> np.ndarray:
        """Return ``array`` itself when nothing is erased, else an erased copy (the input is never modified)."""
        if not isinstance(array, np.ndarray) or array.ndim != 3:
            raise TypeError(f"random_erasing expects a CHW numpy array (run it after ToNormalizedArray), got "
                            f"{getattr(array, 'shape', type(array).__name__)}")
        if random.random() >= self.probability:
            return array
        channels, height, width = array.shape
        count = self.min_count if self.min_count == self.max_count else random.randint(self.min_count,
                                                                                       self.max_count)
        out = array.copy()
        for _ in range(count):
            for _attempt in range(10):
                area = random.uniform(*self.scale) * height * width / count
                aspect = math.exp(random.uniform(*self.log_ratio))
                h = round(math.sqrt(area * aspect))
                w = round(math.sqrt(area / aspect))
                if 0 < h < height and 0 < w < width:
                    top = random.randint(0, height - h)
                    left = random.randint(0, width - w)
                    out[:, top:top + h, left:left + w] = self._fill(channels, h, w, out.dtype)
                    break
        return out

    def _fill(self, channels: int, h: int, w: int, dtype: np.dtype) -> np.ndarray | float:
        if self.mode == "const":
            return 0.0
        shape = (channels, 1, 1) if self.mode == "rand" else (channels, h, w)
        return np.random.standard_normal(shape).astype(dtype)

    def __repr__(self) -> str:
        return (f"RandomErasing(probability={self.probability}, scale={self.scale}, ratio={self.ratio}, "
                f"mode={self.mode!r}, count={self.min_count}..{self.max_count})")

