"""predict never writes over what it reads (its images, its list file, its export), and its labels must
name every output of the model."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf
from PIL import Image

from paddletrain.deploy.predictor import PREPROCESS_FILE, Predictor
from paddletrain.errors import UserError
from paddletrain.predict import PredictConfig, run
from tests.conftest import EXPORT_LABELS, command_code, run_module


@pytest.fixture
def photos(tmp_path):
    """Three PNGs in ``photos/`` and a list file naming them."""
    folder = tmp_path / "photos"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (20, 20, 3), dtype=np.uint8)).save(folder / f"img{i}.png")
    (tmp_path / "list.txt").write_text("".join(f"photos/img{i}.png\n" for i in range(3)))
    return folder


def digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def predict(export_dir, spec, output) -> int:
    cfg = PredictConfig(model_dir=str(export_dir), input=str(spec), output=str(output), num_workers=0,
                        progress_bar=False)
    return command_code(run, OmegaConf.structured(cfg))


def plant(kind: str, tmp_path: Path, photos: Path, export_dir: Path) -> tuple:
    """(input spec, output path) for each way ``output=`` can name something predict reads."""
    image = photos / "img1.png"
    if kind == "same file":
        return photos, image
    if kind == "same file, other spelling":
        return photos, photos / ".." / "photos" / "img1.png"
    if kind == "symlink to an input":
        (tmp_path / "link.png").symlink_to(image)
        return photos, tmp_path / "link.png"
    if kind == "hard link to an input":
        os.link(image, tmp_path / "hard.jsonl")
        return photos, tmp_path / "hard.jsonl"
    if kind == "the list file":
        return tmp_path / "list.txt", tmp_path / "list.txt"
    if kind == "an input named by the list file":
        return tmp_path / "list.txt", image
    if kind == "a new image file in the input folder":
        return photos, photos / "new.png"
    if kind == "the export's preprocess.json":
        return photos, export_dir / PREPROCESS_FILE
    if kind == "a directory":
        return photos, tmp_path
    raise ValueError(kind)


KINDS = ["same file", "same file, other spelling", "symlink to an input", "hard link to an input", "the list file",
         "an input named by the list file", "a new image file in the input folder", "the export's preprocess.json",
         "a directory"]


@pytest.mark.parametrize("kind", KINDS)
def test_output_that_predict_reads_is_refused_and_left_intact(kind, tmp_path, photos, export_dir, caplog):
    spec, output = plant(kind, tmp_path, photos, export_dir)
    before = {**digest(tmp_path), **digest(export_dir)}
    assert predict(export_dir, spec, output) == 2
    assert {**digest(tmp_path), **digest(export_dir)} == before
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and f"output={str(output)!r}" in errors[0]
    assert not (photos / "new.png").exists()


def test_output_next_to_the_inputs_is_fine(tmp_path, photos, export_dir):
    output = tmp_path / "preds.jsonl"
    assert predict(export_dir, photos, output) == 0
    assert len(output.read_text().splitlines()) == 3
    # Predicting again over the same folder overwrites the old predictions: they are not an input.
    assert predict(export_dir, photos, output) == 0


def test_cli_refuses_an_input_as_output_with_one_line(tmp_path, photos, export_dir):
    image = photos / "img0.png"
    before = image.read_bytes()
    result = run_module("paddletrain.predict", [f"model_dir={export_dir}", f"input={tmp_path / 'list.txt'}",
                                                f"output={image}",
                                                f"hydra.run.dir={tmp_path / 'log'}"], cwd=tmp_path, timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and f"output='{image}' is the input file" in lines[0], result.stderr
    assert image.read_bytes() == before


def test_labels_that_do_not_match_the_outputs_are_refused(tmp_path, export_dir):
    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ndog\n")
    with pytest.raises(UserError) as info:
        Predictor(export_dir, device="cpu", cpu_threads=1, labels=labels)
    assert str(info.value) == (f"{labels} has 2 labels but the model in {export_dir} has 3 outputs; give one class "
                               "name per output")
    edited = tmp_path / "edited"
    edited.mkdir()
    for path in export_dir.iterdir():
        (edited / path.name).write_bytes(path.read_bytes())
    meta = json.loads((edited / PREPROCESS_FILE).read_text())
    (edited / PREPROCESS_FILE).write_text(json.dumps({**meta, "labels": EXPORT_LABELS + ["extra"]}))
    with pytest.raises(UserError, match=rf"{edited / PREPROCESS_FILE} has 4 labels but the model in {edited} has 3 "):
        Predictor(edited, device="cpu", cpu_threads=1)


def test_a_label_file_names_the_predictions(tmp_path, photos, export_dir):
    labels = tmp_path / "labels.txt"
    labels.write_text("cat\ndog\nbird\n\n")
    predictor = Predictor(export_dir, device="cpu", cpu_threads=1, labels=labels)
    assert predictor.labels == ["cat", "dog", "bird"] and predictor.num_classes == 3
    output = tmp_path / "preds.jsonl"
    cfg = OmegaConf.structured(PredictConfig(model_dir=str(export_dir), input=str(photos), output=str(output),
                                             num_workers=0, progress_bar=False, labels=str(labels), topk=3))
    assert run(cfg) == 0
    assert all(sorted(json.loads(line)["labels"]) == ["bird", "cat", "dog"] for line in output.read_text().splitlines())


@pytest.mark.parametrize("content, message", [("cat\n\ndog\nbird\n", "blank line"), (b"\xff\xfe", "cannot read")])
def test_a_bad_label_file_is_one_clear_error(tmp_path, export_dir, content, message):
    labels = tmp_path / "labels.txt"
    labels.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UserError, match=message):
        Predictor(export_dir, device="cpu", cpu_threads=1, labels=labels)
