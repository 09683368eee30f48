"""Transform presets: shapes, dtypes, normalisation, channel handling, determinism under seeding, errors."""
from __future__ import annotations

import random

import numpy as np
import pytest
from omegaconf import OmegaConf
from PIL import Image

from paddletrain.config import DataConfig
from paddletrain.data.transforms.presets import PRESETS, ToNormalizedArray, build_transform, preprocessing_info
from paddletrain.errors import ConfigError


def _random_image(h=40, w=30, c=3, seed=0):
    rng = np.random.default_rng(seed)
    shape = (h, w, c) if c else (h, w)
    return rng.integers(0, 256, shape, dtype=np.uint8)


def _seeded(transform, image, seed):
    random.seed(seed)
    np.random.seed(seed)
    return transform(image)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("in_chans", [1, 3])
def test_every_preset_gives_float32_chw_of_image_size(preset, train, in_chans):
    cfg = DataConfig(image_size=24, train_transform=preset, eval_transform=preset, color_jitter=0.3,
                     auto_augment=True)
    transform = build_transform(cfg, train=train, in_chans=in_chans)
    inputs = [_random_image(40, 30, 3), _random_image(20, 20, 0), _random_image(24, 24, 1),
              Image.fromarray(_random_image(50, 60, 3))]
    for image in inputs:
        out = transform(image)
        assert isinstance(out, np.ndarray)
        assert out.dtype == np.float32
        assert out.shape == (in_chans, 24, 24)
        assert out.flags.c_contiguous


def test_normalisation_uses_per_channel_mean_and_std_on_0_1_scale():
    cfg = DataConfig(image_size=4, eval_transform="small", mean=[0.1, 0.5, 0.9], std=[0.5, 0.25, 0.1])
    image = np.zeros((4, 4, 3), np.uint8)
    image[..., 0], image[..., 1], image[..., 2] = 255, 51, 0
    out = build_transform(cfg, train=False)(image)
    np.testing.assert_allclose(out[0], (1.0 - 0.1) / 0.5, rtol=1e-6)
    np.testing.assert_allclose(out[1], (0.2 - 0.5) / 0.25, rtol=1e-6)
    np.testing.assert_allclose(out[2], (0.0 - 0.9) / 0.1, rtol=1e-6)


def test_small_eval_leaves_right_sized_images_untouched():
    cfg = DataConfig(image_size=8, eval_transform="small", mean=[0.0], std=[1.0])
    image = _random_image(8, 8, 3)
    out = build_transform(cfg, train=False)(image)
    np.testing.assert_allclose(out, image.transpose(2, 0, 1) / 255.0, rtol=1e-6)


def test_three_value_stats_are_averaged_for_one_channel_and_greyscale_conversion_happens():
    cfg = DataConfig(image_size=4, eval_transform="none", mean=[0.2, 0.4, 0.6], std=[0.5, 0.5, 0.5])
    grey = np.full((4, 4), 102, np.uint8)  # 0.4 on the 0..1 scale: exactly the averaged mean
    np.testing.assert_allclose(build_transform(cfg, train=False, in_chans=1)(grey), 0.0, atol=1e-6)
    rgb = build_transform(cfg, train=False, in_chans=3)(grey)
    assert rgb.shape == (3, 4, 4)
    np.testing.assert_allclose(rgb[:, 0, 0], [(0.4 - m) / 0.5 for m in (0.2, 0.4, 0.6)], rtol=1e-5)
    info = preprocessing_info(cfg, in_chans=1)
    assert info["mean"] == pytest.approx([0.4]) and info["std"] == pytest.approx([0.5])


def test_imagenet_eval_resizes_shorter_side_then_centre_crops():
    cfg = DataConfig(image_size=16, eval_resize=32, eval_transform="imagenet", interpolation="nearest",
                     mean=[0.0], std=[1.0])
    image = np.zeros((64, 64, 3), np.uint8)
    image[16:48, 16:48] = 255  # the central half is white: exactly what a 16/32 centre crop keeps
    out = build_transform(cfg, train=False)(image)
    assert out.shape == (3, 16, 16)
    np.testing.assert_allclose(out, 1.0)
    info = preprocessing_info(cfg)
    assert (info["resize"], info["crop"], info["resize_mode"]) == (32, 16, "shorter_side")
    assert info["input_size"] == [3, 16, 16] and info["interpolation"] == "nearest"


def test_default_eval_resize_is_image_size_over_0875():
    info = preprocessing_info(DataConfig(image_size=224, eval_transform="imagenet"))
    assert info["resize"] == 256
    small = preprocessing_info(DataConfig(image_size=32, eval_transform="small"))
    assert (small["resize"], small["crop"], small["resize_mode"]) == (32, None, "exact")


@pytest.mark.parametrize("preset", ["imagenet", "small"])
def test_eval_image_size_sizes_the_eval_pipeline_and_leaves_training_at_image_size(preset):
    cfg = DataConfig(image_size=16, eval_image_size=24, train_transform=preset, eval_transform=preset)
    image = np.zeros((40, 50, 3), np.uint8)
    assert build_transform(cfg, train=True)(image).shape == (3, 16, 16)
    assert build_transform(cfg, train=False)(image).shape == (3, 24, 24)
    info = preprocessing_info(cfg)
    assert info["input_size"] == [3, 24, 24]
    # imagenet: the default resize follows the eval size (24 / 0.875), not the training size
    assert (info["resize"], info["crop"]) == ((27, 24) if preset == "imagenet" else (24, None))
    assert preprocessing_info(DataConfig(image_size=16, eval_image_size=None)) == preprocessing_info(
        DataConfig(image_size=16))


@pytest.mark.parametrize("preset", ["imagenet", "small"])
def test_train_augmentation_is_a_function_of_the_global_rngs(preset):
    cfg = DataConfig(image_size=16, train_transform=preset, color_jitter=0.4, auto_augment=True)
    transform = build_transform(cfg, train=True)
    image = _random_image(20, 20, 3)
    np.testing.assert_array_equal(_seeded(transform, image, 1), _seeded(transform, image, 1))
    outputs = [_seeded(transform, image, s) for s in range(6)]
    assert any(not np.array_equal(outputs[0], o) for o in outputs[1:])


def test_eval_transform_is_deterministic_without_seeding():
    transform = build_transform(DataConfig(image_size=16, eval_transform="imagenet"), train=False)
    image = _random_image(30, 40, 3)
    np.testing.assert_array_equal(transform(image), transform(image))


def test_auto_augment_changes_images():
    image = _random_image(16, 16, 3)
    plain = build_transform(DataConfig(image_size=16, train_transform="none"), train=True)
    augmented = build_transform(DataConfig(image_size=16, train_transform="none", auto_augment=True), train=True)
    # "none" ignores augmentation switches; the small preset honours them.
    assert np.array_equal(_seeded(plain, image, 0), _seeded(augmented, image, 0))
    cfg = DataConfig(image_size=16, train_transform="small", hflip=False)
    base = build_transform(cfg, train=True)
    cfg.auto_augment = True
    with_aa = build_transform(cfg, train=True)
    assert any(not np.array_equal(_seeded(base, image, s), _seeded(with_aa, image, s)) for s in range(4))


@pytest.mark.parametrize("key,kwargs,names", [
    ("data.train_transform", dict(train_transform="cifar"), ["'cifar'", "imagenet", "small", "none"]),
    ("data.interpolation", dict(interpolation="cubic"), ["'cubic'", "bicubic"]),
    ("data.mean", dict(mean=[0.5, 0.5]), ["2 values", "3 channels"]),
    ("data.std", dict(std=[0.5, 0.0, 0.5]), ["every value must be > 0", "got 0.0"]),
])
def test_bad_config_names_key_and_valid_values(key, kwargs, names):
    # The schema's rules speak when the DataConfig is constructed, the channel counts when the pipeline is built.
    with pytest.raises(ConfigError) as info:
        build_transform(DataConfig(**kwargs), train=True)
    message = str(info.value)
    assert key in message
    for name in names:
        assert name in message


def test_bad_eval_preset_is_reported_by_preprocessing_info():
    with pytest.raises(ConfigError, match="data.eval_transform='big'"):
        preprocessing_info(DataConfig(eval_transform="big"))


@pytest.mark.parametrize("shape", [(7, 5, 3), (7, 5), (7, 5, 1)])
def test_normalization_is_bit_identical_to_the_plain_formula_and_contiguous(shape):
    image = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    channels = 1 if len(shape) == 2 else shape[2]
    mean, std = [0.485, 0.456, 0.406][:channels], [0.229, 0.224, 0.225][:channels]
    out = ToNormalizedArray(mean, std)(image)
    chw = image[None] if image.ndim == 2 else image.transpose(2, 0, 1)
    expected = (chw.astype(np.float32) / 255.0 - np.float32(mean).reshape(-1, 1, 1)) / np.float32(std).reshape(-1, 1, 1)
    assert out.dtype == np.float32 and out.flags.c_contiguous and out.shape == (channels, 7, 5)
    np.testing.assert_array_equal(out, expected)


# ------------------------------------------------------------------------------------------ data.augment
def _names(transform):
    return [type(step).__name__ for step in transform.transforms]


def test_augment_entries_run_at_their_stage_in_the_train_transform_only():
    cfg = DataConfig(image_size=16, augment=[{"name": "random_erasing", "probability": 1.0},
                                             {"name": "rand_augment", "num_ops": 1}])
    train = _names(build_transform(cfg, train=True))
    # Image stages after crop and flip, before normalisation; array stages after it; the config's order kept.
    assert train[-3:] == ["RandAugment", "ToNormalizedArray", "RandomErasing"]
    assert train.index("RandomHorizontalFlip") < train.index("RandAugment")
    assert "RandAugment" not in _names(build_transform(cfg, train=False))
    assert "RandomErasing" not in _names(build_transform(cfg, train=False))


def test_augment_random_erasing_erases_the_normalised_array():
    grey = np.full((16, 16, 3), 128, np.uint8)  # normalises to 0.0039..., never exactly 0
    cfg = DataConfig(image_size=16, hflip=False, train_transform="none",
                     augment=[{"name": "random_erasing", "probability": 1.0, "mode": "const"}])
    out = _seeded(build_transform(cfg, train=True), grey, 0)
    erased = out == 0.0
    assert erased.any() and not erased.all()
    assert (erased == erased[:1]).all()  # every channel of a box: the box is erased in normalised space


def test_augment_rand_augment_at_magnitude_zero_is_the_identity_of_the_pipeline():
    image = _random_image(16, 16)
    plain = DataConfig(image_size=16)
    identity = DataConfig(image_size=16, augment=[{"name": "rand_augment", "magnitude": 0, "magnitude_std": 0,
                                                    "increasing": True, "prob": 1.0, "ops": ["rotate", "color"]}])
    # Same seed, same crop and flip draws (RandAugment draws after them); magnitude 0 changes no pixel.
    np.testing.assert_array_equal(_seeded(build_transform(identity, train=True), image, 5),
                                  _seeded(build_transform(plain, train=True), image, 5))
    strong = DataConfig(image_size=16, augment=[{"name": "rand_augment", "magnitude": 9, "magnitude_std": 0,
                                                  "prob": 1.0, "ops": ["rotate"]}])
    assert not np.array_equal(_seeded(build_transform(strong, train=True), image, 5),
                              _seeded(build_transform(plain, train=True), image, 5))


def test_a_zero_std_that_no_schema_checked_is_refused():
    # e.g. resolved from pretrained weights after validation: the pipeline itself refuses it
    cfg = OmegaConf.structured(DataConfig)
    cfg.std = [0.5, 0.0, 0.5]
    with pytest.raises(ConfigError, match=r"^data\.std must not contain zeros"):
        build_transform(cfg, train=True)


@pytest.mark.parametrize("entry, line", [
    ({"name": "rand_augment", "magnitude": 12}, "data.augment[0].magnitude=12 must be between 0.0 and 10.0"),
    ({"name": "rand_augment", "magnitdue": 5}, "data.augment[0].magnitdue: rand_augment has no option 'magnitdue'"),
    ({"name": "random_erase"}, "data.augment[0]: unknown augmentation data.augment='random_erase'; did you mean "
                               "random_erasing"),
    ({"probability": 0.5}, "data.augment[0]={'probability': 0.5} must be a mapping with a name"),
    ({"name": "random_erasing", "mode": "noise"}, "data.augment[0].mode='noise' is not supported"),
])
def test_bad_augment_entries_name_the_entry_and_option(entry, line):
    with pytest.raises(ConfigError) as info:
        build_transform(DataConfig(image_size=16, augment=[entry]), train=True)
    assert str(info.value).startswith(line) and "\n" not in str(info.value)


def test_alternating_flip_mirrors_each_image_on_every_other_epoch_from_a_random_start():
    from paddletrain.data.transforms.presets import mirrored

    starts = [mirrored(7, index, 0) for index in range(2000)]
    assert 0.45 < np.mean(starts) < 0.55  # a random start per image
    for index in range(50):
        assert [mirrored(7, index, epoch) for epoch in range(4)] == [starts[index], not starts[index]] * 2
    assert [mirrored(8, i, 0) for i in range(64)] != starts[:64]  # another seed, other starts


def test_alternating_flip_through_the_loader_is_the_same_for_any_worker_count_and_alternates():
    import paddle

    from paddletrain.data.loading.loaders import build_loader
    from paddletrain.data.transforms.presets import AlternatingFlip

    class Asymmetric(paddle.io.Dataset):  # a bright left column: its place tells whether an image was mirrored
        classes = ["a"]

        def __len__(self):
            return 8

        def __getitem__(self, index):  # the column's brightness names the image: 100 + 10 * index
            pixels = np.zeros((8, 8, 3), np.uint8)
            pixels[:, 0] = 100 + 10 * index
            return Image.fromarray(pixels), 0

    cfg = DataConfig(image_size=8, batch_size=4, hflip_mode="alternating")
    assert any(isinstance(step, AlternatingFlip) for step in build_transform(cfg, train=True).transforms)

    def mirrored_per_epoch(workers: int) -> list[list[bool]]:
        loader = build_loader(Asymmetric(), DataConfig(**{**vars(cfg), "num_workers": workers}), train=True, seed=3,
                              transform=_flipped_array)
        seen = []
        for epoch in range(2):
            loader.batch_sampler.set_epoch(epoch)
            flips = {}
            for images, _ in loader:
                for image in images.numpy():
                    left, right = image[:, :, 0].mean(), image[:, :, -1].mean()
                    flips[round((max(left, right) - 100) / 10)] = bool(right > left)
            seen.append([flips[i] for i in range(8)])
        return seen

    epochs = mirrored_per_epoch(0)
    assert epochs[1] == [not flipped for flipped in epochs[0]] and 0 < sum(epochs[0]) < 8
    assert mirrored_per_epoch(2) == epochs


def _flipped_array(image):
    """The alternating flip alone, to a CHW float array of 0..255 (a module function: loader workers pickle it)."""
    from paddletrain.data.transforms.presets import AlternatingFlip

    return np.asarray(AlternatingFlip()(image), np.float32).transpose(2, 0, 1)


def _shift_of(moved: np.ndarray, image: np.ndarray, reach: int) -> tuple[int, int] | None:
    """The (dy, dx) by which ``moved`` is ``image`` translated, zero-filled at the edges (None: no such shift)."""
    side = image.shape[0]
    for dy in range(-reach, reach + 1):
        for dx in range(-reach, reach + 1):
            expected = np.zeros_like(image)
            expected[max(dy, 0):side + min(dy, 0), max(dx, 0):side + min(dx, 0)] = \
                image[max(-dy, 0):side + min(-dy, 0), max(-dx, 0):side + min(-dx, 0)]
            if np.array_equal(moved, expected):
                return dy, dx
    return None


@pytest.mark.parametrize("padding", [0, 2, 4])
def test_crop_padding_is_the_small_presets_reach_of_translation(padding):
    cfg = DataConfig(image_size=12, hflip=False, crop_padding=padding, mean=[0.0], std=[1.0])
    transform = build_transform(cfg, train=True, in_chans=1)
    image = _random_image(12, 12, 0, seed=3)
    shifts = {_shift_of(np.rint(_seeded(transform, image, s)[0] * 255).astype(np.uint8), image, padding)
              for s in range(1500)}
    assert None not in shifts
    # Every shift within the padding turns up (1500 draws of at most 81 equally likely ones), none beyond it.
    assert shifts == {(dy, dx) for dy in range(-padding, padding + 1) for dx in range(-padding, padding + 1)}


def test_a_negative_crop_padding_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match="data.crop_padding"):
        DataConfig(crop_padding=-1)
