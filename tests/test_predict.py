"""predict: inputs from folders, lists and globs; parallel decode; bad files skipped and counted."""
from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
from omegaconf import OmegaConf
from PIL import Image

from paddletrain.deploy.batch_prediction import (
    PredictConfig,
    batch_chunks,
    default_num_workers,
    default_predictor_threads,
    predict_files,
)
from paddletrain.deploy.exporter import export_model, export_onnx
from paddletrain.deploy.inputs import resolve_inputs
from paddletrain.deploy.predictor import Predictor, load_predictor, softmax
from paddletrain.errors import UserError
from paddletrain.models import create_model
from paddletrain.predict import run
from tests.conftest import EXPORT_LABELS, EXPORT_SIZE, command_code, run_module

LABELS, SIZE = EXPORT_LABELS, EXPORT_SIZE


@pytest.fixture(scope="module")
def predictor(export_dir):
    return Predictor(export_dir, device="cpu", cpu_threads=1)


@pytest.fixture
def images(tmp_path):
    """Seven images of assorted sizes and modes in nested folders, one corrupt file and one non-image."""
    rng = np.random.default_rng(0)
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    paths = []
    for i in range(7):
        folder = [tmp_path, tmp_path / "sub", tmp_path / "sub" / "deeper"][i % 3]
        image = Image.fromarray(rng.integers(0, 256, (12 + i, 20, 3), dtype=np.uint8))
        path = folder / f"img{i}.{['png', 'jpg', 'bmp'][i % 3]}"
        (image.convert("L") if i == 4 else image).save(path)
        paths.append(str(path))
    (tmp_path / "sub" / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n but then nothing")
    (tmp_path / "notes.txt").write_text("not an image")
    return tmp_path, sorted(paths)


def expected_top1(predictor, path):
    with Image.open(path) as image:
        logits = predictor.predict(predictor.preprocessing(image)[None])
    return int(logits.argmax()), float(softmax(logits).max())


def test_folder_input_is_recursive_and_keeps_only_images(images):
    root, paths = images
    found = resolve_inputs(str(root))
    assert sorted(found) == sorted(paths + [str(root / "sub" / "corrupt.png")])


def test_list_file_paths_are_relative_to_the_list(images):
    root, paths = images
    listing = root / "list.txt"
    listing.write_text("# a comment\nimg0.png\n\nsub/img1.jpg\n" + paths[2] + "\n")
    assert resolve_inputs(str(listing)) == [str(root / "img0.png"), str(root / "sub" / "img1.jpg"), paths[2]]


def test_glob_input(images):
    root, _ = images
    assert resolve_inputs(str(root / "**" / "*.jpg")) == sorted(str(p) for p in root.rglob("*.jpg"))


@pytest.mark.parametrize("spec, message", [("nothing/here", "neither"), ("*.nope", "matches no files")])
def test_inputs_that_name_nothing_are_user_errors(tmp_path, monkeypatch, spec, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match=message):
        resolve_inputs(spec)


def test_a_single_file_of_another_kind_names_the_supported_extensions(tmp_path):
    gif = tmp_path / "anim.gif"
    Image.new("RGB", (4, 4)).save(gif)
    with pytest.raises(UserError) as error:
        resolve_inputs(str(gif))
    assert str(error.value) == (f"input={str(gif)!r}: .gif files are not supported; images must end with .jpg, .jpeg, "
                                ".png, .ppm, .pgm, .bmp, .tif, .tiff, .webp (any case), and a list of paths with "
                                ".txt or .lst")


@pytest.fixture(scope="module")
def onnx_dir(export_dir, tmp_path_factory):
    pytest.importorskip("paddle2onnx", reason="exporting ONNX needs the onnx extra (paddle2onnx)")
    pytest.importorskip("onnxruntime", reason="running ONNX needs the onnx extra (onnxruntime)")
    copy = tmp_path_factory.mktemp("onnx") / "export"
    shutil.copytree(export_dir, copy)
    export_onnx(copy)
    return copy


@pytest.mark.parametrize("how", ["file", "backend"])
def test_predict_runs_an_onnx_export_with_the_same_pipeline_and_output(predictor, onnx_dir, images, tmp_path, how):
    root, paths = images
    args = ({"model_dir": str(onnx_dir / "model.onnx")} if how == "file"
            else {"model_dir": str(onnx_dir), "backend": "onnx"})
    outputs = {}
    for name, model_args in (("paddle", {"model_dir": str(onnx_dir), "backend": "paddle"}), ("onnx", args)):
        outputs[name] = tmp_path / f"{name}.jsonl"
        cfg = OmegaConf.structured(PredictConfig(input=str(root), output=str(outputs[name]), num_workers=0,
                                                 progress_bar=False, topk=3, **model_args))
        assert run(cfg) == 3  # the corrupt file fails in both
    paddle_lines, onnx_lines = ([json.loads(line) for line in outputs[name].read_text().splitlines()]
                                for name in ("paddle", "onnx"))
    assert [line["path"] for line in onnx_lines] == [line["path"] for line in paddle_lines] == paths
    clear = 0
    for ours, theirs in zip(onnx_lines, paddle_lines, strict=True):
        assert set(ours) == set(theirs) and ours["labels"][0] in LABELS
        assert ours["scores"] == pytest.approx(theirs["scores"], abs=1e-4)
        if theirs["scores"][0] - theirs["scores"][1] > 1e-3:  # not a near tie: the order cannot depend on rounding
            clear += 1
            assert ours["class_ids"][0] == theirs["class_ids"][0] and ours["labels"][0] == theirs["labels"][0]
    assert clear >= len(paths) // 2


def test_an_onnx_backend_without_onnx_file_and_paddle_only_options_are_refused(onnx_dir, export_dir, tmp_path):
    with pytest.raises(UserError, match="is not an ONNX model"):
        load_predictor(export_dir, backend="onnx")
    with pytest.raises(UserError, match="tensorrt=True apply to the Paddle backend only"):
        load_predictor(onnx_dir / "model.onnx", tensorrt=True)
    with pytest.raises(UserError, match="use_mkldnn=False apply to the Paddle backend only"):
        load_predictor(onnx_dir, backend="onnx", use_mkldnn=False)
    assert load_predictor(onnx_dir, backend="onnx", use_mkldnn=True, tensorrt=False).num_classes == len(LABELS)
    with pytest.raises(UserError, match="precision=bf16: the ONNX backend runs the graph as exported"):
        load_predictor(onnx_dir / "model.onnx", precision="bf16")


def test_predict_names_the_runtime_it_chose_in_its_log_and_summary(onnx_dir, images, tmp_path, caplog):
    root, paths = images
    cfg = OmegaConf.structured(PredictConfig(model_dir=str(onnx_dir), input=paths[0], output=str(tmp_path / "p.jsonl"),
                                             num_workers=0, progress_bar=False, device="cpu"))
    with caplog.at_level("INFO", logger="paddletrain"):
        assert run(cfg) == 0
    # the export has both models and records fp32: onnxruntime, the faster fp32 runtime on CPUs
    assert "runtime: onnxruntime " in caplog.text and "OnnxPredictor(" in caplog.text
    assert "backend=auto: onnxruntime runs fp32 faster than Paddle Inference on a CPU" in caplog.text
    summary = predict_files(load_predictor(onnx_dir, backend="paddle", device="cpu", cpu_threads=1), paths[:2],
                            num_workers=0, output=tmp_path / "q.jsonl", progress=False)
    assert summary.runtime.startswith("Paddle Inference ") and "backend=paddle" in summary.runtime
    assert f"; runtime: {summary.runtime}" in str(summary)


def test_model_dir_must_be_an_export_not_a_training_run(images, tmp_path, caplog):
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    cfg = OmegaConf.structured(PredictConfig(model_dir=str(tmp_path / "run"), input=str(images[0])))
    assert command_code(run, cfg) == 2
    assert f"pass checkpoint={tmp_path / 'run'} instead (predict exports it first)" in caplog.text
    neither = OmegaConf.structured(PredictConfig(input=str(images[0])))
    assert command_code(run, neither) == 2
    assert "give model_dir=<export dir or .onnx file> or checkpoint=" in caplog.text


@pytest.mark.parametrize("num_workers", [0, 2])
def test_bad_file_is_skipped_and_the_rest_predicted(predictor, images, num_workers):
    root, paths = images
    inputs = resolve_inputs(str(root)) + [str(root / "missing.png")]
    out = io.StringIO()
    summary = predict_files(predictor, inputs, batch_size=3, num_workers=num_workers, topk=2, output=out,
                            progress=False)
    assert (summary.n_total, summary.n_ok, summary.n_failed) == (len(paths) + 2, len(paths), 2)
    reasons = dict(summary.failures)
    assert "UnidentifiedImageError" in reasons[str(root / "sub" / "corrupt.png")]
    assert "FileNotFoundError" in reasons[str(root / "missing.png")]
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [line["path"] for line in lines] == [p for p in inputs if p in paths]  # input order kept
    for line in lines:
        top1, score = expected_top1(predictor, line["path"])
        assert line["class_ids"][0] == top1 and line["labels"][0] == LABELS[top1]
        assert line["scores"][0] == pytest.approx(score, abs=1e-5) and line["scores"][0] >= line["scores"][1]
    assert summary.images_per_s > 0 and summary.predict_seconds > 0


def test_topk_is_capped_at_the_number_of_classes(predictor, images):
    root, paths = images
    out = io.StringIO()
    predict_files(predictor, paths[:2], topk=10, num_workers=0, output=out, progress=False)
    assert all(sorted(json.loads(line)["labels"]) == LABELS for line in out.getvalue().splitlines())


def test_export_without_preprocessing_cannot_decode_files(tmp_path, images):
    model = create_model("resnet20", num_classes=2)
    predictor = Predictor(export_model(model, tmp_path / "bare", input_size=(3, SIZE, SIZE)), device="cpu")
    with pytest.raises(UserError, match="no preprocessing"):
        predict_files(predictor, images[1], output=io.StringIO(), progress=False)


def test_cli_writes_predictions_to_stdout_and_logs_to_stderr(export_dir, images, tmp_path_factory):
    root, paths = images
    work = tmp_path_factory.mktemp("cli")
    good = work / "good.txt"
    good.write_text("\n".join(paths))
    result = run_module("paddletrain.predict", [f"model_dir={export_dir}", f"input={good}", "batch_size=4",
                                                "num_workers=1", f"hydra.run.dir={work}"], cwd=work)
    assert result.returncode == 0, result.stderr
    assert [json.loads(line)["path"] for line in result.stdout.splitlines()] == paths
    assert "images/s" in result.stderr


def test_exit_status_says_whether_files_failed(export_dir, images, tmp_path):
    root, paths = images
    out = tmp_path / "preds.jsonl"

    def cfg(spec):
        return OmegaConf.structured(PredictConfig(model_dir=str(export_dir), input=spec, output=str(out),
                                                  num_workers=0, progress_bar=False))

    assert run(cfg(str(root))) == 3 and len(out.read_text().splitlines()) == len(paths)
    assert run(cfg(paths[0])) == 0 and len(out.read_text().splitlines()) == 1
    assert command_code(run, cfg(str(tmp_path / "none"))) == 2


def test_the_first_batch_is_small_so_prediction_starts_sooner_and_every_path_is_kept_in_order(export_dir, images,
                                                                                              monkeypatch):
    paths = [f"{i}.jpg" for i in range(70)]
    chunks = batch_chunks(paths, 32)
    assert [len(c) for c in chunks] == [4, 32, 32, 2] and sum(chunks, []) == paths
    assert [len(c) for c in batch_chunks(paths, 32, small_first=False)] == [32, 32, 6]
    assert [len(c) for c in batch_chunks(paths[:20], 32)] == [20] and batch_chunks([], 32) == []
    assert [len(c) for c in batch_chunks(paths[:5], 2)] == [1, 2, 2]
    # predict_files asks for the small first batch only when workers decode ahead and the batch is not fixed
    calls = []
    monkeypatch.setattr("paddletrain.deploy.batch_prediction.batch_chunks",
                        lambda paths, size, small_first: calls.append(small_first) or batch_chunks(paths, size))
    predictor = Predictor(export_dir, device="cpu", cpu_threads=1)
    for workers in (0, 1):
        predict_files(predictor, images[1][:3], batch_size=2, num_workers=workers, output=io.StringIO(),
                      progress=False)
    predictor.fixed_batch = 2
    predict_files(predictor, images[1][:3], batch_size=2, num_workers=1, output=io.StringIO(), progress=False)
    assert calls == [False, True, False]


@pytest.mark.parametrize("cores,workers,threads", [(1, 1, 1), (2, 1, 1), (8, 4, 4), (16, 8, 8)])
def test_decode_workers_and_predictor_threads_share_the_cores(monkeypatch, cores, workers, threads):
    monkeypatch.setattr("paddletrain.devices.usable_cores", lambda: cores)
    assert default_num_workers() == workers
    assert default_predictor_threads(workers) == threads
    assert default_predictor_threads(0) == cores  # decoding in the main process leaves every core



def test_predict_runs_an_int8_export_in_int8_as_it_recorded(images, tmp_path):
    from paddletrain.config import DataConfig
    from paddletrain.data import preprocessing_info

    root, paths = images
    model = create_model("resnet20", num_classes=len(LABELS))
    calibration = np.random.default_rng(0).standard_normal((8, 3, SIZE, SIZE)).astype(np.float32)
    info = preprocessing_info(OmegaConf.structured(DataConfig(image_size=SIZE)))
    int8_dir = export_model(model, tmp_path / "int8", input_size=(3, SIZE, SIZE), preprocessing=info, labels=LABELS,
                            precision="int8", calibration=calibration)
    int8 = Predictor(int8_dir, device="cpu", cpu_threads=1)
    assert int8.runtime.precision == "int8"
    out = tmp_path / "preds.jsonl"
    cfg = OmegaConf.structured(PredictConfig(model_dir=str(int8_dir), input=paths[0], output=str(out),
                                             num_workers=0, progress_bar=False))
    assert run(cfg) == 0
    [line] = [json.loads(text) for text in out.read_text().splitlines()]
    top1, _ = expected_top1(int8, paths[0])
    assert line["labels"][0] == LABELS[top1]


def test_the_hint_for_a_run_given_as_model_dir_runs_as_printed(tmp_path):
    """A run with a best and a last checkpoint: the hint names one of them, and both commands it offers succeed."""
    import shlex

    from tests.conftest import TINY

    folder = tmp_path / "photos"
    folder.mkdir()
    for i in range(2):
        Image.fromarray(np.full((16, 16, 3), 60 * i, np.uint8)).save(folder / f"{i}.png")
    run_dir = tmp_path / "run"
    # The best checkpoint by the highest validation loss: the first epoch's, so best and last differ.
    fit = run_module("paddletrain.fit", [*TINY, "trainer.max_epochs=2", "monitor=val/loss", "monitor_mode=max",
                                         f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr[-2000:]
    refused = run_module("paddletrain.predict", [f"model_dir={run_dir}", f"input={folder}"], cwd=tmp_path)
    said = refused.stdout + refused.stderr
    assert refused.returncode == 2 and "not an export" in said, said[-2000:]
    spec = said.split("pass checkpoint=", 1)[1].split(" instead", 1)[0]
    assert spec.endswith((":best", ":last")), spec  # the run alone names two checkpoints
    exported = said.split("`python -m paddletrain.export ", 1)[1].split("`", 1)[0]
    predicted = run_module("paddletrain.predict", [f"checkpoint={spec}", f"input={folder}", "num_workers=0",
                                                   "progress_bar=false", f"output={tmp_path / 'p.jsonl'}"],
                           cwd=tmp_path)
    assert predicted.returncode == 0, (predicted.stdout + predicted.stderr)[-2000:]
    as_printed = run_module("paddletrain.export", [*shlex.split(exported), f"out_dir={tmp_path / 'export'}"],
                            cwd=tmp_path)
    assert as_printed.returncode == 0, (as_printed.stdout + as_printed.stderr)[-2000:]


def test_the_documented_command_with_decode_workers_ends_without_a_traceback(export_dir, tmp_path):
    """`predict model_dir=export/ input=photos/ output=preds.jsonl batch_size=32 num_workers=2` with its progress
    bar: before, 3 runs in 4 ended with "Exception ignored in: <module 'threading'> ... Bad file descriptor" from
    the decode pool's thread, joined by the interpreter after the command had succeeded."""
    from PIL import Image

    photos = tmp_path / "photos"
    photos.mkdir()
    rng = np.random.default_rng(0)
    for i in range(160):  # five batches: the workers decode four while the first is predicted
        Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(photos / f"{i:03d}.jpg")
    for attempt in range(4):
        out = tmp_path / f"preds{attempt}.jsonl"
        result = run_module("paddletrain.predict", [f"model_dir={export_dir}", f"input={photos}", f"output={out}",
                                                    "batch_size=32", "num_workers=2", "progress_bar=true"],
                            cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Traceback" not in result.stderr and "Exception ignored" not in result.stderr, result.stderr[-3000:]
        assert len(out.read_text().splitlines()) == 160
