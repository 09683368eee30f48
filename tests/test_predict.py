"""predict: inputs from folders, lists and globs; parallel decode; bad files skipped and counted."""
import io
import json

import numpy as np
import paddle
import pytest
from omegaconf import OmegaConf
from PIL import Image

from paddletrain.config import DataConfig
from paddletrain.data import preprocessing_info
from paddletrain.errors import UserError
from paddletrain.export import export_model
from paddletrain.inference import Predictor, softmax
from paddletrain.models import create_model
from paddletrain.predict import (PredictConfig, default_num_workers, default_predictor_threads, predict_files,
                                 resolve_inputs, run)
from tests.conftest import run_module

LABELS = ["a", "b", "c"]
SIZE = 16


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    paddle.seed(0)
    model = create_model("resnet20", num_classes=len(LABELS))
    info = preprocessing_info(OmegaConf.structured(DataConfig(image_size=SIZE)))
    return export_model(model, tmp_path_factory.mktemp("export"), input_size=(3, SIZE, SIZE), preprocessing=info,
                        labels=LABELS)


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
    assert run(cfg(str(tmp_path / "none"))) == 2


@pytest.mark.parametrize("cores,workers,threads", [(1, 1, 1), (2, 1, 1), (8, 4, 4), (16, 8, 8)])
def test_decode_workers_and_predictor_threads_share_the_cores(monkeypatch, cores, workers, threads):
    monkeypatch.setattr("paddletrain.runtime.usable_cores", lambda: cores)
    assert default_num_workers() == workers
    assert default_predictor_threads(workers) == threads
    assert default_predictor_threads(0) == cores  # decoding in the main process leaves every core
