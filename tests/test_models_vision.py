"""model=vision: paddle.vision architectures behind the model contract, loaded and fine-tuned through fit."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import paddle
import pytest

import paddletrain.models.vision  # noqa: F401  (registers model=vision)
from paddletrain.build import build_callbacks, resolve_preprocessing, train
from paddletrain.callbacks import BackboneFreeze, FreezeBatchNorm
from paddletrain.errors import ConfigError
from paddletrain.models import create_model, load_pretrained
from paddletrain.models.pretrained import save_pretrained
from paddletrain.models.vision import list_vision_archs
from paddletrain.validation import validate_config
from tests.conftest import TINY, compose_fit


def test_any_builder_gets_the_contract():
    model = create_model("vision", arch="mobilenet_v2", num_classes=4, scale=0.35)
    assert isinstance(model, paddle.vision.models.MobileNetV2)
    cfg = model.pretrained_cfg
    assert (cfg["classifier"], cfg["first_conv"], cfg["architecture"]) == ("classifier.1", "features.0.0",
                                                                           "mobilenet_v2")
    assert model.get_classifier() is model.classifier[1] and model.num_features == 1280
    model.reset_classifier(7)
    model.eval()
    assert model(paddle.rand([1, 3, 32, 32])).shape == [1, 7] and model.num_classes == 7


def test_squeezenet_head_is_its_class_conv():
    model = create_model("vision", arch="squeezenet1_1", num_classes=5)
    assert model.pretrained_cfg["classifier"] == "_conv9" and model.num_features == 512


def test_vision_weights_load_by_their_own_names_and_adapt_to_grey_input(tmp_path):
    paddle.seed(4)
    reference = paddle.vision.models.shufflenet_v2_x0_25(num_classes=10)
    reference.eval()
    path = tmp_path / "shufflenet.safetensors"
    paddle.save(reference.state_dict(), str(tmp_path / "shufflenet.pdparams"))
    model = create_model("vision", arch="shufflenet_v2_x0_25", num_classes=10,
                         pretrained=str(tmp_path / "shufflenet.pdparams"))
    model.eval()
    x = paddle.rand([2, 3, 32, 32])
    np.testing.assert_allclose(model(x).numpy(), reference(x).numpy(), atol=1e-5)

    save_pretrained(model, str(path))
    grey = create_model("vision", arch="shufflenet_v2_x0_25", num_classes=2, in_chans=1)
    report = load_pretrained(grey, str(path))
    assert report.head_reinitialised and report.input_conv_adapted == "_conv1.0.weight: summed 3 -> 1"
    assert grey.pretrained_cfg["input_size"] == (1, 224, 224) and len(grey.pretrained_cfg["mean"]) == 1


@pytest.mark.parametrize("options, match", [
    ({}, "needs model.arch"),
    ({"arch": "resnet19"}, "'resnet19' is not a paddle.vision.models builder.*resnet18"),
    ({"arch": "googlenet"}, "several outputs"),
    ({"arch": "resnet18", "drop_rate": 0.2}, "model.drop_rate is not supported"),
    ({"arch": "resnet18", "num_classes": 0}, "num_classes >= 1"),
])
def test_bad_options_name_the_key(options, match):
    with pytest.raises(ConfigError, match=match):
        create_model("vision", **{"num_classes": 3, **options})


def test_list_vision_archs_holds_builders_only():
    archs = list_vision_archs()
    assert {"resnet18", "shufflenet_v2_x0_25", "mobilenet_v3_small"} <= set(archs)
    assert "ResNet" not in archs and "resnet" not in archs  # classes and modules are not builders


def test_fit_finetunes_a_vision_model_with_the_weights_preprocessing(tmp_path):
    """model=vision through fit: weights' preprocessing fills null data keys; freeze + head LR are wired."""
    paddle.seed(0)
    source = create_model("vision", arch="shufflenet_v2_x0_25", num_classes=1000)
    source.pretrained_cfg = {**source.pretrained_cfg, "input_size": (3, 20, 20), "mean": (0.4, 0.5, 0.6),
                             "std": (0.2, 0.25, 0.3), "crop_pct": 0.8}
    weights = tmp_path / "shufflenet.safetensors"
    save_pretrained(source, str(weights))
    overrides = [o for o in TINY if not o.startswith("data.image_size")] + [
        "model=vision", "model.arch=shufflenet_v2_x0_25", f"model.pretrained={weights}",
        "data.image_size=null", "data.mean=null", "data.std=null",
        "trainer.max_epochs=2", "+callbacks.backbone_freeze.epochs=1", "+callbacks.freeze_bn={}",
        "optim.head_lr_mult=10", "callbacks.visualdl=null", "callbacks.checkpoint=null",
    ]
    cfg = compose_fit(overrides)
    resolved = resolve_preprocessing(cfg)
    assert resolved.data.image_size == 20 and list(resolved.data.mean) == pytest.approx([0.4, 0.5, 0.6])
    assert resolved.data.eval_resize == 25 and cfg.data.image_size is None  # the input config is not modified
    assert list(resolve_preprocessing(compose_fit([*overrides, "model.pretrained=null"])).data.mean) == [0.5] * 3

    built = build_callbacks(resolved)
    assert [type(c) for c in built if isinstance(c, (BackboneFreeze, FreezeBatchNorm))] == [BackboneFreeze,
                                                                                          FreezeBatchNorm]
    assert next(c for c in built if isinstance(c, BackboneFreeze)).epochs == 1

    (tmp_path / "run").mkdir()
    metrics = train(cfg, tmp_path / "run")
    assert 0.0 <= metrics["val/top1"] <= 1.0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["epochs"] == 2


@pytest.mark.parametrize("experiment", ["finetune_shufflenet_imagefolder", "finetune_resnet50_vd_imagefolder"])
def test_finetune_experiments_compose_and_validate(experiment):

    configs = Path(__file__).resolve().parents[1] / "configs"
    cfg = compose_fit([f"hydra.searchpath=[file://{configs}]", f"+experiment={experiment}", "data.root=/data/x"])
    validate_config(cfg)
    assert cfg.model.pretrained and cfg.callbacks.backbone_freeze.epochs >= 1
    assert cfg.data.mean is None and cfg.data.image_size is None  # taken from the weights
