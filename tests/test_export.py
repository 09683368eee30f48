"""Export: a training checkpoint becomes a Paddle Inference model that provably matches it."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import logging
import os
import subprocess
import sys
import types

import numpy as np
import paddle
import pytest
from omegaconf import OmegaConf
from PIL import Image

from paddletrain.build import train
from paddletrain.checkpoint import find_latest, load_checkpoint, save_checkpoint
from paddletrain.data import build_datasets
from paddletrain.deploy.batch_prediction import PredictConfig
from paddletrain.deploy.exporter import (
    TOLERANCE,
    ExportConfig,
    _check_images,
    check_parity,
    compare_logits,
    export_checkpoint,
    export_model,
    parse_batch,
    reference_logits,
)
from paddletrain.deploy.predictor import Predictor, cpu_bf16_support
from paddletrain.errors import UserError
from paddletrain.export import run
from paddletrain.models import create_model
from paddletrain.predict import run as predict
from paddletrain.rebuild import rebuild_checkpoint
from tests.conftest import TINY, command_code, compose_fit, run_module

HAS_GPU = paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count() > 0


@pytest.fixture(scope="module")
def data_cfg():
    return compose_fit(TINY).data


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    train(compose_fit([*TINY, "callbacks.visualdl=null"]), run_dir)
    return find_latest(run_dir / "checkpoints")


def test_a_run_directory_with_best_exports_its_best_checkpoint(checkpoint, tmp_path):
    run_dir = checkpoint.parent.parent
    result = export_checkpoint(f"{run_dir}:best", tmp_path, num_check_images=2)
    assert result.passed
    with pytest.raises(UserError, match=r"checkpoint=.*does not exist"):
        export_checkpoint(f"{tmp_path / 'nope'}:best", tmp_path / "out")


def test_export_checkpoint_passes_parity_on_real_validation_images(checkpoint, data_cfg, tmp_path):
    result = export_checkpoint(checkpoint, tmp_path, num_check_images=8)
    assert result.passed
    parity = result.parity
    assert parity.num_images == 8 and parity.top1_agreement == 1.0 and parity.top1_flips == 0
    assert parity.relative_error <= parity.tolerance == TOLERANCE["fp32"]
    assert parity.preprocess_max_diff == 0.0
    assert {p.name for p in result.files} >= {"model.pdiparams", "preprocess.json"}
    meta = json.loads((tmp_path / "preprocess.json").read_text())
    assert meta["labels"] == result.labels == build_datasets(data_cfg).classes
    assert meta["input_size"] == [3, data_cfg.image_size, data_cfg.image_size]
    assert meta["mean"] == list(data_cfg.mean) and meta["std"] == list(data_cfg.std)  # the trained statistics


def test_a_run_evaluated_at_another_size_exports_at_that_size(tmp_path):
    # data.eval_image_size (RSB A3: train 160, test 224): the export's input, preprocessing and parity images are
    # the evaluation size, not the training size.
    run_dir = tmp_path / "run"
    train(compose_fit([*TINY, "callbacks.visualdl=null", "data.eval_image_size=24"]), run_dir)
    result = export_checkpoint(find_latest(run_dir / "checkpoints"), tmp_path / "out", num_check_images=4)
    assert result.passed and result.parity.preprocess_max_diff == 0.0
    meta = json.loads((tmp_path / "out" / "preprocess.json").read_text())
    assert meta["input_size"] == [3, 24, 24] and meta["resize"] == 24


def test_an_nhwc_checkpoint_exports_its_nchw_twin_and_is_verified_against_the_original(checkpoint, tmp_path):
    state = load_checkpoint(checkpoint).state
    state["config"]["model"]["data_format"] = "NHWC"
    nhwc_checkpoint = save_checkpoint(tmp_path / "nhwc", state)
    result = export_checkpoint(nhwc_checkpoint, tmp_path / "out", num_check_images=4)
    assert result.passed and result.parity.top1_agreement == 1.0


def test_weights_that_do_not_fit_the_model_name_each_key_and_both_shapes(checkpoint, tmp_path):
    state = load_checkpoint(checkpoint).state
    state["model"]["conv1.weight"] = np.zeros((16, 1, 3, 3), np.float32)  # trained on another channel count
    state["model"]["fc.bias"] = np.zeros((7,), np.float32)
    state["model"]["extra.weight"] = np.zeros((2,), np.float32)
    bad = save_checkpoint(tmp_path / "bad", state)
    with pytest.raises(UserError) as info:
        export_checkpoint(bad, tmp_path / "out", check=False)
    message = str(info.value)
    assert message.startswith(f"checkpoint={bad}: ") and "\n" not in message
    assert "conv1.weight: checkpoint [16, 1, 3, 3] vs model [16, 3, 3, 3]" in message
    assert "fc.bias: checkpoint [7] vs model [6]" in message  # the shapes dataset has 6 classes
    assert "unexpected (1): extra.weight" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(cpu_bf16_support() == "none", reason="needs a CPU with AVX-512 (oneDNN bfloat16)")
def test_a_bf16_export_is_verified_in_bf16_with_its_own_tolerance(checkpoint, tmp_path):
    result = export_checkpoint(checkpoint, tmp_path, precision="bf16", num_check_images=32)
    assert result.passed and result.parity.top1_flips == 0
    assert result.parity.tolerance == TOLERANCE["bf16"] == 32 * 2.0 ** -8
    # Really rounded to bfloat16 (fp32 oneDNN stays within ~1e-6), and far inside the tolerance.
    assert 1e-4 < result.parity.relative_error <= result.parity.tolerance / 4
    assert json.loads((tmp_path / "preprocess.json").read_text())["precision"] == "bf16"


def test_parity_check_catches_a_model_that_differs(checkpoint, data_cfg, tmp_path):
    result = export_checkpoint(checkpoint, tmp_path, check=False)
    assert result.parity is None and not result.passed
    paddle.seed(123)
    other = create_model("resnet20", num_classes=len(result.labels))
    size = data_cfg.image_size
    inputs = np.random.default_rng(0).standard_normal((4, 3, size, size)).astype("float32")
    report = check_parity(Predictor(tmp_path, device="cpu"), other, inputs, tolerance=1e-3)
    assert not report.passed and report.relative_error > 0.5


@pytest.mark.parametrize("given, parsed", [(None, None), ("dynamic", None), ("3", 3), (8, 8)])
def test_batch_is_dynamic_or_a_positive_int(given, parsed):
    assert parse_batch(given) == parsed


@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5"])
def test_bad_batch_value_names_the_key(bad):
    with pytest.raises(UserError, match="batch="):
        parse_batch(bad)


@pytest.mark.skipif(HAS_GPU, reason="checks the CPU-only behaviour")
def test_fp16_export_without_gpu_is_refused_before_writing(checkpoint, tmp_path):
    with pytest.raises(UserError, match="fp16 only on a GPU"):
        export_checkpoint(checkpoint, tmp_path / "out", precision="fp16")
    assert not (tmp_path / "out").exists()


def test_cli_onnx_without_paddle2onnx_names_the_extra(checkpoint, tmp_path, monkeypatch):
    blocker = tmp_path / "blocked" / "paddle2onnx"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('paddle2onnx hidden by the test')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(blocker.parent), os.environ.get("PYTHONPATH", "")]))
    result = run_module("paddletrain.export", [f"checkpoint={checkpoint}", "format=onnx",
                                               f"out_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path}"],
                        cwd=tmp_path)
    assert result.returncode == 2
    assert "pip install paddletrain[onnx]" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_parity_failure_is_exit_status_3(checkpoint, tmp_path, monkeypatch):
    # A negative tolerance makes every comparison fail: this checks the verdict reaches the exit status.
    monkeypatch.setitem(TOLERANCE, "fp32", -1.0)
    cfg = OmegaConf.structured(ExportConfig(checkpoint=str(checkpoint), out_dir=str(tmp_path)))
    assert run(cfg) == 3
    assert command_code(run, OmegaConf.structured(ExportConfig(checkpoint=str(tmp_path / "nope"),
                                                            out_dir=str(tmp_path)))) == 2


def test_cli_export_then_predict_a_folder_with_a_corrupt_file(checkpoint, data_cfg, tmp_path):
    out = tmp_path / "export"
    result = run_module("paddletrain.export", [f"checkpoint={checkpoint}", f"out_dir={out}",
                                               f"hydra.run.dir={tmp_path / 'h1'}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["parity"]["passed"] and summary["parity"]["top1_agreement"] == 1.0

    # Real validation images of the checkpoint's dataset, saved as files, plus one that is not an image.
    val = build_datasets(data_cfg).val
    images = tmp_path / "images" / "nested"
    images.mkdir(parents=True)
    for i in range(6):
        Image.fromarray(val.load_image(i)).save(images / f"{i}_{val.classes[val.targets[i]]}.png")
    (images.parent / "broken.jpg").write_bytes(b"\xff\xd8 truncated")
    preds = tmp_path / "preds.jsonl"
    result = run_module("paddletrain.predict", [f"model_dir={out}", f"input={images.parent}", "batch_size=4",
                                                "num_workers=1", f"output={preds}", "topk=3",
                                                f"hydra.run.dir={tmp_path / 'h2'}"], cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    lines = [json.loads(line) for line in preds.read_text().splitlines()]
    assert len(lines) == 6
    assert all(len(line["labels"]) == 3 and line["labels"][0] in val.classes for line in lines)
    assert "broken.jpg" in result.stderr and "1 failed" in result.stderr


def test_a_disagreement_on_a_near_tie_is_numerics_but_a_clear_one_is_a_flip():
    reference = np.array([[2.0, 1.9999, 0.0], [3.0, 0.0, 0.0]], np.float32)
    near_tie = np.array([[1.9999, 2.0, 0.0], [3.0, 0.0, 0.0]], np.float32)
    report = compare_logits(near_tie, reference, tolerance=1e-3)
    assert report.passed and report.top1_agreement == 0.5 and report.top1_flips == 0
    swapped = np.array([[2.0, 1.9999, 0.0], [0.0, 3.0, 0.0]], np.float32)
    report = compare_logits(swapped, reference, tolerance=1e-3)
    assert not report.passed and report.top1_flips == 1


def _round_to_bfloat16(array: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), returned as float32."""
    bits = np.ascontiguousarray(array, np.float32).view(np.uint32)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def test_the_bf16_tolerance_admits_bf16_rounding_and_rejects_real_mistakes(checkpoint, tmp_path):
    """On the checkpoint's own validation images, in float32 dygraph (so the verdict is the same on every CPU)."""
    rebuilt = rebuild_checkpoint(checkpoint, None)
    inputs, _ = _check_images(rebuilt.splits, rebuilt.eval_transform,
                              Predictor(export_checkpoint(checkpoint, tmp_path, check=False).out_dir).preprocessing,
                              32)
    model = rebuilt.model
    expected = reference_logits(model, inputs)
    tolerance = TOLERANCE["bf16"]

    # Weights and input rounded to bfloat16 (what a bf16 kernel reads) stay well inside the tolerance.
    rounded = create_model("resnet20", num_classes=expected.shape[1])
    rounded.set_state_dict({k: _round_to_bfloat16(v.numpy()) for k, v in model.state_dict().items()})
    assert compare_logits(reference_logits(rounded, _round_to_bfloat16(inputs)), expected, tolerance).passed

    model.train()  # batch norm on batch statistics
    with paddle.no_grad():
        train_mode_bn = model(paddle.to_tensor(inputs)).numpy()
    model.eval()
    paddle.seed(123)
    mistakes = {
        "batch norm in train mode": train_mode_bn,
        "BGR instead of RGB": reference_logits(model, np.ascontiguousarray(inputs[:, ::-1])),
        "transposed image": reference_logits(model, np.ascontiguousarray(inputs.transpose(0, 1, 3, 2))),
        "unnormalised input": reference_logits(model, inputs * 0.5 + 0.5),
        "other weights": reference_logits(create_model("resnet20", num_classes=expected.shape[1]), inputs),
    }
    for name, logits in mistakes.items():
        report = compare_logits(logits, expected, tolerance)
        assert not report.passed and report.relative_error > tolerance, (name, report)


def test_predict_with_a_checkpoint_exports_it_once_verified_then_predicts(checkpoint, data_cfg, tmp_path, monkeypatch,
                                                                          caplog):
    val = build_datasets(data_cfg).val
    (tmp_path / "images").mkdir()
    for i in range(3):
        Image.fromarray(val.load_image(i)).save(tmp_path / "images" / f"{i}.png")
    preds = tmp_path / "preds.jsonl"
    cfg = OmegaConf.structured(PredictConfig(checkpoint=f"{checkpoint.parent.parent}:last",
                                             input=str(tmp_path / "images"), output=str(preds), num_workers=0,
                                             progress_bar=False, topk=2))
    monkeypatch.setenv("PADDLETRAIN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.INFO, logger="paddletrain"):
        assert predict(cfg) == 0
    [export] = (tmp_path / "cache" / "exports").iterdir()
    assert (export / "preprocess.json").is_file() and "Exported checkpoint=" in caplog.text
    # backend=auto: an fp32 export gets its model.onnx for onnxruntime (the faster fp32 runtime on CPUs) when it can
    with_onnx = all(importlib.util.find_spec(name) for name in ("paddle2onnx", "onnxruntime"))
    assert (export / "model.onnx").is_file() == bool(with_onnx)
    lines = [json.loads(line) for line in preds.read_text().splitlines()]
    assert len(lines) == 3 and all(line["labels"][0] in val.classes for line in lines)
    # A second call reuses the export (the same checkpoint, format and weights) and writes nothing else here.
    made = (export / "preprocess.json").stat().st_mtime_ns
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="paddletrain"):
        assert predict(cfg) == 0
    assert "made earlier" in caplog.text and (export / "preprocess.json").stat().st_mtime_ns == made
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "images", "preds.jsonl"]


def _distributions():
    return sorted((d.metadata["Name"] or "", d.version) for d in importlib.metadata.distributions())


@pytest.mark.parametrize("batch", ["dynamic", "4"])
def test_onnx_export_matches_in_onnxruntime_and_installs_nothing(checkpoint, tmp_path, monkeypatch, batch):
    pytest.importorskip("paddle2onnx", reason="format=onnx needs the onnx extra (paddle2onnx)")
    pytest.importorskip("onnxruntime", reason="the ONNX parity check needs the onnx extra (onnxruntime)")
    # paddle2onnx's default optimizer imports polygraphy after setting POLYGRAPHY_AUTOINSTALL_DEPS=1, and
    # polygraphy then pip-installs onnx_graphsurgeon: a stand-in records whether that step is reached at all.
    folded, started = [], []
    fake = types.ModuleType("polygraphy.backend.onnx")
    fake.fold_constants = lambda model: folded.append(model) or model
    for name, module in (("polygraphy", types.ModuleType("polygraphy")),
                         ("polygraphy.backend", types.ModuleType("polygraphy.backend")),
                         ("polygraphy.backend.onnx", fake)):
        monkeypatch.setitem(sys.modules, name, module)
    real_popen = subprocess.Popen

    class RecordingPopen(real_popen):
        def __init__(self, args, *rest, **kwargs):
            started.append(args)
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", RecordingPopen)
    monkeypatch.delenv("POLYGRAPHY_AUTOINSTALL_DEPS", raising=False)
    before = _distributions()

    result = export_checkpoint(checkpoint, tmp_path, format="onnx", batch=batch, num_check_images=6)  # pads to 8

    assert _distributions() == before
    assert not folded and "POLYGRAPHY_AUTOINSTALL_DEPS" not in os.environ
    assert not [args for args in started if "pip" in str(args)]
    assert (tmp_path / "model.onnx").is_file() and result.passed
    onnx = result.onnx_parity
    # A disagreement on a near tie would be rounding (which differs between CPUs); a clear flip is a bug.
    assert onnx.num_images == 6 and onnx.top1_flips == 0
    assert onnx.relative_error <= onnx.tolerance


def test_cli_onnx_export_at_batch_1_keeps_stdout_to_the_json_summary(checkpoint, tmp_path):
    pytest.importorskip("paddle2onnx", reason="format=onnx needs the onnx extra (paddle2onnx)")
    pytest.importorskip("onnxruntime", reason="the ONNX parity check needs the onnx extra (onnxruntime)")
    result = run_module("paddletrain.export", [f"checkpoint={checkpoint}", "format=onnx", "batch=1",
                                               "num_check_images=4", f"out_dir={tmp_path / 'out'}",
                                               f"hydra.run.dir={tmp_path / 'h'}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    [line] = result.stdout.splitlines()  # paddle2onnx's own progress lines went to stderr
    summary = json.loads(line)
    assert summary["onnx_parity"]["passed"] and summary["onnx_parity"]["top1_flips"] == 0
    assert "model.onnx" in summary["files"] and "Paddle2ONNX" in result.stderr


def test_int8_needs_calibration_inputs_and_only_int8_takes_them(tmp_path):
    model = create_model("resnet20", num_classes=2)
    with pytest.raises(UserError, match="calibration inputs are needed for precision=int8"):
        export_model(model, tmp_path / "a", input_size=(3, 8, 8), precision="int8")
    with pytest.raises(UserError, match="calibration inputs are needed for precision=int8"):
        export_model(model, tmp_path / "b", input_size=(3, 8, 8), calibration=np.zeros((2, 3, 8, 8), np.float32))
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
