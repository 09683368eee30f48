"""The end of a run: summary.json and the table in the log agree with each other and with the epoch lines."""
from __future__ import annotations

import json
import logging
import re

import pytest

from paddletrain.build import train
from paddletrain.checkpoint import read_pointer
from paddletrain.engine.summary import summary_table
from paddletrain.models import create_model
from paddletrain.models.flops import training_flops_per_image
from tests.conftest import TINY, compose_fit


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 2-epoch run trained in this process, with its log lines and a log file like Hydra's."""
    run_dir = tmp_path_factory.mktemp("summary") / "run"
    run_dir.mkdir()
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    root, paddletrain_log = logging.getLogger(), logging.getLogger("paddletrain")
    keep, log_file = Keep(logging.INFO), logging.FileHandler(run_dir / "fit.log")
    level = paddletrain_log.level
    paddletrain_log.setLevel(logging.INFO)
    root.addHandler(keep)
    root.addHandler(log_file)
    try:
        metrics = train(compose_fit([*TINY, "trainer.max_epochs=2", "data.num_workers=0"]), run_dir)
    finally:
        root.removeHandler(keep)
        root.removeHandler(log_file)
        log_file.close()
        paddletrain_log.setLevel(level)
    lines = [r.getMessage() for r in records if r.name == "paddletrain"]
    return run_dir, metrics, lines, json.loads((run_dir / "summary.json").read_text())


def test_summary_json_keeps_its_keys_and_gains_the_new_facts(finished_run):
    run_dir, metrics, _, summary = finished_run
    assert summary["epochs"] == 2 and summary["global_step"] == 8 and summary["nonfinite_steps"] == 0
    assert {k: summary[k] for k in metrics if k not in ("train/throughput", "train/data_time_share")} == \
        {k: v for k, v in metrics.items() if k not in ("train/throughput", "train/data_time_share")}
    assert summary["train/images"] == 128 and summary["world_size"] == 1
    assert summary["train/throughput"] == pytest.approx(summary["train/images"] / summary["train/step_seconds"])
    assert summary["wall_seconds"] > summary["train/step_seconds"] > 0
    assert summary["paths"] == {"run_dir": str(run_dir), "log": str(run_dir / "fit.log"),
                                "visualdl": str(run_dir / "visualdl")}


def test_best_checkpoint_is_the_one_best_json_points_to(finished_run):
    run_dir, _, lines, summary = finished_run
    best = summary["best"]
    assert best["checkpoint"] == str(read_pointer(run_dir / "checkpoints", "best"))
    assert best["monitor"] == "val/top1" and best["epoch"] in (1, 2)
    pointer = json.loads((run_dir / "checkpoints" / "best.json").read_text())
    assert best["value"] == pointer["metric"] and best["epoch"] == pointer["epoch"] + 1
    assert summary["last_checkpoint"] == str(read_pointer(run_dir / "checkpoints", "latest"))
    # The epoch the table names saved that value: its epoch line shows it.
    epoch_line = next(line for line in lines if line.startswith(f"Epoch {best['epoch']}/2 |"))
    assert f"val/top1 {best['value']:.4g}" in epoch_line


def test_table_epoch_lines_and_json_show_the_same_throughput(finished_run):
    _, _, lines, summary = finished_run
    table = lines[lines.index(next(line for line in lines if line.startswith("Summary:"))):]
    assert table == summary_table(summary)
    text = "\n".join(table)
    assert re.search(rf"training +{summary['train/throughput']:.1f} img/s \(128 images in", text)
    assert re.search(rf"best +val/top1 {summary['best']['value']:.4f} at epoch {summary['best']['epoch']}: "
                     + re.escape(summary["best"]["checkpoint"]), text)
    assert re.search(r"\n  log +" + re.escape(summary["paths"]["log"]), text)
    assert "visualdl --logdir " + summary["paths"]["visualdl"] in text
    assert f"val/top1 {summary['val/top1']:.4g}" in text  # the last metrics
    # The run's training img/s is the images over both epochs' step time: between the epoch lines' figures.
    epochs = [float(x) for x in re.findall(r"^Epoch \d/2 \|.*\| train ([\d.]+) img/s \| wall", "\n".join(lines), re.M)]
    assert len(epochs) == 2 and min(epochs) - 0.05 <= summary["train/throughput"] <= max(epochs) + 0.05


def test_table_without_checkpoints_or_visualdl():
    summary = {"epochs": 1, "global_step": 4, "wall_seconds": 75.0, "train/throughput": 12.34, "train/images": 64,
               "train/step_seconds": 5.2, "train/data_time_share": 0.1, "world_size": 2, "train/loss": 1.5,
               "paths": {"run_dir": "/runs/a"}}
    lines = summary_table(summary)
    assert lines[0] == "Summary: 1 epoch(s), 4 optimizer step(s), wall time 0:01:15"
    assert lines[1:] == [
        "  training      12.3 img/s per rank (about 24.7 for the 2 ranks; 64 images in 5.2 s of training steps, "
        "data wait 10%)",
        "  last metrics  train/loss 1.5",
        "  run dir       /runs/a (summary.json)",
    ]


def test_summary_holds_balanced_accuracy_per_class_scores_and_the_confusion_matrix(finished_run):
    run_dir, _, lines, summary = finished_run
    from paddletrain.data.formats.shapes import CLASSES

    matrix = summary["val/confusion_matrix"]
    assert len(matrix) == len(CLASSES) and all(len(row) == len(CLASSES) for row in matrix)
    assert sum(map(sum, matrix)) == 32  # every validation image once
    assert sum(matrix[k][k] for k in range(len(CLASSES))) / 32 == pytest.approx(summary["val/top1"], abs=1e-12)
    per_class = summary["val/per_class"]
    assert list(per_class) == summary["val/classes"] == list(CLASSES)  # in class order, as the matrix
    assert [per_class[name]["support"] for name in CLASSES] == [sum(row) for row in matrix]
    recalls = [per_class[name]["recall"] for name in CLASSES if per_class[name]["support"]]
    assert summary["val/balanced_accuracy"] == pytest.approx(sum(recalls) / len(recalls), abs=1e-12)
    # Compact: a row of the matrix per line, not a count per line.
    text = (run_dir / "summary.json").read_text()
    assert len(text.splitlines()) < 120 and json.dumps(matrix[0], separators=(",", ":")) in text
    assert any("val/balanced_accuracy" in line for line in lines if line.startswith("Epoch 2/2"))


def test_the_runs_training_arithmetic_is_its_models_count_times_the_images_it_trained(finished_run):
    _, _, lines, summary = finished_run
    # The default model (resnet20, 3 channels, 4 classes at 16 px) counted as comparisons' step profile counts it.
    model = create_model("resnet20", num_classes=len(summary["val/classes"]), in_chans=3)
    per_image = training_flops_per_image(model, 3, 16)
    assert summary["train/mflop_per_image"] == pytest.approx(per_image / 1e6, abs=1e-3)
    # Two epochs of the 64 training images.
    assert summary["train/pflop"] == pytest.approx(per_image * 64 * 2 / 1e15)
    assert any(line.startswith(f"Training arithmetic: {per_image / 1e6:.1f} MFLOP an image") for line in lines)
    row = rf"\n  arithmetic +{per_image * 128 / 1e9:.3g} GFLOP \({per_image / 1e6:.1f} MFLOP an image, 2 epoch"
    assert re.search(row, "\n".join(summary_table(summary)))
