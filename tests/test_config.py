"""Schema validation: every preset composes; unknown keys, wrong types, bad choices and missing values fail."""
from __future__ import annotations

from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from paddletrain.errors import ConfigError
from paddletrain.validation import validate_config
from tests.conftest import compose_fit

CONF = Path(__file__).resolve().parents[1] / "paddletrain" / "conf"


def test_default_config_is_valid():
    cfg = compose_fit()
    validate_config(cfg)
    assert cfg.model.name == "resnet20" and cfg.data.name == "shapes" and cfg.optim.name == "adamw"


@pytest.mark.parametrize("group", ["model", "data", "optim", "sched", "trainer"])
def test_every_preset_composes(group):
    presets = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
    assert presets
    for preset in presets:
        cfg = compose_fit([f"{group}={preset}"])
        assert cfg[group] is not None


def test_overrides_reach_typed_values():
    cfg = compose_fit(["model=resnet50", "optim.lr=0.05", "trainer.max_epochs=90", "trainer.amp.enabled=true",
                       "trainer.amp.level=O2"])
    assert cfg.model.name == "resnet50" and cfg.optim.lr == 0.05 and cfg.trainer.amp.level == "O2"
    assert isinstance(cfg.trainer.max_epochs, int)


@pytest.mark.parametrize("override, key", [
    ("trainer.max_epoch=3", "max_epoch"),
    ("+trainer.foo=1", "foo"),
    ("+bogus=1", "bogus"),
    ("optim.lr=fast", "lr"),
    ("trainer.max_epochs=1.5", "max_epochs"),
    ("model=resnet9000", "resnet9000"),
])
def test_bad_override_names_the_key(override, key):
    with pytest.raises((ConfigCompositionException, ValidationError, ConfigError)) as info:
        validate_config(compose_fit([override]))
    message = str(info.value) + str(info.value.__cause__ or "")
    assert key in message


@pytest.mark.parametrize("override, key", [
    ("optim.name=rmsprob", "optim.name"),
    ("sched.name=cosin", "sched.name"),
    ("loss.name=bce", "loss.name"),
    ("+callbacks.early_stoping.patience=3", "callbacks.early_stoping"),
    ("trainer.amp.level=O3", "trainer.amp.level"),
    ("model.data_format=NWHC", "model.data_format"),
    ("data.batch_size=0", "data.batch_size"),
])
def test_bad_choice_names_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate_config(compose_fit([override]))


def test_missing_required_value_names_the_key():
    with pytest.raises(ConfigError, match=r"data\.root"):
        validate_config(compose_fit(["data=imagefolder"]))


@pytest.mark.parametrize("overrides, key", [
    (["data.image_size=64", "data.eval_resize=48"], "data.image_size=64"),
    (["data.image_size=16", "data.eval_image_size=64", "data.eval_resize=48"], "data.eval_image_size=64"),
])
def test_an_eval_resize_below_the_eval_crop_names_both_keys(overrides, key):
    cfg = compose_fit(["data.eval_transform=imagenet", *overrides])
    with pytest.raises(ConfigError, match=rf"data.eval_resize=48 is smaller than the evaluation crop {key}"):
        validate_config(cfg)
    validate_config(compose_fit(["data.eval_transform=small", *overrides]))  # no crop: resize exact to the size
