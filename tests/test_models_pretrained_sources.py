"""Weight sources vision:, paddleclas: and hub:, with caches simulated in tmp dirs (no network)."""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys

import numpy as np
import paddle
import pytest
from paddle.utils import download
from paddle.vision.models import resnet as vision_resnet

from paddletrain.models import PretrainedLoadError, create_model, load_pretrained
from paddletrain.models.weights import describe
from paddletrain.models.weights.mapping import ResNetLayout, source_key


@pytest.fixture(autouse=True)
def isolated_caches(tmp_path, monkeypatch):
    """Every source looks in tmp dirs; nothing can reach the network."""
    monkeypatch.setenv("PADDLETRAIN_WEIGHTS_HOME", str(tmp_path / "weights"))
    monkeypatch.setenv("HUB_HOME", str(tmp_path / "hub"))
    monkeypatch.setenv("PADDLETRAIN_OFFLINE", "1")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # PaddleClas' own cache is ~/.paddleclas/weights
    (tmp_path / "weights").mkdir()


def _source_resnet18(**options):
    paddle.seed(7)
    model = create_model("resnet18", num_classes=1000, **options)
    for layer in model.sublayers():
        if isinstance(layer, paddle.nn.BatchNorm2D):
            layer._mean.set_value(paddle.rand(layer._mean.shape))
            layer._variance.set_value(paddle.rand(layer._variance.shape) + 0.5)
    return model.eval()


def _renamed(model, scheme):
    """The model's weights under another naming (the conversion's inverse, per key)."""
    layout = ResNetLayout.of(model)
    return {source_key(k, scheme, layout): v for k, v in model.state_dict().items()}


def _assert_same_logits(a, b):
    a.eval()
    b.eval()
    x = paddle.rand([2, 3, 64, 64])
    np.testing.assert_allclose(a(x).numpy(), b(x).numpy(), atol=1e-5)


def test_vision_source_uses_the_cached_file_offline(tmp_path, monkeypatch):
    source = _source_resnet18()
    path = tmp_path / "weights" / "resnet18.pdparams"
    paddle.save(source.state_dict(), str(path))
    digest = hashlib.md5(path.read_bytes()).hexdigest()
    # Stand in for paddle.vision's published md5 of resnet18.pdparams.
    monkeypatch.setitem(vision_resnet.model_urls, "resnet18", (vision_resnet.model_urls["resnet18"][0], digest))
    model = create_model("resnet18", pretrained="vision:resnet18")
    _assert_same_logits(model, source)
    assert model.pretrained_cfg["source"] == "vision:resnet18" and model.pretrained_cfg["input_size"] == (3, 224, 224)


def test_vision_cache_miss_offline_names_the_exact_path(tmp_path):
    with pytest.raises(PretrainedLoadError) as info:
        load_pretrained(create_model("resnet50"), "vision:resnet50")
    message = str(info.value)
    expected = tmp_path / "weights" / "resnet50.pdparams"
    assert str(expected) in message and "https://paddle-hapi.bj.bcebos.com/models/resnet50.pdparams" in message
    assert "ca6f485ee1ab0492d38f323885b0ad80" in message  # paddle.vision's md5, to check the file by hand


def test_cached_file_with_another_md5_is_refused(tmp_path):
    (tmp_path / "weights" / "resnet18.pdparams").write_bytes(b"partial download")
    with pytest.raises(PretrainedLoadError, match="md5.*delete it"):
        load_pretrained(create_model("resnet18"), "vision:resnet18")


def test_download_goes_to_the_cache_and_its_failure_says_where_to_put_the_file(tmp_path, monkeypatch):
    monkeypatch.delenv("PADDLETRAIN_OFFLINE")
    source = _source_resnet18(project_first_shortcut=True)
    calls = []

    def fake_download(url, root_dir, md5sum=None, decompress=True, **kwargs):
        calls.append((url, root_dir, md5sum))
        target = f"{root_dir}/{url.rsplit('/', 1)[-1]}"
        paddle.save(_renamed(source, "paddleclas"), target)
        return target

    monkeypatch.setattr(download, "get_path_from_url", fake_download)
    model = create_model("resnet18", project_first_shortcut=True, pretrained="paddleclas:ResNet18")
    _assert_same_logits(model, source)
    assert calls == [("https://paddle-imagenet-models-name.bj.bcebos.com/dygraph/legendary_models/"
                      "ResNet18_pretrained.pdparams", str(tmp_path / "weights"), None)]

    def no_network(*args, **kwargs):
        raise ConnectionError("network unreachable")

    monkeypatch.setattr(download, "get_path_from_url", no_network)
    with pytest.raises(PretrainedLoadError, match="download failed.*network unreachable.*ResNet34_pretrained"):
        load_pretrained(create_model("resnet34"), "paddleclas:ResNet34")


def test_paddleclas_weights_bring_the_first_block_projection_they_need(tmp_path):
    """The Python API and the CLI behave alike: the weight source adds the builder option its weights need."""
    source = _source_resnet18(project_first_shortcut=True)
    paddle.save(_renamed(source, "paddleclas"), str(tmp_path / "weights" / "ResNet18_pretrained.pdparams"))
    assert describe("paddleclas:ResNet18").model_options == {"project_first_shortcut": True}
    model = create_model("resnet18", pretrained="paddleclas:ResNet18")
    assert model.layer1[0].downsample is not None
    np.testing.assert_array_equal(model.conv1.weight.numpy(), source.conv1.weight.numpy())
    # A caller who overrides the option gets the load error that says why.
    with pytest.raises(PretrainedLoadError, match="blocks.0.short.conv.weight.*project_first_shortcut=True"):
        create_model("resnet18", pretrained="paddleclas:ResNet18", project_first_shortcut=False)


def test_paddleclas_finds_the_file_paddleclas_itself_downloaded(tmp_path):
    source = _source_resnet18(project_first_shortcut=True)
    theirs = tmp_path / "home" / ".paddleclas" / "weights"
    theirs.mkdir(parents=True)
    paddle.save(_renamed(source, "paddleclas"), str(theirs / "ResNet18_pretrained.pdparams"))
    assert describe("paddleclas:ResNet18").path == theirs / "ResNet18_pretrained.pdparams"
    model = create_model("resnet18", pretrained="paddleclas:ResNet18")  # offline: no download was possible
    _assert_same_logits(model, source)
    # Our own cache comes first when it has the file too.
    (tmp_path / "weights" / "ResNet18_pretrained.pdparams").write_bytes(b"ours")
    assert describe("paddleclas:ResNet18").path == tmp_path / "weights" / "ResNet18_pretrained.pdparams"


def test_a_paddleclas_cache_miss_offline_names_both_caches(tmp_path):
    with pytest.raises(PretrainedLoadError) as info:
        load_pretrained(create_model("resnet34"), "paddleclas:ResNet34")
    message = str(info.value)
    assert f"put it at {tmp_path / 'weights' / 'ResNet34_pretrained.pdparams'}" in message
    assert f"or in PaddleClas' own cache {tmp_path / 'home' / '.paddleclas' / 'weights'}" in message


def test_unknown_names_list_the_available_ones():
    with pytest.raises(PretrainedLoadError, match="vision:resnet19.*resnet18"):
        describe("vision:resnet19")
    with pytest.raises(PretrainedLoadError, match="paddleclas:ResNet50_vx.*ResNet50_vd"):
        describe("paddleclas:ResNet50_vx")


def test_vision_builder_names_find_their_scaled_weights():
    assert describe("vision:mobilenet_v2").url.endswith("mobilenet_v2_x1.0.pdparams")
    assert describe("vision:inception_v3").preprocessing["input_size"] == (3, 299, 299)


def test_hub_module_directory_is_read_with_its_labels(tmp_path):
    paddle.seed(5)
    source = create_model("resnet18_vd", num_classes=3).eval()
    module = tmp_path / "hub" / "modules" / "resnet18_vd_tiny"
    module.mkdir(parents=True)
    paddle.save(_renamed(source, "paddlehub"), str(module / "resnet18_vd.pdparams"))
    (module / "label_list.txt").write_text("ant\nbee\nwasp\n")
    model = create_model("resnet18_vd", num_classes=3, pretrained="hub:resnet18_vd_tiny")
    _assert_same_logits(model, source)
    assert model.pretrained_cfg["label_names"] == ["ant", "bee", "wasp"]


def test_missing_hub_module_says_where_it_was_looked_for(tmp_path):
    with pytest.raises(PretrainedLoadError) as info:
        load_pretrained(create_model("resnet50_vd"), "hub:resnet50_vd_imagenet_ssld")
    message = str(info.value)
    assert str(tmp_path / "hub" / "modules" / "resnet50_vd_imagenet_ssld") in message
    assert "hub install resnet50_vd_imagenet_ssld" in message


def _hub_module_dir(tmp_path, name="resnet18_vd_tiny"):
    """A PaddleHub module directory holding a small model's weights (PaddleHub naming) and labels."""
    paddle.seed(5)
    source = create_model("resnet18_vd", num_classes=3).eval()
    module = tmp_path / "hub" / "modules" / name
    module.mkdir(parents=True)
    paddle.save(_renamed(source, "paddlehub"), str(module / "resnet18_vd.pdparams"))
    (module / "label_list.txt").write_text("ant\nbee\nwasp\n")
    return source, module


def _fake_paddlehub(tmp_path, monkeypatch, init_source):
    """Put a stand-in ``paddlehub`` package first on sys.path (the real one cannot be installed here)."""
    package = tmp_path / "site" / "paddlehub"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(init_source)
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.delitem(sys.modules, "paddlehub", raising=False)
    importlib.invalidate_caches()


def test_a_broken_paddlehub_install_falls_back_to_the_module_directory(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("PADDLETRAIN_OFFLINE")
    source, module = _hub_module_dir(tmp_path)
    # What paddlehub raises under protobuf >= 4 when its generated _pb2 modules are older.
    _fake_paddlehub(tmp_path, monkeypatch, "raise TypeError('Descriptors cannot be created directly.\\n"
                                           "If this call came from a _pb2.py file, your generated code is out of "
                                           "date')\n")
    model = create_model("resnet18_vd", num_classes=3, pretrained="hub:resnet18_vd_tiny")
    _assert_same_logits(model, source)
    assert model.pretrained_cfg["label_names"] == ["ant", "bee", "wasp"]
    assert ("paddlehub cannot be imported (TypeError: Descriptors cannot be created directly.); reading the "
            f"module directory {module} instead") in caplog.text


# A module that, like PaddleHub's, names its parameters from Paddle's global counter and loads its weights
# file by those names: the second module of a process gets other names unless the counter is reset.
NAME_KEYED_PADDLEHUB = """
import numpy as np
from paddletrain.models import create_model

calls = []


def Module(name):
    calls.append(name)
    model = create_model("resnet18_vd", num_classes=3)
    weights = np.load(WEIGHTS)
    for tensor in model.state_dict().values():
        if tensor.name not in weights:
            raise KeyError(f"no weights for parameter {tensor.name}")
        tensor.set_value(weights[tensor.name])
    model.labels = ["ant", "bee", "wasp"]
    return model
"""


def test_a_second_hub_model_in_the_same_process_loads_too(tmp_path, monkeypatch):
    monkeypatch.delenv("PADDLETRAIN_OFFLINE")
    paddle.seed(3)
    with paddle.utils.unique_name.guard():  # the names a fresh process gives the module's parameters
        source = create_model("resnet18_vd", num_classes=3).eval()
        np.savez(tmp_path / "weights.npz", **{t.name: t.numpy() for t in source.state_dict().values()})
    _fake_paddlehub(tmp_path, monkeypatch, f"WEIGHTS = {str(tmp_path / 'weights.npz')!r}\n{NAME_KEYED_PADDLEHUB}")
    create_model("resnet18", num_classes=3)  # other layers made earlier in the process advance the counter
    first = create_model("resnet18_vd", num_classes=3, pretrained="hub:resnet18_vd_imagenet")
    second = create_model("resnet18_vd", num_classes=3, pretrained="hub:resnet18_vd_imagenet")
    _assert_same_logits(first, source)
    _assert_same_logits(second, source)
    assert sys.modules["paddlehub"].calls == ["resnet18_vd_imagenet"] * 2


def test_offline_never_asks_paddlehub_and_reads_the_module_directory(tmp_path, monkeypatch):
    source, _ = _hub_module_dir(tmp_path)
    _fake_paddlehub(tmp_path, monkeypatch, "def Module(name):\n    raise AssertionError('contacted the hub server')\n")
    model = create_model("resnet18_vd", num_classes=3, pretrained="hub:resnet18_vd_tiny")  # offline (fixture)
    _assert_same_logits(model, source)
    with pytest.raises(PretrainedLoadError, match="PADDLETRAIN_OFFLINE is set.*hub install resnet50_vd_x"):
        load_pretrained(create_model("resnet50_vd"), "hub:resnet50_vd_x")
