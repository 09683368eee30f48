"""Mixup / CutMix against their definitions: targets match the mixed pixels, CutMix's lam is the pasted area,
per-sample draws, label smoothing, and a generator state that resumes the same draws."""
from __future__ import annotations

import numpy as np
import paddle
import pytest
from scipy import stats

from paddletrain.checkpoint import load_checkpoint, save_checkpoint
from paddletrain.data.transforms.mixup import MIX_MODES, Mixup
from paddletrain.errors import ConfigError, UserError


def _constant_batch(batch: int, height: int = 12, width: int = 10, channels: int = 3):
    """Image i is the constant i + 1 and has label i: every mixed pixel says which images made it."""
    values = np.arange(1, batch + 1, dtype=np.float32)
    images = np.broadcast_to(values[:, None, None, None], (batch, channels, height, width)).copy()
    return paddle.to_tensor(images), paddle.to_tensor(np.arange(batch, dtype=np.int64)), values


def _own_share(mixed: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Per sample, the share of its own image in its mixed pixels: mean of (v - c_partner) / (c_own - c_partner)."""
    partner = values[::-1]
    share = np.ones(len(values))
    for i, (own, other) in enumerate(zip(values, partner, strict=True)):
        if own != other:  # the middle of an odd batch is mixed with itself
            share[i] = ((mixed[i] - other) / (own - other)).mean()
    return share


CASES = [dict(mixup_alpha=0.4), dict(cutmix_alpha=1.0), dict(mixup_alpha=1.0, cutmix_alpha=1.0, switch_prob=0.5),
         dict(cutmix_minmax=(0.2, 0.8)), dict(mixup_alpha=0.8, cutmix_alpha=1.0, prob=0.6)]


@pytest.mark.parametrize("mode", MIX_MODES)
@pytest.mark.parametrize("options", CASES, ids=["mixup", "cutmix", "both", "minmax", "prob"])
@pytest.mark.parametrize("batch", [8, 7])
def test_targets_sum_to_one_and_equal_the_mixed_pixels_share(mode, options, batch):
    mixup = Mixup(num_classes=batch, mode=mode, label_smoothing=0.0, seed=3, **options)
    images, labels, values = _constant_batch(batch)
    for _ in range(6):
        mixed, targets = mixup(images, labels)
        mixed, targets = mixed.numpy(), targets.numpy()
        assert targets.shape == (batch, batch) and targets.dtype == np.float32
        np.testing.assert_allclose(targets.sum(1), 1.0, atol=1e-6)
        share = _own_share(mixed, values)
        partner = np.arange(batch)[::-1]
        for i in range(batch):
            if partner[i] == i:
                assert targets[i, i] == pytest.approx(1.0) and np.all(mixed[i] == values[i])
                continue
            assert targets[i, i] == pytest.approx(share[i], abs=1e-5)
            assert targets[i, partner[i]] == pytest.approx(1 - share[i], abs=1e-5)
            # Each pixel is its own image, its partner's, or (Mixup) one blend for the whole image.
            assert len(np.unique(mixed[i])) <= 2


def test_cutmix_lam_equals_the_pasted_area_after_clipping():
    height, width = 11, 13
    images, labels, values = _constant_batch(64, height, width, channels=1)
    corrected = Mixup(num_classes=64, mixup_alpha=0, cutmix_alpha=1.0, mode="elem", correct_lam=True,
                      label_smoothing=0.0, seed=5)
    raw = Mixup(num_classes=64, mixup_alpha=0, cutmix_alpha=1.0, mode="elem", correct_lam=False,
                label_smoothing=0.0, seed=5)
    clipped = differs = 0
    for _ in range(5):
        mixed, targets = corrected(images, labels)
        mixed_raw, targets_raw = raw(images, labels)
        mixed, targets, targets_raw = mixed.numpy(), targets.numpy(), targets_raw.numpy()
        np.testing.assert_array_equal(mixed, mixed_raw.numpy())  # the same draws, only lam differs
        for i in range(64):
            pasted = mixed[i, 0] == values[63 - i]
            rows, cols = np.flatnonzero(pasted.any(1)), np.flatnonzero(pasted.any(0))
            if len(rows):  # the pasted pixels form one box
                assert pasted.sum() == len(rows) * len(cols) == (rows[-1] - rows[0] + 1) * (cols[-1] - cols[0] + 1)
                clipped += rows[0] == 0 or cols[0] == 0 or rows[-1] == height - 1 or cols[-1] == width - 1
            area = pasted.sum() / (height * width)
            assert targets[i, i] == pytest.approx(1 - area, abs=1e-6)
            differs += abs(targets_raw[i, i] - (1 - area)) > 0.02
    # Clipping at the border happens often, and without the correction the targets then miss the pixels.
    assert clipped > 50 and differs > 50


def test_cutmix_minmax_draws_box_sides_within_the_range():
    height = width = 40
    images, labels, values = _constant_batch(32, height, width, channels=1)
    mixup = Mixup(num_classes=32, mixup_alpha=0, cutmix_minmax=(0.25, 0.5), mode="elem", correct_lam=False,
                  label_smoothing=0.0, seed=0)
    mixed, targets = mixup(images, labels)
    mixed, targets = mixed.numpy(), targets.numpy()
    sides = []
    for i in range(32):
        pasted = mixed[i, 0] == values[31 - i]
        sides += [pasted.any(1).sum(), pasted.any(0).sum()]
        assert targets[i, i] == pytest.approx(1 - pasted.mean(), abs=1e-6)  # always corrected with minmax
    assert min(sides) >= 10 and max(sides) <= 20 and len(set(sides)) > 4


def test_each_mode_draws_lam_per_batch_pair_or_sample():
    images, labels, values = _constant_batch(8)
    shares = {}
    for mode in MIX_MODES:
        mixed, _ = Mixup(num_classes=8, mixup_alpha=1.0, mode=mode, seed=11)(images, labels)
        shares[mode] = _own_share(mixed.numpy(), values)
    assert np.allclose(shares["batch"], shares["batch"][0])
    pair = shares["pair"]
    np.testing.assert_allclose(pair, pair[::-1], atol=1e-6)  # a pair shares its lam
    assert len(np.unique(pair.round(5))) == 4
    elem = shares["elem"]
    assert len(np.unique(elem.round(5))) == 8  # every sample its own lam, also within a pair


def test_lam_follows_beta_alpha_alpha_and_switch_prob_picks_cutmix():
    mixup = Mixup(num_classes=2, mixup_alpha=0.3, cutmix_alpha=1.0, switch_prob=0.25, mode="elem", seed=2)
    params = mixup.draw(4000, 32, 32)
    use_cutmix = params.blend == 1.0
    assert 0.22 < use_cutmix.mean() < 0.28
    # Mixup's lam is the Beta(0.3, 0.3) draw itself.
    assert stats.kstest(params.lam[~use_cutmix], stats.beta(0.3, 0.3).cdf).pvalue > 1e-3
    unmixed = Mixup(num_classes=2, mixup_alpha=1.0, prob=0.3, mode="elem", seed=2).draw(4000, 8, 8)
    assert 0.67 < (unmixed.lam == 1.0).mean() < 0.73


def test_label_smoothing_combines_with_the_mix():
    eps, classes = 0.1, 10
    images, labels, values = _constant_batch(4)
    mixed, targets = Mixup(num_classes=classes, mixup_alpha=1.0, label_smoothing=eps, seed=0)(images, labels)
    lam = _own_share(mixed.numpy(), values)[0]
    expected = np.full((4, classes), eps / classes)
    for i in range(4):
        expected[i, i] += lam * (1 - eps)
        expected[i, 3 - i] += (1 - lam) * (1 - eps)
    np.testing.assert_allclose(targets.numpy(), expected, atol=1e-6)
    np.testing.assert_allclose(targets.numpy().sum(1), 1.0, atol=1e-6)
    # Two samples of the same class: the plain smoothed one-hot target, whatever lam.
    _, same = Mixup(num_classes=classes, mixup_alpha=1.0, label_smoothing=eps)(images, paddle.to_tensor([2, 5, 5, 2]))
    np.testing.assert_allclose(same.numpy()[0], np.where(np.arange(classes) == 2, 1 - eps + eps / classes,
                                                         eps / classes), atol=1e-6)


def test_prob_zero_and_disabled_pass_images_through_with_smoothed_targets():
    images, labels, _ = _constant_batch(6)
    for mixup in (Mixup(num_classes=6, prob=0.0, label_smoothing=0.2),
                  Mixup(num_classes=6, cutmix_alpha=1.0, label_smoothing=0.2)):
        if mixup.prob > 0:
            mixup.enabled = False
        mixed, targets = mixup(images, labels)
        np.testing.assert_array_equal(mixed.numpy(), images.numpy())
        np.testing.assert_allclose(targets.numpy(), 0.2 / 6 + 0.8 * np.eye(6), atol=1e-6)


def _draws(mixup, images, labels, n):
    return [tuple(t.numpy() for t in mixup(images, labels)) for _ in range(n)]


def test_state_dict_round_trip_reproduces_the_draws(tmp_path):
    images, labels, _ = _constant_batch(8)
    options = dict(num_classes=8, mixup_alpha=0.8, cutmix_alpha=1.0, mode="elem")
    run = Mixup(seed=7, **options)
    _draws(run, images, labels, 3)
    state = run.state_dict()
    save_checkpoint(tmp_path / "ckpt", {"mixup": state})
    expected = _draws(run, images, labels, 4)

    for saved in (state, load_checkpoint(tmp_path / "ckpt").state["mixup"]):
        resumed = Mixup(seed=123, **options)  # the seed no longer matters once the state is loaded
        resumed.load_state_dict(saved)
        for (xa, ya), (xb, yb) in zip(expected, _draws(resumed, images, labels, 4), strict=True):
            np.testing.assert_array_equal(xa, xb)
            np.testing.assert_array_equal(ya, yb)

    # Seeding: the same (seed, rank) repeats, another seed or rank draws differently.
    first = Mixup(seed=7, **options).draw(8, 12, 10).lam
    np.testing.assert_array_equal(first, Mixup(seed=7, **options).draw(8, 12, 10).lam)
    assert not np.array_equal(first, Mixup(seed=8, **options).draw(8, 12, 10).lam)
    assert not np.array_equal(first, Mixup(seed=7, rank=1, **options).draw(8, 12, 10).lam)


def test_the_draws_ignore_the_global_random_generators():
    images, labels, _ = _constant_batch(8)
    a, b = Mixup(num_classes=8, cutmix_alpha=1.0, seed=1), Mixup(num_classes=8, cutmix_alpha=1.0, seed=1)
    np.random.seed(0)
    paddle.seed(0)
    first = _draws(a, images, labels, 2)
    np.random.seed(99)
    paddle.seed(99)
    for (xa, ya), (xb, yb) in zip(first, _draws(b, images, labels, 2), strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)


@pytest.mark.parametrize("state", [{}, {"bit_generator": {"bit_generator": "MT19937", "state": {}}},
                                   {"bit_generator": {"bit_generator": "PCG64", "state": {"state": "1", "inc": 3},
                                                      "has_uint32": 0, "uinteger": 0}}, [1, 2]])
def test_a_state_that_is_not_a_pcg64_state_is_refused(state):
    with pytest.raises(UserError, match="not a PCG64 generator state"):
        Mixup(num_classes=2).load_state_dict(state)


@pytest.mark.parametrize("kwargs,words", [
    (dict(mixup_alpha=0.0), ["mixup_alpha", "cutmix_alpha", "both 0"]),
    (dict(mixup_alpha=-1.0), ["mixup.mixup_alpha=-1.0"]),
    (dict(mode="sample"), ["mixup.mode='sample'", "batch, pair, elem"]),
    (dict(prob=2.0), ["mixup.prob=2.0"]),
    (dict(switch_prob=-0.1), ["mixup.switch_prob=-0.1"]),
    (dict(label_smoothing=1.0), ["mixup.label_smoothing=1.0"]),
    (dict(cutmix_minmax=(0.8, 0.2)), ["mixup.cutmix_minmax=[0.8, 0.2]"]),
    (dict(num_classes=0), ["mixup.num_classes=0"]),
])
def test_bad_options_name_the_option(kwargs, words):
    kwargs.setdefault("num_classes", 10)
    with pytest.raises(ConfigError) as info:
        Mixup(**kwargs)
    for word in words:
        assert word in str(info.value)
