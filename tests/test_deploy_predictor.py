"""Predictor: an exported model in Paddle Inference agrees with the dygraph model, at any batch size."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import paddle
import pytest
from omegaconf import OmegaConf
from PIL import Image

import paddletrain
from paddletrain.config import DataConfig
from paddletrain.data import build_transform, preprocessing_info
from paddletrain.deploy.exporter import TOLERANCE, compare_logits, export_model, export_onnx
from paddletrain.deploy.predictor import (
    OnnxPredictor,
    Predictor,
    Preprocessing,
    backend_choice,
    check_precision_runs_on,
    choose_backend,
    cpu_bf16_support,
    find_graph_file,
    load_predictor,
)
from paddletrain.errors import UserError
from paddletrain.models import create_model

LABELS = ["cat", "dog", "fox", "owl"]
SIZE = 16
HAS_GPU = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0
needs_cpu_bf16 = pytest.mark.skipif(cpu_bf16_support() == "none",
                                    reason="needs a CPU with AVX-512 (oneDNN bfloat16)")


def data_config(**overrides):
    return OmegaConf.structured(DataConfig(image_size=SIZE, **overrides))


def reference(model, batch):
    model.eval()
    with paddle.no_grad():
        return model(paddle.to_tensor(batch)).numpy()


def assert_close(actual, expected):
    report = compare_logits(actual, expected, TOLERANCE["fp32"])
    assert report.passed and report.top1_agreement == 1.0, report


@pytest.fixture(scope="module")
def model():
    paddle.seed(0)
    net = create_model("resnet20", num_classes=len(LABELS))
    # Random BN statistics, so eval-mode BatchNorm is not the identity and a train-mode export would differ.
    for name, buffer in net.named_buffers():
        if "_mean" in name or "_variance" in name:
            buffer.set_value(np.random.default_rng(1).uniform(0.5, 1.5, buffer.shape).astype("float32"))
    return net.eval()


@pytest.fixture(scope="module")
def exported(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("export")
    return export_model(model, out, input_size=(3, SIZE, SIZE), preprocessing=preprocessing_info(data_config()),
                        labels=LABELS)


def test_paddle_writes_a_graph_the_predictor_finds(exported):
    assert find_graph_file(exported).name in ("model.json", "model.pdmodel")
    assert (exported / "model.pdiparams").is_file()


@pytest.mark.parametrize("batch_size", [1, 5])
def test_dynamic_batch_matches_dygraph(model, exported, batch_size):
    predictor = Predictor(exported, device="cpu", cpu_threads=1)
    batch = np.random.default_rng(batch_size).standard_normal((batch_size, 3, SIZE, SIZE)).astype("float32")
    logits = predictor.predict(batch)
    assert logits.shape == (batch_size, len(LABELS))
    assert_close(logits, reference(model, batch))


def test_without_mkldnn_matches_too(model, exported):
    batch = np.random.default_rng(7).standard_normal((3, 3, SIZE, SIZE)).astype("float32")
    assert_close(Predictor(exported, device="cpu", use_mkldnn=False).predict(batch), reference(model, batch))


def test_fixed_batch_export_splits_and_pads_any_batch(model, tmp_path):
    out = export_model(model, tmp_path, input_size=(3, SIZE, SIZE), batch=4)
    predictor = Predictor(out, device="cpu")
    assert predictor.fixed_batch == 4 == json.loads((out / "preprocess.json").read_text())["batch"]
    for n in (1, 4, 9):
        batch = np.random.default_rng(n).standard_normal((n, 3, SIZE, SIZE)).astype("float32")
        assert_close(predictor.predict(batch), reference(model, batch))


def test_probabilities_sum_to_one_and_keep_the_ranking(exported):
    predictor = Predictor(exported, device="cpu")
    batch = np.random.default_rng(3).standard_normal((2, 3, SIZE, SIZE)).astype("float32")
    probs = predictor.predict(batch, probs=True)
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(probs.argmax(1), predictor.predict(batch).argmax(1))


def test_preprocess_json_describes_input_and_labels(exported):
    meta = json.loads((exported / "preprocess.json").read_text())
    assert meta["input_size"] == [3, SIZE, SIZE]
    assert meta["batch"] is None and meta["precision"] == "fp32"
    assert meta["labels"] == LABELS
    assert meta["mean"] == [0.5, 0.5, 0.5] and meta["std"] == [0.5, 0.5, 0.5]
    assert meta["resize_mode"] == "exact" and meta["resize"] == SIZE and meta["interpolation"] == "bilinear"
    predictor = Predictor(exported, device="cpu")
    assert predictor.labels == LABELS and predictor.input_size == (3, SIZE, SIZE)


@pytest.mark.parametrize("preset", ["imagenet", "small"])
def test_exported_preprocessing_reproduces_the_eval_transform(preset):
    cfg = data_config(eval_transform=preset, interpolation="bicubic", mean=[0.4, 0.5, 0.6], std=[0.2, 0.3, 0.4])
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (23, 31, 3), dtype=np.uint8))
    ours = Preprocessing(json.loads(json.dumps(preprocessing_info(cfg))))(image)
    assert ours.shape == (3, SIZE, SIZE)
    np.testing.assert_array_equal(ours, build_transform(cfg, train=False)(image))


def test_wrong_input_shape_is_a_clear_error(exported):
    with pytest.raises(UserError, match=r"\(N, 3, 16, 16\)"):
        Predictor(exported, device="cpu").predict(np.zeros((2, 3, 8, 8), np.float32))


def test_missing_or_empty_model_dir_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="not a directory"):
        Predictor(tmp_path / "nope")
    with pytest.raises(UserError, match="holds no exported model"):
        Predictor(tmp_path)


@pytest.mark.skipif(HAS_GPU, reason="checks the CPU-only behaviour")
def test_fp16_without_gpu_is_refused_not_faked(model, exported, tmp_path):
    with pytest.raises(UserError, match="GPU"):
        Predictor(exported, device="cpu", precision="fp16")
    with pytest.raises(UserError, match="precision=fp32"):
        export_model(model, tmp_path, input_size=(3, SIZE, SIZE), precision="fp16")
    assert not list(tmp_path.iterdir())


@needs_cpu_bf16
def test_bf16_runs_in_bfloat16_within_its_tolerance(model, exported):
    batch = np.random.default_rng(11).standard_normal((4, 3, SIZE, SIZE)).astype("float32")
    expected = reference(model, batch)
    predictor = Predictor(exported, device="cpu", precision="bf16")
    assert predictor.runtime.precision == "bf16" and predictor.runtime.mkldnn
    report = compare_logits(predictor.predict(batch), expected, TOLERANCE["bf16"])
    # Really bfloat16 (fp32 oneDNN stays within ~1e-6 of dygraph), and still the same model.
    assert report.passed and 1e-4 < report.relative_error


@needs_cpu_bf16
def test_a_bf16_export_records_its_precision_for_the_predictor(model, tmp_path):
    out = export_model(model, tmp_path, input_size=(3, SIZE, SIZE), precision="bf16")
    assert json.loads((out / "preprocess.json").read_text())["precision"] == "bf16"
    assert Predictor(out, device="cpu").runtime.precision == "bf16"
    assert Predictor(out, device="cpu", precision="fp32").runtime.precision == "fp32"


@needs_cpu_bf16
def test_device_auto_runs_bf16_on_the_cpu_even_where_there_is_a_gpu(exported, monkeypatch):
    monkeypatch.setattr("paddletrain.deploy.predictor._resolve_device", lambda device: "gpu")
    assert Predictor(exported, precision="bf16").runtime.device == "cpu"
    with pytest.raises(UserError, match="on a GPU use precision=fp16"):
        Predictor(exported, device="gpu", precision="bf16")


def test_bf16_is_refused_where_it_cannot_run(exported, tmp_path, monkeypatch):
    with pytest.raises(UserError, match="use_mkldnn=false"):
        Predictor(exported, device="cpu", precision="bf16", use_mkldnn=False)
    with pytest.raises(UserError, match="on a GPU use precision=fp16"):
        check_precision_runs_on("bf16", "gpu")
    monkeypatch.setattr("paddletrain.deploy.predictor.cpu_bf16_support", lambda: "none")
    with pytest.raises(UserError, match="no bfloat16 support"):
        Predictor(exported, device="cpu", precision="bf16")
    with pytest.raises(UserError, match="precision=fp32"):
        export_model(create_model("resnet20", num_classes=2), tmp_path, input_size=(3, SIZE, SIZE), precision="bf16")
    assert not list(tmp_path.iterdir())


def test_predictor_is_part_of_the_public_api():
    assert paddletrain.Predictor is Predictor


def test_an_nhwc_graph_under_onednn_fails_with_the_workaround_named(tmp_path):
    nhwc = create_model("resnet20", num_classes=2, data_format="NHWC")
    out = export_model(nhwc, tmp_path, input_size=(3, SIZE, SIZE))
    batch = np.zeros((1, 3, SIZE, SIZE), np.float32)
    with pytest.raises(UserError, match="use_mkldnn=False"):
        Predictor(out, device="cpu").predict(batch)
    assert_close(Predictor(out, device="cpu", use_mkldnn=False).predict(batch), reference(nhwc, batch))


def test_an_unknown_precision_names_the_choices(exported):
    with pytest.raises(UserError, match="precision='int4' is not one of fp32, fp16, bf16"):
        Predictor(exported, device="cpu", precision="int4")


def test_int8_is_chosen_at_export_not_at_run_time(exported):
    with pytest.raises(UserError, match="int8 is chosen at export"):
        Predictor(exported, precision="int8")


@pytest.mark.parametrize("device, use_mkldnn, message", [("gpu", True, "on a GPU use precision=fp16"),
                                                          ("cpu", False, "runs through oneDNN")])
def test_int8_is_refused_where_it_cannot_run(device, use_mkldnn, message):
    with pytest.raises(UserError, match=message):
        check_precision_runs_on("int8", device, use_mkldnn)
@pytest.fixture(scope="module")
def both_models(exported, tmp_path_factory):
    """The export with its model.onnx beside the Paddle graph, as `export format=onnx` writes it."""
    pytest.importorskip("paddle2onnx", reason="exporting ONNX needs the onnx extra (paddle2onnx)")
    pytest.importorskip("onnxruntime", reason="running ONNX needs the onnx extra (onnxruntime)")
    copy = tmp_path_factory.mktemp("both") / "export"
    shutil.copytree(exported, copy)
    export_onnx(copy)
    return copy


def test_auto_runs_an_fp32_export_with_both_models_in_onnxruntime_with_the_same_logits(model, both_models):
    batch = np.random.default_rng(3).standard_normal((5, 3, SIZE, SIZE)).astype(np.float32)
    chosen = load_predictor(both_models, device="cpu", cpu_threads=1)
    assert isinstance(chosen, OnnxPredictor) and chosen.runtime.backend == "onnx"
    assert chosen.runtime.describe().startswith("onnxruntime ")
    assert "backend=auto: onnxruntime runs fp32 faster than Paddle Inference" in chosen.runtime.describe()
    paddle_run = load_predictor(both_models, backend="paddle", device="cpu", cpu_threads=1)
    assert isinstance(paddle_run, Predictor) and paddle_run.runtime.describe().startswith("Paddle Inference ")
    assert_close(chosen.predict(batch), reference(model, batch))
    assert_close(chosen.predict(batch), paddle_run.predict(batch))


@pytest.mark.parametrize("precision, options, reason", [
    ("bf16", {}, "bf16 runs in Paddle Inference"),
    ("fp32", {"use_mkldnn": False}, "use_mkldnn=False asks for Paddle Inference"),
    ("fp32", {"tensorrt": True}, "tensorrt=True asks for Paddle Inference"),
    ("int8", {}, "int8 runs in Paddle Inference"),
    ("fp16", {}, "fp16 runs in Paddle Inference (onnxruntime not yet compared in this precision)"),
])
def test_auto_keeps_paddle_where_onnxruntime_is_not_the_faster_or_not_asked_for(both_models, precision, options,
                                                                               reason):
    # Only the choice: a bf16 or TensorRT predictor cannot be built on every machine.
    assert backend_choice(both_models, "auto", precision, "cpu", **options) == ("paddle", f"backend=auto: {reason}")


def test_auto_falls_back_to_paddle_and_says_why(both_models, exported, monkeypatch):
    assert choose_backend(exported, "auto", device="cpu") == "paddle"  # no model.onnx
    assert choose_backend(both_models, "auto", device="gpu") == "paddle"  # not measured on GPUs
    assert choose_backend(both_models / "model.onnx") == "onnx"
    assert choose_backend(both_models, "paddle") == "paddle" and choose_backend(exported, "onnx") == "onnx"
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # as if not installed
    backend, reason = backend_choice(both_models, "auto", device="cpu")
    assert backend == "paddle" and "onnxruntime runs fp32 faster on a CPU but is not installed" in reason
    predictor = load_predictor(both_models, device="cpu", cpu_threads=1)
    assert isinstance(predictor, Predictor) and "not installed" in predictor.runtime.describe()


def test_auto_reads_the_precision_the_export_records(both_models, tmp_path):
    copy = tmp_path / "bf16"
    shutil.copytree(both_models, copy)
    meta = json.loads((copy / "preprocess.json").read_text())
    (copy / "preprocess.json").write_text(json.dumps({**meta, "precision": "bf16"}))
    assert choose_backend(copy, device="cpu") == "paddle"
    assert choose_backend(copy, device="cpu", precision="fp32") == "onnx"  # the caller's precision wins


PROGRAMDESC_EXPORT = """
import sys
import paddle
from paddletrain.deploy.exporter import export_model
from paddletrain.models import create_model
paddle.seed(0)
export_model(create_model("resnet20", num_classes=4).eval(), sys.argv[1], input_size=(3, 16, 16))
"""


def _run_without_memory_optimisation(model_dir, batch):
    """The Paddle Inference configuration the Predictor used before it turned memory optimisation on."""
    from paddle import inference

    config = inference.Config(str(model_dir / "model.pdmodel"), str(model_dir / "model.pdiparams"))
    config.disable_glog_info()
    config.set_cpu_math_library_num_threads(1)
    config.enable_mkldnn()
    predictor = inference.create_predictor(config)
    handle = predictor.get_input_handle(predictor.get_input_names()[0])
    handle.reshape(list(batch.shape))
    handle.copy_from_cpu(batch)
    predictor.run()
    return predictor.get_output_handle(predictor.get_output_names()[0]).copy_to_cpu()


def test_a_programdesc_graph_runs_with_memory_optimisation_and_the_same_logits(tmp_path):
    # Paddle 3 writes PIR (model.json); the older ProgramDesc format (model.pdmodel) is chosen when the process
    # starts, so the export runs in a fresh process.
    result = subprocess.run([sys.executable, "-c", PROGRAMDESC_EXPORT, str(tmp_path)], capture_output=True, text=True,
                            env={**os.environ, "FLAGS_enable_pir_api": "0"}, timeout=300)
    assert result.returncode == 0, result.stderr
    assert find_graph_file(tmp_path).name == "model.pdmodel"
    paddle.seed(0)
    model = create_model("resnet20", num_classes=4).eval()
    batch = np.random.default_rng(4).standard_normal((3, 3, SIZE, SIZE)).astype(np.float32)
    predictor = Predictor(tmp_path, device="cpu", cpu_threads=1)
    assert predictor.runtime.memory_optim and "memory reuse" in predictor.runtime.describe()
    logits = predictor.predict(batch)
    assert_close(logits, reference(model, batch))
    np.testing.assert_allclose(logits, _run_without_memory_optimisation(tmp_path, batch), rtol=0, atol=1e-6)


def test_a_pir_graph_runs_without_memory_optimisation(exported):
    # enable_memory_optim() makes Paddle 3.3 refuse a PIR graph (memory_optimize_pass is not in its pipeline)
    assert not Predictor(exported, device="cpu", cpu_threads=1).runtime.memory_optim
