"""Per-image augmentations against their definitions: RandAugment, AutoAugment, TrivialAugment, RandomErasing."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
from paddle.vision import transforms as T
from PIL import Image

from paddletrain.config import DataConfig
from paddletrain.data.loading.loaders import build_loader
from paddletrain.data.transforms.augment import (
    IMAGENET_POLICY,
    MAGNITUDE_SPACES,
    RAND_AUGMENT_OPS,
    AutoAugment,
    RandAugment,
    RandomErasing,
    TrivialAugment,
    apply_op,
)
from paddletrain.data.transforms.presets import ToNormalizedArray, ToPILImage, build_transform
from paddletrain.errors import ConfigError
from paddletrain.registry import AUGMENTATIONS

# Operations that are not the identity at level 0, per magnitude space (as docs/data.md lists them).
NOT_IDENTITY_AT_ZERO = {
    "rand": {"auto_contrast", "equalize", "invert", "posterize", "solarize", "color", "contrast", "brightness",
             "sharpness"},
    "rand_increasing": {"auto_contrast", "equalize", "invert", "posterize"},
    "original": {"auto_contrast", "equalize", "invert", "posterize", "solarize", "color", "contrast",
                 "brightness", "sharpness"},
    "wide": {"auto_contrast", "equalize"},
}


def _image(mode: str = "RGB", h: int = 24, w: int = 20, seed: int = 0) -> Image.Image:
    """Noise in 40..200 (so autocontrast, equalize and solarize all have something to change)."""
    array = np.random.default_rng(seed).integers(40, 200, (h, w, 3), dtype=np.uint8)
    return Image.fromarray(array).convert(mode)


def _seeded(transform, image, seed):
    random.seed(seed)
    np.random.seed(seed)
    return transform(image)


def _same(a: Image.Image, b: Image.Image) -> bool:
    return a.mode == b.mode and a.size == b.size and np.array_equal(np.asarray(a), np.asarray(b))


# ------------------------------------------------------------------------------------------ registry
@pytest.mark.parametrize("name,cls", [("rand_augment", RandAugment), ("auto_augment", AutoAugment),
                                      ("trivial_augment", TrivialAugment), ("random_erasing", RandomErasing)])
def test_each_augmentation_is_registered_and_says_where_it_runs(name, cls):
    assert AUGMENTATIONS.get(name) is cls
    assert cls.stage == ("array" if cls is RandomErasing else "image")


def test_the_transform_preset_auto_augment_switch_uses_rand_augment_m9_n2():
    cfg = DataConfig(image_size=16, train_transform="small", auto_augment=True)
    steps = [step for step in build_transform(cfg, train=True).transforms if isinstance(step, RandAugment)]
    assert len(steps) == 1
    assert (steps[0].num_ops, steps[0].magnitude, steps[0].magnitude_std) == (2, 9.0, 0.5)


# ------------------------------------------------------------------------------------------ operations
@pytest.mark.parametrize("space", sorted(MAGNITUDE_SPACES))
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_magnitude_zero_is_the_identity_where_defined_and_changes_the_image_elsewhere(space, mode):
    image = _image(mode)
    for name in MAGNITUDE_SPACES[space]:
        for seed in range(3):  # both signs of the signed operations
            random.seed(seed)
            out = apply_op(image, name, 0.0, space)
            assert out.mode == mode and out.size == image.size
            # Colour saturation has nothing to change in a grey image, whatever the factor.
            identity = name not in NOT_IDENTITY_AT_ZERO[space] or (mode == "L" and name == "color")
            assert _same(out, image) is identity, (space, name)


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_rand_augment_at_magnitude_zero_leaves_images_unchanged(mode):
    image = _image(mode)
    identity_ops = [op for op in RAND_AUGMENT_OPS if op not in NOT_IDENTITY_AT_ZERO["rand_increasing"]]
    assert len(identity_ops) == 11
    rand = RandAugment(num_ops=3, magnitude=0, magnitude_std=0, prob=1.0, increasing=True, ops=identity_ops)
    for seed in range(20):
        assert _same(_seeded(rand, image, seed), image)
    # The non-increasing default space changes images at magnitude 0 (enhance factor 0.1, solarize at 0).
    timm_space = RandAugment(num_ops=3, magnitude=0, magnitude_std=0, prob=1.0, ops=identity_ops)
    assert sum(not _same(_seeded(timm_space, image, s), image) for s in range(20)) >= 10


def test_trivial_augment_draws_magnitude_bins_uniformly_including_zero():
    trivial = TrivialAugment(num_magnitude_bins=31, ops=["rotate"])
    image = _image("L", 16, 16)
    random.seed(0)
    unchanged = sum(_same(trivial(image), image) for _ in range(620))
    # Bin 0 (level 0) is the only identity (every "wide" op at level 0 is checked above): 20 of 620 expected.
    assert 8 <= unchanged <= 35


def _rotated(image, degrees):
    return image.rotate(degrees, resample=Image.Resampling.BILINEAR, fillcolor=(128, 128, 128))


@pytest.mark.parametrize("space,level,degrees", [("rand", 1.0, 30.0), ("rand_increasing", 0.5, 15.0),
                                                 ("wide", 1.0, 135.0), ("wide", 0.5, 67.5)])
def test_rotate_covers_the_documented_range_with_both_signs(space, level, degrees):
    image = _image()
    seen = set()
    for seed in range(12):
        random.seed(seed)
        out = apply_op(image, "rotate", level, space)
        matches = [sign for sign in (1, -1) if _same(out, _rotated(image, sign * degrees))]
        assert len(matches) == 1
        seen.add(matches[0])
    assert seen == {1, -1}


@pytest.mark.parametrize("space,name,level,coeffs", [
    ("rand", "shear_x", 1.0, (1, 0.3, 0, 0, 1, 0)),
    ("wide", "shear_y", 1.0, (1, 0, 0, 0.99, 1, 0)),
    ("rand", "translate_x", 1.0, (1, 0, 0.45 * 20, 0, 1, 0)),  # relative: 0.45 of the width (20)
    ("rand_increasing", "translate_y", 0.5, (1, 0, 0, 0, 1, 0.225 * 24)),
    ("wide", "translate_x", 0.5, (1, 0, 16.0, 0, 1, 0)),  # absolute pixels in the wide space
])
def test_affine_operations_use_the_documented_factors(space, name, level, coeffs):
    image = _image()
    negated = tuple(-c if i in (1, 2, 3, 5) else c for i, c in enumerate(coeffs))
    expected = [image.transform(image.size, Image.Transform.AFFINE, c, resample=Image.Resampling.BILINEAR,
                                fillcolor=(128, 128, 128)) for c in (coeffs, negated)]
    for seed in range(6):
        random.seed(seed)
        out = apply_op(image, name, level, space)
        assert _same(out, expected[0]) or _same(out, expected[1])


def _keep_bits(image, bits):
    return (np.asarray(image) & ((0xFF << (8 - bits)) & 0xFF)).astype(np.uint8)


@pytest.mark.parametrize("space,level,bits", [("rand", 0.0, 0), ("rand", 0.9, 3), ("rand_increasing", 0.0, 4),
                                              ("rand_increasing", 0.7, 2), ("original", 0.0, 4),
                                              ("original", 0.5, 6), ("wide", 0.5, 5), ("wide", 1.0, 2)])
@pytest.mark.parametrize("size", [20, 120])  # small images take the numpy lookup, large ones Image.point
def test_posterize_keeps_the_documented_number_of_bits(space, level, bits, size):
    image = _image(h=size, w=size)
    np.testing.assert_array_equal(np.asarray(apply_op(image, "posterize", level, space)), _keep_bits(image, bits))


@pytest.mark.parametrize("size", [20, 120])
def test_solarize_and_enhance_arguments(size):
    image = _image(h=size, w=size)
    pixels = np.asarray(image).astype(int)
    half = np.asarray(apply_op(image, "solarize", 0.5, "rand"))  # threshold 128: pixels >= 128 inverted
    np.testing.assert_array_equal(half, np.where(pixels >= 128, 255 - pixels, pixels))
    full = np.asarray(apply_op(image, "solarize", 1.0, "wide"))  # threshold 0: every pixel inverted
    np.testing.assert_array_equal(full, 255 - pixels)
    add = np.asarray(apply_op(image, "solarize_add", 1.0, "rand"))  # +110 below 128, clipped
    np.testing.assert_array_equal(add, np.where(pixels < 128, np.minimum(pixels + 110, 255), pixels))
    # In timm's non-increasing space, factor 1.0 (no change) sits at magnitude 5.
    for name in ("color", "contrast", "brightness", "sharpness"):
        assert _same(apply_op(image, name, 0.5, "rand"), image)
    for mode in ("RGB", "L"):
        grey = np.asarray(image.convert(mode)).astype(int)
        out = np.asarray(apply_op(image.convert(mode), "solarize", 0.5, "rand"))
        np.testing.assert_array_equal(out, np.where(grey >= 128, 255 - grey, grey))
    dark = apply_op(image, "brightness", 0.0, "rand")  # factor 0.1
    np.testing.assert_allclose(np.asarray(dark).astype(float), pixels * 0.1, atol=1)


def test_geometric_operations_fill_with_the_given_colour():
    image = Image.new("RGB", (20, 20), (255, 255, 255))
    out = np.asarray(apply_op(image, "translate_x", 1.0, "wide", fill=(10, 20, 30), interpolation="nearest"))
    assert {tuple(p) for p in out.reshape(-1, 3)} == {(10, 20, 30)}  # shifted 32 px out of a 20 px image
    grey = apply_op(image.convert("L"), "translate_x", 1.0, "wide", fill=(10, 20, 30), interpolation="nearest")
    assert set(np.asarray(grey).ravel()) == {np.asarray(Image.new("RGB", (1, 1), (10, 20, 30)).convert("L"))[0, 0]}


# ------------------------------------------------------------------------------------------ RandAugment
def test_rand_augment_magnitude_noise_is_gaussian_and_clipped():
    ra = RandAugment(magnitude=9, magnitude_std=2.0)
    random.seed(0)
    draws = np.array([ra._draw_magnitude() for _ in range(4000)])
    assert draws.min() >= 0 and draws.max() == 10.0
    unclipped = draws[draws < 10]
    assert 0.25 < (draws == 10).mean() < 0.40  # P(N(9, 2) > 10) = 0.31
    assert 7.0 < np.median(draws) < 9.3
    assert unclipped.std() > 1.0
    fixed = RandAugment(magnitude=7, magnitude_std=0)
    assert {fixed._draw_magnitude() for _ in range(10)} == {7.0}
    uniform = RandAugment(magnitude=6, magnitude_std=math.inf)
    values = np.array([uniform._draw_magnitude() for _ in range(2000)])
    assert values.min() >= 0 and values.max() <= 6 and 2.7 < values.mean() < 3.3


def test_rand_augment_prob_and_num_ops():
    image = _image()
    assert all(_same(_seeded(RandAugment(prob=0.0), image, s), image) for s in range(10))
    assert all(_same(_seeded(RandAugment(num_ops=0), image, s), image) for s in range(10))
    # With prob 1 and the invert operation only, an even number of ops cancels out, an odd one does not.
    assert _same(_seeded(RandAugment(num_ops=2, prob=1.0, ops=["invert"]), image, 0), image)
    inverted = _seeded(RandAugment(num_ops=3, prob=1.0, ops=["invert"]), image, 0)
    np.testing.assert_array_equal(np.asarray(inverted), 255 - np.asarray(image))
    # prob 0.5 per op (timm): with one invert op, about half of the images are inverted.
    half = RandAugment(num_ops=1, prob=0.5, ops=["invert"])
    random.seed(1)
    assert 80 <= sum(not _same(half(image), image) for _ in range(200)) <= 120


# ------------------------------------------------------------------------------------------ AutoAugment
def test_imagenet_policy_has_25_two_step_sub_policies_of_valid_operations():
    assert len(IMAGENET_POLICY) == 25
    space = MAGNITUDE_SPACES["original"]
    for sub_policy in IMAGENET_POLICY:
        assert len(sub_policy) == 2
        for name, prob, magnitude in sub_policy:
            assert name in space and 0.0 <= prob <= 1.0
            assert magnitude is None or 0 <= magnitude <= 9
            # The magnitude-free operations carry None; the others a magnitude.
            assert (magnitude is None) == (name in ("auto_contrast", "equalize", "invert"))


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_every_imagenet_policy_step_runs_on_rgb_and_l_images(mode):
    image = _image(mode)
    for index, sub_policy in enumerate(IMAGENET_POLICY):
        for name, _prob, magnitude in sub_policy:
            random.seed(index)
            out = apply_op(image, name, (magnitude or 0) / 10, "original")
            assert out.mode == mode and out.size == image.size
    augment = AutoAugment("imagenet")
    outputs = [_seeded(augment, image, s) for s in range(30)]
    assert all(o.mode == mode and o.size == image.size for o in outputs)
    assert sum(not _same(o, image) for o in outputs) >= 15


# ------------------------------------------------------------------------------------------ RandomErasing
def _erased_boxes(out: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """The erased mask (pixels equal to 0 in every channel) and its bounding box (top, bottom, left, right)."""
    mask = np.all(out == 0, axis=0)
    rows, cols = np.flatnonzero(mask.any(1)), np.flatnonzero(mask.any(0))
    return mask, (rows[0], rows[-1] + 1, cols[0], cols[-1] + 1)


def test_random_erasing_with_probability_zero_is_the_identity():
    array = np.random.default_rng(0).standard_normal((3, 16, 16)).astype(np.float32)
    erasing = RandomErasing(probability=0.0, mode="pixel")
    for seed in range(10):
        assert _seeded(erasing, array, seed) is array


def test_erased_rectangle_area_and_aspect_lie_within_the_ranges():
    scale, ratio = (0.05, 0.3), (0.5, 3.0)
    erasing = RandomErasing(probability=1.0, scale=scale, ratio=ratio, mode="const")
    height, width = 100, 120
    array = np.ones((3, height, width), np.float32)
    areas, aspects = [], []
    for seed in range(200):
        out = _seeded(erasing, array, seed)
        assert np.array_equal(array, np.ones_like(array))  # the input is never modified
        mask, (top, bottom, left, right) = _erased_boxes(out)
        assert mask.sum() == (bottom - top) * (right - left)  # one filled rectangle
        assert mask[top:bottom, left:right].all()
        areas.append(mask.sum() / (height * width))
        aspects.append((bottom - top) / (right - left))
    # Rounding the sides moves the area and aspect slightly beyond the drawn values (by < 1 px per side).
    assert scale[0] * 0.9 <= min(areas) and max(areas) <= scale[1] * 1.1
    assert ratio[0] * 0.9 <= min(aspects) and max(aspects) <= ratio[1] * 1.1
    # Both ranges are actually covered, not a single size.
    assert min(areas) < 0.08 and max(areas) > 0.25 and min(aspects) < 0.7 and max(aspects) > 2.2


def test_several_rectangles_share_the_area_and_probability_is_respected():
    erasing = RandomErasing(probability=1.0, scale=(0.2, 0.2), ratio=(1.0, 1.0), min_count=4, max_count=4)
    array = np.ones((1, 100, 100), np.float32)
    out = _seeded(erasing, array, 3)
    erased = np.all(out == 0, axis=0).sum()
    assert 0.05 * 1e4 < erased <= 0.2 * 1e4 + 50  # four ~5% squares, possibly overlapping
    half = RandomErasing(probability=0.5)
    random.seed(0)
    assert 80 <= sum(half(array) is not array for _ in range(200)) <= 120


def test_fill_modes():
    array = np.full((3, 64, 64), 7.0, np.float32)
    const = _seeded(RandomErasing(probability=1.0, mode="const"), array, 0)
    assert set(np.unique(const)) == {0.0, 7.0}
    rand = _seeded(RandomErasing(probability=1.0, scale=(0.2, 0.3), mode="rand"), array, 0)
    box = rand != 7.0
    per_channel = [np.unique(rand[c][box[c]]) for c in range(3)]
    assert all(len(values) == 1 for values in per_channel)  # one value per channel
    assert len({float(v[0]) for v in per_channel}) == 3
    pixel = _seeded(RandomErasing(probability=1.0, scale=(0.3, 0.3), mode="pixel"), array, 0)
    noise = pixel[pixel != 7.0]
    assert noise.size > 3000 and abs(noise.mean()) < 0.1 and 0.9 < noise.std() < 1.1
    assert pixel.dtype == np.float32


# ------------------------------------------------------------------------------------------ determinism
@pytest.mark.parametrize("augment", [RandAugment(), RandAugment(increasing=True, interpolation="random"),
                                     AutoAugment(), TrivialAugment(),
                                     RandomErasing(probability=0.7, mode="pixel", max_count=3)],
                         ids=["rand", "rand_inc", "auto", "trivial", "erasing"])
def test_each_augmentation_is_a_pure_function_of_the_seeded_global_rngs(augment):
    if augment.stage == "array":
        image = np.random.default_rng(0).standard_normal((3, 32, 32)).astype(np.float32)
    else:
        image = _image("RGB", 32, 32)
    outputs = [np.asarray(_seeded(augment, image, seed)) for seed in range(8)]
    for seed in range(8):
        np.testing.assert_array_equal(np.asarray(_seeded(augment, image, seed)), outputs[seed])
    assert len({o.tobytes() for o in outputs}) >= 4


class _NoiseImages:
    """24 random 16x16 RGB images; the transform runs inside, as in paddletrain's datasets."""

    classes = ["a", "b"]

    def __init__(self, transform):
        self.transform = transform
        self.images = np.random.default_rng(0).integers(0, 256, (24, 16, 16, 3), dtype=np.uint8)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        return self.transform(self.images[index]), np.int64(index % 2)


def _augmenting_loader(num_workers):
    transform = T.Compose([ToPILImage(3), RandAugment(increasing=True), TrivialAugment(),
                           ToNormalizedArray([0.5] * 3, [0.5] * 3), RandomErasing(probability=0.5, mode="pixel")])
    cfg = DataConfig(batch_size=4, image_size=16, num_workers=num_workers)
    return build_loader(_NoiseImages(transform), cfg, train=True, seed=3)


@pytest.mark.timeout(60)
def test_in_the_loader_augmentation_is_the_same_for_any_worker_count_and_after_a_resume():
    single, multi = _augmenting_loader(0), _augmenting_loader(2)
    single.batch_sampler.set_epoch(1)
    multi.batch_sampler.set_epoch(1)
    batches, state = [], None
    for x, _ in single:
        batches.append(x.numpy())
        if len(batches) == 4:
            state = single.batch_sampler.state_dict()
    assert len(batches) == 6 and len({b.tobytes() for b in batches}) == 6
    for expected, (x, _) in zip(batches, multi, strict=True):
        np.testing.assert_array_equal(x.numpy(), expected)
    resumed = _augmenting_loader(2)
    resumed.batch_sampler.load_state_dict(state)
    resumed.batch_sampler.set_epoch(1)
    for expected, (x, _) in zip(batches[4:], resumed, strict=True):
        np.testing.assert_array_equal(x.numpy(), expected)


# ------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("factory,kwargs,words", [
    (RandAugment, dict(magnitude=12), ["rand_augment.magnitude=12", "10"]),
    (RandAugment, dict(num_ops=-1), ["rand_augment.num_ops=-1"]),
    (RandAugment, dict(prob=1.5), ["rand_augment.prob=1.5"]),
    (RandAugment, dict(ops=["rotate", "warp"]), ["rand_augment.ops", "warp", "solarize"]),
    (RandAugment, dict(interpolation="cubic"), ["rand_augment.interpolation='cubic'", "bicubic"]),
    (RandAugment, dict(fill=(1, 2)), ["rand_augment.fill"]),
    (AutoAugment, dict(policy="cifar"), ["auto_augment.policy='cifar'", "imagenet"]),
    (TrivialAugment, dict(num_magnitude_bins=1), ["trivial_augment.num_magnitude_bins=1"]),
    (RandomErasing, dict(scale=(0.5, 0.1)), ["random_erasing.scale"]),
    (RandomErasing, dict(ratio=(0.0, 2)), ["random_erasing.ratio"]),
    (RandomErasing, dict(mode="noise"), ["random_erasing.mode='noise'", "pixel"]),
    (RandomErasing, dict(min_count=2, max_count=1), ["random_erasing.min_count=2"]),
])
def test_bad_options_name_the_option_and_the_valid_values(factory, kwargs, words):
    with pytest.raises(ConfigError) as info:
        factory(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_wrong_inputs_say_where_the_augmentation_belongs():
    with pytest.raises(TypeError, match="after ToPILImage"):
        RandAugment()(_image().convert("RGBA"))
    with pytest.raises(TypeError, match="after ToNormalizedArray"):
        RandomErasing()(np.zeros((8, 8), np.float32))
