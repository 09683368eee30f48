"""Pretrained weight loading from local files, with the load report and strict/head rules."""
from __future__ import annotations

import numpy as np
import paddle
import pytest
from safetensors.numpy import save_file

from paddletrain.models import LoadReport, PretrainedLoadError, create_model, load_pretrained


def numpy_state(model: paddle.nn.Layer) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in model.state_dict().items()}


@pytest.fixture
def source():
    """A trained-looking resnet20 (10 classes) with non-default BN statistics."""
    paddle.seed(3)
    model = create_model("resnet20", num_classes=10)
    for layer in model.sublayers():
        if isinstance(layer, paddle.nn.BatchNorm2D):
            layer._mean.set_value(paddle.rand(layer._mean.shape))
            layer._variance.set_value(paddle.rand(layer._variance.shape) + 0.5)
    model.eval()
    return model


@pytest.fixture
def weights(tmp_path, source):
    path = tmp_path / "resnet20.safetensors"
    save_file(numpy_state(source), str(path))
    return path


def test_round_trip_reproduces_logits(weights, source):
    model = create_model("resnet20", num_classes=10)
    report = load_pretrained(model, str(weights))
    assert isinstance(report, LoadReport)
    assert sorted(report.matched) == sorted(source.state_dict())
    assert not (report.missing or report.unexpected or report.shape_mismatched or report.head_reinitialised)
    model.eval()
    x = paddle.rand([2, 3, 32, 32])
    np.testing.assert_allclose(model(x).numpy(), source(x).numpy(), atol=1e-6)
    assert "Loaded" in str(report) and str(weights) in str(report)


def test_create_model_loads_pretrained(weights, source):
    model = create_model("resnet20", num_classes=10, pretrained=str(weights))
    np.testing.assert_array_equal(model.conv1.weight.numpy(), source.conv1.weight.numpy())


def test_other_num_classes_keeps_fresh_head_and_says_so(weights, source):
    paddle.seed(11)
    model = create_model("resnet20", num_classes=3)
    fresh_head = model.fc.weight.numpy().copy()
    report = load_pretrained(model, str(weights))
    assert report.head_reinitialised
    assert {k for k, _, _ in report.shape_mismatched} == {"fc.weight", "fc.bias"}
    assert ("fc.weight", (64, 10), (64, 3)) in report.shape_mismatched
    np.testing.assert_array_equal(model.fc.weight.numpy(), fresh_head)
    np.testing.assert_array_equal(model.layer3[2].conv2.weight.numpy(), source.layer3[2].conv2.weight.numpy())
    assert "classifier head" in str(report) and "fc.weight [64, 10] vs model [64, 3]" in str(report)


def test_feature_extractor_ignores_the_files_head(weights):
    model = create_model("resnet20", num_classes=0)
    report = load_pretrained(model, str(weights))
    assert sorted(report.unexpected) == ["fc.bias", "fc.weight"]
    assert not report.missing


def test_strict_lists_missing_and_mismatched_backbone_keys(tmp_path, source):
    state = numpy_state(source)
    del state["layer2.0.downsample.0.weight"]
    state["layer1.0.conv1.weight"] = np.zeros((16, 16, 5, 5), dtype="float32")
    state["extra.weight"] = np.zeros(3, dtype="float32")
    path = tmp_path / "broken.safetensors"
    save_file(state, str(path))
    model = create_model("resnet20", num_classes=10)
    with pytest.raises(PretrainedLoadError) as info:
        load_pretrained(model, str(path))
    message = str(info.value)
    for expected in ("layer2.0.downsample.0.weight", "layer1.0.conv1.weight", "[16, 16, 5, 5]", "extra.weight",
                     "broken.safetensors", "strict=False"):
        assert expected in message
    # Non-strict loads the rest and reports the gaps.
    report = load_pretrained(model, str(path), strict=False)
    assert report.missing == ["layer2.0.downsample.0.weight"] and report.unexpected == ["extra.weight"]
    assert [k for k, _, _ in report.shape_mismatched] == ["layer1.0.conv1.weight"]
    np.testing.assert_array_equal(model.layer3[0].conv1.weight.numpy(), state["layer3.0.conv1.weight"])


def test_float16_file_is_cast_to_the_models_dtype(tmp_path, source):
    path = tmp_path / "half.safetensors"
    save_file({k: v.astype("float16") for k, v in numpy_state(source).items()}, str(path))
    model = create_model("resnet20", num_classes=10)
    load_pretrained(model, str(path))
    assert model.conv1.weight.dtype == paddle.float32
    np.testing.assert_allclose(model.conv1.weight.numpy(), source.conv1.weight.numpy(), rtol=1e-3, atol=1e-3)


def test_pickles_need_explicit_trust(tmp_path, source):
    path = tmp_path / "resnet20.pdparams"
    paddle.save(source.state_dict(), str(path))
    model = create_model("resnet20", num_classes=10)
    with pytest.raises(PretrainedLoadError, match="trust_pickle=True"):
        load_pretrained(model, str(path))
    report = load_pretrained(model, str(path), trust_pickle=True)
    assert len(report.matched) == len(source.state_dict())
    np.testing.assert_array_equal(model.fc.weight.numpy(), source.fc.weight.numpy())


@pytest.mark.parametrize(
    "name, content, match",
    [
        ("missing.safetensors", None, "not found"),
        ("corrupt.safetensors", b"not a safetensors file", "Cannot read safetensors"),
        ("weights.npz", b"", "Unsupported weight file.*safetensors"),
    ],
)
def test_unreadable_sources_raise_clear_errors(tmp_path, name, content, match):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(PretrainedLoadError, match=match) as info:
        load_pretrained(create_model("resnet20", num_classes=10), str(path))
    assert name in str(info.value)
