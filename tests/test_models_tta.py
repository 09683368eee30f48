"""Test-time augmentation: flip and five-crop views, averaged softmax, and `evaluate tta.*` end to end."""
from __future__ import annotations

import json

import numpy as np
import paddle
import paddle.nn.functional as F
import pytest

from paddletrain.models import create_model
from paddletrain.models.tta import TestTimeAugmentation, five_crops
from tests.conftest import TINY, evaluated, fit_tiny, run_module


def _model():
    paddle.seed(0)
    model = create_model("resnet20", num_classes=5)
    model.eval()
    return model


def _probs(model, images):
    with paddle.no_grad():
        return F.softmax(model(images).astype("float32"), axis=-1).numpy()


def test_flip_tta_of_a_mirror_symmetric_image_equals_plain_evaluation():
    half = np.random.default_rng(0).standard_normal((2, 3, 16, 8)).astype("float32")
    symmetric = paddle.to_tensor(np.concatenate([half, half[..., ::-1]], axis=-1))
    model = _model()
    np.testing.assert_allclose(_probs(TestTimeAugmentation(model, flip=True), symmetric), _probs(model, symmetric),
                               rtol=1e-5, atol=1e-7)


def test_flip_tta_of_an_asymmetric_image_is_the_mean_of_both_predictions():
    images = paddle.to_tensor(np.random.default_rng(1).standard_normal((2, 3, 16, 16)).astype("float32"))
    model = _model()
    plain, mirrored = _probs(model, images), _probs(model, paddle.flip(images, axis=[3]))
    tta = _probs(TestTimeAugmentation(model, flip=True), images)
    assert np.abs(tta - plain).max() > 1e-4  # the mirror really is a second opinion
    np.testing.assert_allclose(tta, (plain + mirrored) / 2, rtol=1e-5, atol=1e-7)


def test_five_crops_are_the_corners_and_the_centre():
    images = paddle.arange(2 * 1 * 6 * 6, dtype="float32").reshape([2, 1, 6, 6])
    crops = five_crops(images, 4)
    array = images.numpy()
    expected = [array[..., :4, :4], array[..., :4, 2:], array[..., 2:, :4], array[..., 2:, 2:], array[..., 1:5, 1:5]]
    for crop, want in zip(crops, expected, strict=True):
        np.testing.assert_array_equal(crop.numpy(), want)
    views = TestTimeAugmentation(_model(), flip=True, crops=5, crop_size=4).views(images)
    assert len(views) == 10 and all(v.shape == [2, 1, 4, 4] for v in views)
    with pytest.raises(ValueError, match="tta.crops=3"):
        TestTimeAugmentation(_model(), crops=3)


def test_evaluate_with_flip_and_five_crop_tta(tmp_path):
    run_dir = tmp_path / "run"
    trained = run_module("paddletrain.fit", [*TINY, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    checkpoint = sorted(p for p in (run_dir / "checkpoints").iterdir() if p.is_dir())[-1]
    reports = {}
    for name, extra in (("plain", []), ("tta", ["tta.flip=true", "tta.crops=5"])):
        result = run_module("paddletrain.evaluate", [f"checkpoint={checkpoint}", *extra,
                                                     f"hydra.run.dir={tmp_path / name}"], cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        reports[name] = json.loads(result.stdout.strip().splitlines()[-1])
    assert 0.0 <= reports["tta"]["val/top1"] <= 1.0 and reports["tta"]["val/loss"] > 0
    assert reports["tta"]["val/loss"] != reports["plain"]["val/loss"]  # ten views, not the one centre crop
    bad = run_module("paddletrain.evaluate", [f"checkpoint={checkpoint}", "tta.crops=3",
                                              f"hydra.run.dir={tmp_path / 'bad'}"], cwd=tmp_path)
    output = bad.stdout + bad.stderr
    assert bad.returncode == 2 and "tta.crops=3 is not allowed" in output and "Traceback" not in output


def test_translated_views_are_shifted_copies_sharing_their_weight():
    model = _model()
    images = paddle.rand([2, 3, 6, 6])
    tta = TestTimeAugmentation(model, flip=True, translate=1, translate_weight=0.5)
    weighted = tta.weighted_views(images)
    assert len(weighted) == 6 and abs(sum(w for _, w in weighted) - 1.0) < 1e-9
    assert [w for _, w in weighted] == [0.25, 0.25, 0.125, 0.125, 0.125, 0.125]
    up_left = weighted[2][0]  # the image moved one pixel up and left: its pixel (0, 0) is the original's (1, 1)
    np.testing.assert_array_equal(up_left[:, :, :-1, :-1].numpy(), images[:, :, 1:, 1:].numpy())
    expected = sum(w * paddle.nn.functional.softmax(model(v), axis=-1) for v, w in weighted)
    np.testing.assert_allclose(paddle.exp(tta(images)).numpy(), expected.numpy(), rtol=1e-5, atol=1e-7)
    assert not TestTimeAugmentation(model).active and TestTimeAugmentation(model, translate=2).active


def test_fit_validates_with_trainer_tta_and_evaluate_follows_the_run_unless_told(tmp_path):
    run_dir, summary = fit_tiny(tmp_path, "trainer.tta.flip=true", "trainer.tta.translate=1")
    validated = summary["val/loss"]
    followed = evaluated(run_dir, cwd=tmp_path)
    single = evaluated(run_dir, "tta.flip=false", "tta.translate=0", cwd=tmp_path)
    assert followed["tta"] == {"flip": True, "crops": 1, "translate": 1, "translate_weight": 0.5}
    assert followed["val/loss"] == pytest.approx(validated, rel=1e-5)  # the best checkpoint was chosen on this
    assert single["tta"]["flip"] is False and abs(single["val/loss"] - validated) > 1e-4


def test_around_wraps_a_model_only_where_more_than_one_view_is_asked_for():
    model = create_model("resnet20", num_classes=3)
    one_view = {"flip": False, "crops": 1, "translate": 0, "translate_weight": 0.5}
    assert TestTimeAugmentation.around(model, one_view, 32) is None
    flipped = TestTimeAugmentation.around(model, {**one_view, "flip": True}, 32)
    assert flipped.model is model and flipped.flip and flipped.crops == 1
    five = TestTimeAugmentation.around(model, {**one_view, "crops": 5, "translate": 2}, 28)
    assert (five.crops, five.crop_size, five.translate, five.translate_weight) == (5, 28, 2, 0.5)


def test_the_old_builder_of_paddletrain_build_still_works_with_a_deprecation_warning():
    from omegaconf import OmegaConf

    import paddletrain.build

    model = create_model("resnet20", num_classes=3)
    with pytest.warns(DeprecationWarning, match="TestTimeAugmentation.around"):
        layer = paddletrain.build.test_time_augmentation(
            model, {"flip": True, "crops": 5, "translate": 0, "translate_weight": 0.5},
            OmegaConf.create({"image_size": 32, "eval_image_size": 28}))
    assert layer.crop_size == 28 and layer.flip
