"""Schema validation: every preset composes; unknown keys, wrong types, bad choices and missing values fail."""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ValidationError

from paddletrain.config import (
    COMPONENT_GROUPS,
    SCHEMAS,
    AmpConfig,
    DataConfig,
    LossConfig,
    MixupConfig,
    ModelConfig,
    OptimConfig,
    SchedConfig,
    TrainerConfig,
    factory_options,
)
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


# ---------------------------------------------------------------------------------------------- valid by construction
def _nested_schemas(schema: type, prefix: str):
    """(schema, its dotted place) for every dataclass field below ``schema``, recursively."""
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        if dataclasses.is_dataclass(hints[f.name]):
            yield hints[f.name], f"{prefix}{f.name}."
            yield from _nested_schemas(hints[f.name], f"{prefix}{f.name}.")


def test_each_schema_names_its_own_place_in_the_full_config():
    places = dict(_nested_schemas(TrainerConfig, "trainer."))
    places.update(_nested_schemas(DataConfig, "data."))
    places.update({schema: f"{group}." for group, schema in SCHEMAS.items() if group in COMPONENT_GROUPS})
    places[TrainerConfig] = "trainer."
    assert places and all(schema.KEY == place for schema, place in places.items()), places


@pytest.mark.parametrize("make, message", [
    (lambda: OptimConfig(momentum=1.0), "optim.momentum=1.0 must be >= 0 and < 1"),
    (lambda: SchedConfig(name="onecycle", pct_start=1.5), "sched.pct_start=1.5 must be > 0 and < 1"),
    (lambda: LossConfig(label_smoothing=-0.1), "loss.label_smoothing=-0.1 must be >= 0 and < 1"),
    (lambda: DataConfig(train_transform="cifar"), "data.train_transform='cifar' is not allowed"),
    (lambda: MixupConfig(prob=2.0), "data.mixup.prob=2.0 must be"),
    (lambda: ModelConfig(width=0.0), "model.width=0.0 must be > 0"),
    (lambda: AmpConfig(level="O3"), "trainer.amp.level='O3' is not allowed"),
    (lambda: TrainerConfig(max_epochs=0), "trainer.max_epochs=0 must be >= 1"),
])
def test_a_schema_instance_made_in_python_is_checked_when_constructed(make, message):
    # The builders trust the config they get: a hand-made one is refused here, with validation's message.
    with pytest.raises(ConfigError) as info:
        make()
    assert str(info.value).startswith(message)


def test_factory_options_are_each_groups_undeclared_keys():
    cfg = compose_fit(["+loss.epsilon=2.0", "+model.global_pool=avgmax"])
    options = factory_options(cfg)
    assert set(options) == set(COMPONENT_GROUPS)
    assert options["loss"] == {"epsilon": 2.0} and options["model"] == {"global_pool": "avgmax"}
    assert options["optim"] == options["sched"] == options["data"] == {}
