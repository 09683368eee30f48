"""ship: one command exports a checkpoint to every target, scores each against the checkpoint and names the first
diverging layer of a target that disagrees."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import paddle
import pytest
from omegaconf import OmegaConf
from PIL import Image

import paddletrain.deploy.exporter as exporting
from paddletrain.build import train
from paddletrain.checkpoint import find_latest, load_checkpoint
from paddletrain.deploy.divergence import Prefix, find_divergence, layer_chain, relative_error
from paddletrain.deploy.predictor import cpu_bf16_support
from paddletrain.deploy.shipping import TARGETS, ShipConfig, compare_targets, layer_tolerance
from paddletrain.errors import ExitCode, UserError
from paddletrain.evaluate import evaluate
from paddletrain.models import create_model
from paddletrain.rebuild import checkpoint_config, rebuild_checkpoint
from paddletrain.ship import run
from tests.conftest import command_code, compose_fit, run_module, write_multilabel_squares

HAS_ONNX = all(importlib.util.find_spec(m) for m in ("paddle2onnx", "onnxruntime"))
PADDLE_ONLY = tuple(t for t in TARGETS if t.name == "paddle-fp32")
FAST = dict(timing_runs=2, cpu_threads=1)
# The layer the broken-runtime tests corrupt: a block in the middle of resnet20, so bisection has links on both sides.
BROKEN = "layer2.1"
COLOURS = {"red": (200, 40, 40), "blue": (40, 40, 200)}


def _write_colour_folder(root: Path) -> None:
    """Two classes a resnet20 learns in three epochs: noisy reddish and bluish 16x16 images (24 train, 6 val each).

    Measured over training seeds 0-5: best val top-1 1.0 for every seed (with 12 training images per class, two
    epochs and the default warmup, 0.5-1.0), so the report's reference is far above chance and a broken target
    has points to lose."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 24), ("val", 6)):
        for name, colour in COLOURS.items():
            folder = root / split / name
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = np.clip(np.array(colour) + rng.normal(0, 40, (16, 16, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")


def _colour_fit(root: Path) -> list[str]:
    return [f"data.root={root}", "data.name=imagefolder", "data.image_size=16", "data.batch_size=8",
            "data.num_workers=0", "data.train_transform=small", "data.eval_transform=small", "trainer.max_epochs=3",
            "sched.warmup_epochs=0",
            "trainer.cpu_threads=1", "callbacks.progress_bar.enabled=false", "callbacks.visualdl=null"]


@pytest.fixture(scope="module")
def colour_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("colours")
    _write_colour_folder(root)
    return root


@pytest.fixture(scope="module")
def run_dir(colour_data, tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("run")
    train(compose_fit(_colour_fit(colour_data)), run_dir)
    return run_dir


@pytest.fixture(scope="module")
def shipped(run_dir, tmp_path_factory):
    """``python -m paddletrain.ship`` on the colour run, as a user runs it: its result and out_dir."""
    out = tmp_path_factory.mktemp("ship")
    result = run_module("paddletrain.ship", [f"checkpoint={run_dir}:best", f"out_dir={out}", "timing_runs=2",
                                             f"hydra.run.dir={out / 'hydra'}"], cwd=out)
    return result, out


def _independent_top1(run_dir: Path, overrides: list[str] = ()) -> dict[str, float]:
    """paddletrain.evaluate's metrics of the run's best checkpoint (the Trainer's validation loop)."""
    checkpoint = load_checkpoint(find_latest(run_dir / "checkpoints"))
    cfg = checkpoint_config(checkpoint.state["config"], overrides, source="test")
    return evaluate(cfg, checkpoint)


def test_the_cli_reports_every_runnable_target_and_names_the_skipped_ones(shipped):
    result, out = shipped
    assert result.returncode == ExitCode.OK, result.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    by_name = {t["target"]: t for t in report["targets"]}
    assert list(by_name) == [t.name for t in TARGETS]
    assert by_name["paddle-fp32"]["status"] == "ok"
    assert by_name["onnx-fp32"]["status"] == ("ok" if HAS_ONNX else "skipped")
    assert by_name["paddle-bf16"]["status"] == ("ok" if cpu_bf16_support() == "fast" else "skipped")
    assert by_name["paddle-int8"]["status"] == ("ok" if "int8" in exporting.PRECISIONS else "skipped")
    for target in report["targets"]:
        if target["status"] == "skipped":
            assert target["reason"] and target["score"] is None
        else:
            # fp32 runtimes reproduce the checkpoint; bf16 (on CPUs that have it) within its own tolerance; int8
            # is judged by agreement and accuracy (the report's tolerance), its logits only by the layer bound.
            assert target["relative_logit_error"] < layer_tolerance(target["precision"])
            assert target["agreement"] == 1.0 or target["precision"] != "fp32"
            assert 0 < target["latency_ms_p50"] <= target["latency_ms_p95"]
            assert set(target["throughput"]) == {"8", "32"} and all(v > 0 for v in target["throughput"].values())
            graph = "model.pdmodel" if target["precision"] == "int8" else "model.json"  # int8: ProgramDesc
            runtime_files = ["model.onnx"] if target["format"] == "onnx" else [graph, "model.pdiparams"]
            assert target["size_bytes"] == sum((Path(target["export_dir"]) / f).stat().st_size for f in runtime_files)
    markdown = (out / "report.md").read_text()
    assert markdown.count("\n| ") == 2 + len(TARGETS) and "PASS" in markdown.splitlines()[0]
    assert all(f"| {t.name} |" in markdown for t in TARGETS)
    assert "checkpoint (dygraph)" in result.stdout
    # A skipped target is named with its reason; on a CPU with native bf16 and the onnx extra none is skipped.
    skipped = [t for t in report["targets"] if t["status"] == "skipped"]
    assert ("skipped: " in result.stdout) == bool(skipped)
    lines = result.stdout.splitlines()
    assert all(any(line.startswith(t["target"]) and f"skipped: {t['reason']}" in line for line in lines)
               for t in skipped)


def test_accuracies_equal_an_independent_evaluation(shipped, run_dir):
    _, out = shipped
    report = json.loads((out / "report.json").read_text())
    reference = _independent_top1(run_dir)["val/top1"]
    assert report["metric"] == "top1" and report["num_images"] == 12
    assert report["reference_score"] == pytest.approx(reference, abs=1e-9)
    assert reference >= 0.9  # the run learned: a broken target has something to lose
    for target in report["targets"]:
        if target["status"] == "ok" and target["precision"] == "fp32":
            assert target["score"] == pytest.approx(reference, abs=1e-9) and target["delta_points"] == 0.0


def _break_layer(monkeypatch, name: str = BROKEN) -> None:
    """Every export (the whole model's and each prefix's) writes ``name``'s first conv with its weights scaled
    by -8: a target whose one layer is broken, in the real runtime."""
    real = exporting.export_model

    def broken_export(model, out_dir, *args, **kwargs):
        layer = dict(model.named_sublayers()).get(f"{name}.conv1")
        if layer is None:
            return real(model, out_dir, *args, **kwargs)
        saved = layer.weight.numpy().copy()
        layer.weight.set_value(saved * -8.0)
        try:
            return real(model, out_dir, *args, **kwargs)
        finally:
            layer.weight.set_value(saved)

    monkeypatch.setattr(exporting, "export_model", broken_export)


def test_a_target_that_drops_exits_3_and_names_its_first_diverging_layer(run_dir, tmp_path, monkeypatch, capsys):
    # Measured over training seeds 0-5 of this run: the broken target scored 0.0-0.5 against the checkpoint's 1.0
    # (a drop of 50-100 points, agreement 0-50%), and bisection named BROKEN every time.
    _break_layer(monkeypatch)
    monkeypatch.setattr("paddletrain.deploy.shipping.TARGETS", PADDLE_ONLY)
    cfg = OmegaConf.merge(OmegaConf.structured(ShipConfig),
                          {"checkpoint": f"{run_dir}:best", "out_dir": str(tmp_path), **FAST})
    assert run(cfg) == ExitCode.BAD_RESULT
    target = json.loads((tmp_path / "report.json").read_text())["targets"][0]
    assert target["delta_points"] < -1.0 and target["agreement"] < 0.99
    assert target["divergence"]["layer"] == BROKEN
    checked = dict(target["divergence"]["checked"])
    assert checked[BROKEN] > target["divergence"]["tolerance"]
    assert all(error <= target["divergence"]["tolerance"] for link, error in checked.items()
               if layer_chain_index(link) < layer_chain_index(BROKEN))
    assert f"first diverging layer: {BROKEN}" in capsys.readouterr().out


def layer_chain_index(link: str) -> int:
    return layer_chain(create_model("resnet20", num_classes=2)).index(link)


def test_a_tolerance_of_zero_passes_a_target_identical_to_the_checkpoint(run_dir, tmp_path):
    report = compare_targets(f"{run_dir}:best", tmp_path, tolerance=0.0, targets=PADDLE_ONLY, **FAST)
    assert report.passed and report.targets[0].divergence is None


def test_int8_targets_calibrate_on_the_training_split_by_default(run_dir, colour_data, tmp_path, monkeypatch):
    # Until the int8 export exists: an int8 target's call is recorded, then run as fp32 so the report completes.
    calls = []
    real = exporting.export_checkpoint

    def record(checkpoint, out_dir, **kwargs):
        calls.append(kwargs)
        kwargs = {k: v for k, v in kwargs.items() if k not in ("calibration", "calibration_images")}
        return real(checkpoint, out_dir, **{**kwargs, "precision": "fp32"})

    monkeypatch.setattr(exporting, "export_checkpoint", record)
    int8 = tuple(t for t in TARGETS if t.name == "paddle-int8")
    report = compare_targets(f"{run_dir}:best", tmp_path, calibration_images=32, targets=int8, **FAST)
    assert report.targets[0].status == "ok"
    assert calls[0]["precision"] == "int8" and calls[0]["calibration_images"] == 32
    assert calls[0]["calibration"] == str(colour_data / "train")  # never the validation set being scored
    compare_targets(f"{run_dir}:best", tmp_path, calibration=str(tmp_path), targets=int8, **FAST)
    assert calls[1]["calibration"] == str(tmp_path)


@pytest.fixture(scope="module")
def chain_model():
    paddle.seed(0)
    model = create_model("resnet20", num_classes=3)
    model.eval()
    return model


def test_the_chain_of_a_resnet_reproduces_it_and_keeps_its_weight_names(chain_model):
    links = layer_chain(chain_model)
    assert links[:4] == ["conv1", "bn1", "act1", "maxpool"] and links[-1] == "head" and "layer3.2" in links
    x = paddle.to_tensor(np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype("float32"))
    with paddle.no_grad():
        np.testing.assert_array_equal(Prefix(chain_model, links)(x).numpy(), chain_model(x).numpy())
    prefix = Prefix(chain_model, links[:links.index("layer2.0") + 1])
    assert {n for n, _ in prefix.named_parameters()} <= {n for n, _ in chain_model.named_parameters()}
    assert "layer2.0.conv1.weight" in dict(prefix.named_parameters())


@pytest.mark.parametrize("broken", ["conv1", "layer3.2"])  # the first link, and the last block (BROKEN: above)
def test_bisection_names_the_broken_layer_wherever_it_is(chain_model, broken, tmp_path, monkeypatch):
    if broken == "conv1":
        _break_stem(monkeypatch)
    else:
        _break_layer(monkeypatch, broken)
    inputs = np.random.default_rng(1).standard_normal((4, 3, 16, 16)).astype("float32")
    found = find_divergence(chain_model, inputs, PADDLE_ONLY[0].run_layer, exporting.TOLERANCE["fp32"])
    assert found.layer == broken and found.relative_error > found.tolerance
    assert len(found.checked) <= 1 + int(np.ceil(np.log2(len(layer_chain(chain_model)))))


@pytest.mark.skipif(not HAS_ONNX, reason="needs paddle2onnx and onnxruntime (pip install -e '.[onnx]')")
def test_bisection_runs_each_prefix_through_onnxruntime_for_an_onnx_target(chain_model, monkeypatch):
    _break_layer(monkeypatch, BROKEN)
    onnx_fp32 = next(t for t in TARGETS if t.name == "onnx-fp32")
    inputs = np.random.default_rng(3).standard_normal((4, 3, 16, 16)).astype("float32")
    found = find_divergence(chain_model, inputs, onnx_fp32.run_layer, exporting.TOLERANCE["fp32"])
    assert found.layer == BROKEN


def _break_stem(monkeypatch) -> None:
    real = exporting.export_model

    def broken_export(model, out_dir, *args, **kwargs):
        conv = dict(model.named_sublayers())["conv1"]
        saved = conv.weight.numpy().copy()
        conv.weight.set_value(-saved)
        try:
            return real(model, out_dir, *args, **kwargs)
        finally:
            conv.weight.set_value(saved)

    monkeypatch.setattr(exporting, "export_model", broken_export)


def test_a_sound_target_names_no_layer_and_says_why(chain_model):
    inputs = np.random.default_rng(2).standard_normal((2, 3, 16, 16)).astype("float32")
    found = find_divergence(chain_model, inputs, PADDLE_ONLY[0].run_layer, exporting.TOLERANCE["fp32"])
    assert found.layer is None and "within tolerance" in found.reason and len(found.checked) == 1


def test_a_model_that_is_not_a_chain_is_reported_not_guessed():
    class TwoPaths(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.a = paddle.nn.Conv2D(3, 4, 3, padding=1)
            self.b = paddle.nn.Conv2D(3, 4, 3, padding=1)

        def forward(self, x):
            return self.a(x) + self.b(x)

    found = find_divergence(TwoPaths(), np.ones((1, 3, 8, 8), np.float32), PADDLE_ONLY[0].run_layer, 1e-3)
    assert found.layer is None and "is not a chain of its sub-layers" in found.reason and not found.checked


def test_a_label_list_and_a_folder_score_the_same_images_as_the_split(shipped, run_dir, colour_data, tmp_path):
    lines = [f"val/{name}/{i}.png {label}\n" for label, name in enumerate(sorted(COLOURS)) for i in range(6)]
    (tmp_path / "val.txt").write_text("".join(lines))
    split = json.loads((shipped[1] / "report.json").read_text())
    # targets=(): the checkpoint's own score only, which is what the validation set changes.
    listed = compare_targets(f"{run_dir}:best", tmp_path / "list", val=str(tmp_path / "val.txt"),
                             val_root=str(colour_data), targets=())
    folder = compare_targets(f"{run_dir}:best", tmp_path / "folder", val=str(colour_data / "val"), targets=())
    assert listed.num_images == folder.num_images == split["num_images"] == 12
    assert listed.reference_score == folder.reference_score == split["reference_score"]
    assert listed.val == str(tmp_path / "val.txt") and folder.val == str(colour_data / "val")
    (tmp_path / "val.txt").write_text("val/red/0.png 7\n")
    with pytest.raises(UserError, match=r"val=.*val\.txt"):
        compare_targets(f"{run_dir}:best", tmp_path / "bad", val=str(tmp_path / "val.txt"),
                        val_root=str(colour_data), targets=())


def test_a_preprocess_json_that_differs_from_training_fails_the_report(run_dir, tmp_path, monkeypatch):
    # Targets and checkpoint share the export's preprocessing; the report also holds it against training's eval
    # transform, here made to feed BGR as a mistaken pipeline would.
    real = rebuild_checkpoint

    def bgr_trained(*args, **kwargs):
        rebuilt = real(*args, **kwargs)
        transform = rebuilt.eval_transform
        rebuilt.eval_transform = lambda image: transform(image)[::-1].copy()
        return rebuilt

    sound = compare_targets(f"{run_dir}:best", tmp_path / "sound", targets=())
    assert sound.preprocess_max_diff == 0.0 and sound.passed
    monkeypatch.setattr("paddletrain.deploy.shipping.rebuild_checkpoint", bgr_trained)
    report = compare_targets(f"{run_dir}:best", tmp_path / "bgr", targets=())
    assert report.preprocess_max_diff > 0.1 and not report.preprocessing_matches and not report.passed
    assert "FAIL: preprocessing" in (tmp_path / "bgr" / "report.md").read_text()


def test_a_folder_of_other_classes_and_a_missing_val_are_one_clear_error(run_dir, tmp_path):
    (tmp_path / "val" / "green").mkdir(parents=True)
    with pytest.raises(UserError, match=r"class folders \['green'\] are not classes of the checkpoint"):
        compare_targets(f"{run_dir}:best", tmp_path / "out", val=str(tmp_path / "val"), targets=PADDLE_ONLY)
    with pytest.raises(UserError, match="val='nowhere' is neither a folder of class folders nor a label list"):
        compare_targets(f"{run_dir}:best", tmp_path / "out", val="nowhere", targets=PADDLE_ONLY)
    with pytest.raises(UserError, match="tolerance=-1"):
        compare_targets(f"{run_dir}:best", tmp_path / "out", tolerance=-1)


@pytest.mark.parametrize("keys, message", [
    ({}, "missing required value for checkpoint"),
    ({"checkpoint": "nowhere:best"}, "checkpoint=nowhere"),
    ({"checkpoint": "nowhere:best", "val": "x", "tolerance": -1.0}, "tolerance=-1.0"),
])
def test_user_errors_exit_2_with_one_line(keys, message, tmp_path, caplog):
    cfg = OmegaConf.merge(OmegaConf.structured(ShipConfig), {"out_dir": str(tmp_path), **keys})
    assert command_code(run, cfg) == ExitCode.USER_ERROR
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and message in errors[0] and "\n" not in errors[0]


def test_help_lists_the_keys_and_an_example(tmp_path, monkeypatch, capsys):
    from tests.test_cli_help import help_of

    monkeypatch.chdir(tmp_path)
    code, text = help_of("paddletrain.ship", ["--help"], monkeypatch, capsys)
    assert code == 0 and text.startswith("python -m paddletrain.ship") and "Examples:" in text
    for key in ("checkpoint: ???", "tolerance: 1.0", "calibration: null", "val: null"):
        assert key in text
    assert not any(tmp_path.iterdir())


# ---------------------------------------------------------------------------------------------------------------
# Multi-label: mAP



@pytest.fixture(scope="module")
def multilabel_run(tmp_path_factory) -> tuple[Path, Path]:
    """A resnet20 trained on 16x16 images holding 2 of 4 coloured squares (PaddleClas multi-label lists)."""
    root = write_multilabel_squares(tmp_path_factory.mktemp("squares"))
    run_dir = tmp_path_factory.mktemp("mlrun")
    train(compose_fit(["data=labellist", "data.multilabel=true", f"data.root={root}", "data.train_list=train_list.txt",
                       "data.val_list=val_list.txt", "data.image_size=16", "data.batch_size=8", "data.num_workers=0",
                       "trainer.max_epochs=2", "trainer.cpu_threads=1", "callbacks.progress_bar.enabled=false",
                       "callbacks.visualdl=null", "data.train_transform=small", "data.eval_transform=small"]), run_dir)
    return root, run_dir


def test_a_multilabel_model_is_scored_by_map_equal_to_evaluate(multilabel_run, tmp_path):
    root, run_dir = multilabel_run
    report = compare_targets(f"{run_dir}:best", tmp_path, val=str(root / "val_list.txt"), val_root=str(root),
                             targets=PADDLE_ONLY, **FAST)
    assert report.metric == "mAP" and report.num_images == 12
    assert report.reference_score == pytest.approx(_independent_top1(run_dir)["val/mAP"], abs=1e-6)
    assert report.targets[0].score == pytest.approx(report.reference_score, abs=1e-6)
    assert report.targets[0].agreement == 1.0 and report.passed
    assert "| mAP |" in (tmp_path / "report.md").read_text()
    with pytest.raises(UserError, match="is a folder, but the checkpoint is a multi-label model"):
        compare_targets(f"{run_dir}:best", tmp_path, val=str(root / "val"), targets=PADDLE_ONLY)


@pytest.mark.parametrize("name", ["paddle-int8", "onnx-int8"])
def test_an_int8_prefix_runs_quantized_in_its_runtime_within_the_layer_bound(chain_model, name, tmp_path, capfd):
    """The layer-by-layer search of an int8 target quantizes each prefix (calibrated on the compared inputs) and
    runs it in the target's runtime: its output moves (int8 ran), but by far less than a broken layer's. Nothing
    of it reaches stdout, which carries ship's table (onnxruntime's calibration prints its progress there)."""
    target = next(t for t in TARGETS if t.name == name)
    if target.unavailable():
        pytest.skip(target.unavailable())
    links = layer_chain(chain_model)
    prefix = Prefix(chain_model, links[:links.index("layer2.0") + 1])
    inputs = np.random.default_rng(4).standard_normal((8, 3, 16, 16)).astype("float32")
    with paddle.no_grad():
        reference = prefix(paddle.to_tensor(inputs)).numpy()
    error = relative_error(target.run_layer(prefix, (3, 16, 16), inputs, tmp_path, cpu_threads=1), reference)
    assert 1e-4 < error < layer_tolerance("int8") / 2, error  # measured 0.02 (Paddle), 0.05 (ONNX QDQ)
    assert capfd.readouterr().out == ""
