"""Model registry: registration, lookup, listing and the errors a user sees."""
from __future__ import annotations

import paddle
import pytest

from paddletrain import plugins as plugins_module
from paddletrain.errors import ConfigError, UserError
from paddletrain.models import ModelOptionError, UnknownModelError, create_model, is_model, list_models, registry
from paddletrain.registry import MODELS


@pytest.fixture
def isolated_registry(monkeypatch):
    """A copy of the registry, so builders registered by a test vanish after it."""
    monkeypatch.setattr(MODELS, "_entries", dict(MODELS._entries))


def test_list_models_is_sorted_and_filtered():
    names = list_models()
    assert names == sorted(names) and "resnet50" in names and "resnet20" in names
    assert list_models("resnet*_vd") == ["resnet101_vd", "resnet152_vd", "resnet18_vd", "resnet34_vd", "resnet50_vd"]
    assert list_models("wide_*") == ["wide_resnet101_2", "wide_resnet50_2"]
    assert list_models("no_such_model*") == []


def test_register_and_create_a_new_model(isolated_registry):
    @registry.register_model
    def tiny_linear(num_classes: int = 1000, in_chans: int = 3, hidden: int = 4) -> paddle.nn.Layer:
        return paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(in_chans * hidden, num_classes))

    assert is_model("tiny_linear") and "tiny_linear" in list_models("tiny_*") and "tiny_linear" in MODELS
    model = create_model("tiny_linear", num_classes=3, in_chans=2, hidden=5)
    assert tuple(model(paddle.rand([2, 2, 5])).shape) == (2, 3)


def test_duplicate_name_is_rejected_naming_both_builders(isolated_registry):
    def resnet50(**kwargs):  # same name as the registered ResNet-50
        raise AssertionError("never built")

    with pytest.raises(ValueError, match=r"model 'resnet50' is already registered by paddletrain\.models\.resnet\."
                                         r"resnet50; rename .*test_duplicate_name"):
        registry.register_model(resnet50)


def test_unknown_model_is_one_line_naming_the_key_and_close_names(monkeypatch):
    monkeypatch.setattr(plugins_module, "_plugins_loaded", True)  # the installed plugins were searched
    with pytest.raises(UnknownModelError) as info:
        create_model("resnet_50")
    message = str(info.value)
    assert message.startswith("unknown model model.name='resnet_50'; did you mean resnet50")
    assert "\n" not in message and isinstance(info.value, ConfigError) and isinstance(info.value, UserError)
    with pytest.raises(UnknownModelError) as info:
        create_model("vgg16")
    # 21 names are too many for one line: the message says how to list them instead, and, with no close name,
    # how another package's model becomes known
    assert "did you mean" not in str(info.value)
    assert f"({len(list_models())} registered, listed by paddletrain.models.list_models()); a model of another " \
           "package needs that package installed (a paddletrain plugin) or its module in imports=[...]" \
           in str(info.value)


def test_unknown_option_names_option_model_and_suggestion():
    with pytest.raises(ModelOptionError, match="resnet20.*'droprate'.*did you mean 'drop_rate'") as info:
        create_model("resnet20", droprate=0.2)
    assert isinstance(info.value, TypeError)  # what Python itself would raise for a bad keyword


def test_explicit_signature_builders_are_checked_too():
    def builder(num_classes: int = 10, in_chans: int = 3) -> None: ...

    registry.check_model_options("b", {"num_classes": 2}, builder)
    with pytest.raises(ModelOptionError, match="'b'.*'width'.*Accepted options: in_chans, num_classes"):
        registry.check_model_options("b", {"width": 2}, builder)


def test_create_model_forwards_classes_channels_and_options():
    model = create_model("resnet20", num_classes=5, in_chans=1, drop_rate=0.1, data_format="NHWC")
    assert model.num_classes == 5 and model.drop_rate == 0.1 and model.data_format == "NHWC"
    assert model.conv1.weight.shape[1] == 1
