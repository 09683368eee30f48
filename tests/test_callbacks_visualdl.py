"""VisualDLLogger: the records it writes, read back with VisualDL's own LogReader."""
from __future__ import annotations

import importlib.util
import io
import json
import logging
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import paddle
import pytest
from PIL import Image
from visualdl import LogReader

from paddletrain.callbacks import StepOutput, VisualDLLogger
from paddletrain.callbacks.visualdl import (
    AUTO_LOG_POINTS,
    CONFUSION_TAG,
    MAX_HPARAMS,
    auto_log_interval,
    denormalize_images,
    hparam_names,
    render_confusion_matrix,
    run_display_name,
    scalar_tag,
    select_hparams,
    tag_sort_key,
)
from paddletrain.engine.limits import Limits
from paddletrain.engine.trainer import Trainer
from paddletrain.metrics import ClassReport
from tests.conftest import TINY, run_module

MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.5]
FP32 = types.SimpleNamespace(loss_scale=None, enabled=False)


def make_trainer(tmp_path, **overrides):
    state = dict(
        global_step=0,
        run_dir=str(tmp_path),
        metrics={},
        nonfinite_steps=0,
        hparams={"lr": 0.1, "amp": False, "milestones": [30, 60], "name": "resnet20", "unset": None},
        precision=FP32,
        logger=logging.getLogger("paddletrain.test.visualdl"),
        num_train_batches=None,
    )
    # A real Trainer keeps the loop's limits in one object; overrides may name any of its fields.
    limits = {key: overrides.pop(key) for key in list(overrides) if key in Limits.__dataclass_fields__}
    state.update(overrides, limits=Limits(**limits))
    return types.SimpleNamespace(**state)


def normalised_batch(n, height=8, width=6, seed=0):
    pixels = np.random.default_rng(seed).integers(0, 256, size=(n, 3, height, width)).astype(np.uint8)
    images = (pixels / 255.0 - np.reshape(MEAN, (1, 3, 1, 1))) / np.reshape(STD, (1, 3, 1, 1))
    return pixels, (images.astype(np.float32), np.zeros(n, dtype=np.int64))


def train(logger, trainer, losses, batch=None, batch_size=8, start=0, stepped=True):
    for i, loss in enumerate(losses, start):
        logger.on_train_batch_start(trainer, batch, i)
        trainer.global_step += stepped
        output = StepOutput(loss=loss, batch_size=batch_size, lr=0.05, stepped=stepped,
                            data_time=0.01, compute_time=0.03)
        logger.on_train_batch_end(trainer, output, batch, i)


def log_file(logdir):
    [name] = [f for f in os.listdir(logdir) if "vdlrecords" in f]  # one file: VisualDL shows only the newest
    return os.path.join(logdir, name)


def read_log(logdir):
    return LogReader(file_path=log_file(logdir))


def scalar_points(reader, tag):
    return [(record.id, pytest.approx(record.value, rel=1e-6)) for record in reader.get_data("scalar", tag)]


def steps(reader, tag):
    return [record.id for record in reader.get_data("scalar", tag)]


def display_name(reader):
    return reader.get_data("meta_data", "meta_data_tag")[-1].meta_data.display_name


def test_scalars_hparams_and_validation_metrics_are_written_in_groups(tmp_path):
    trainer = make_trainer(tmp_path, metrics={"train/loss": 99.0, "train/lr_group1": 0.5, "val/top1": 0.1},
                           precision=types.SimpleNamespace(loss_scale=1024.0, enabled=True), nonfinite_steps=3)
    logger = VisualDLLogger(log_every_n_steps=2, log_images=False)
    logger.on_fit_start(trainer)
    train(logger, trainer, [1.0, 2.0, 3.0, float("nan")])
    logger.on_validation_end(trainer, {"val/top1": 0.75, "val/loss": 0.5})
    logger.on_fit_end(trainer)

    reader = read_log(tmp_path / "visualdl")
    # Loss is the mean over the logging interval; a NaN batch is left out of it.
    assert scalar_points(reader, "train/loss") == [(2, 1.5), (4, 3.0)]
    assert scalar_points(reader, "lr/lr") == [(2, 0.05), (4, 0.05)]
    assert scalar_points(reader, "lr/group1") == [(2, 0.5), (4, 0.5)]
    assert scalar_points(reader, "system/throughput") == [(2, 200.0), (4, 200.0)]  # 16 images / 0.08 s
    assert scalar_points(reader, "system/data_time_share") == [(2, 0.25), (4, 0.25)]
    assert scalar_points(reader, "system/loss_scale") == [(2, 1024.0), (4, 1024.0)]
    assert scalar_points(reader, "system/nonfinite_steps") == [(2, 3), (4, 3)]
    assert scalar_points(reader, "val/top1") == [(4, 0.75)]
    assert scalar_points(reader, "val/loss") == [(4, 0.5)]
    assert {tag.split("/")[0] for tag in reader.get_tags()["scalar"]} == {"train", "val", "lr", "system"}
    [hparams] = reader.get_data("hyper_parameters", "hparam")
    infos = {info.name: info for info in hparams.hparam.hparamInfos}
    assert infos["lr"].float_value == pytest.approx(0.1)
    assert infos["amp"].string_value == "False"
    assert infos["milestones"].string_value == "[30, 60]"
    assert infos["name"].string_value == "resnet20"
    assert "unset" not in infos
    assert [m.name for m in hparams.hparam.metricInfos] == ["val/top1", "val/loss"]


def test_float32_writes_no_amp_charts_until_a_step_is_skipped(tmp_path):
    trainer = make_trainer(tmp_path, hparams=None)
    logger = VisualDLLogger(log_every_n_steps=1, log_images=False)
    logger.on_fit_start(trainer)
    train(logger, trainer, [1.0, 1.0])
    trainer.nonfinite_steps = 1  # a non-finite step was skipped: now the count is worth a chart
    train(logger, trainer, [1.0], start=2)
    logger.on_fit_end(trainer)
    reader = read_log(tmp_path / "visualdl")
    tags = reader.get_tags()
    assert not [tag for tag in tags["scalar"] if tag.startswith("amp/") or tag == "system/loss_scale"]
    assert scalar_points(reader, "system/nonfinite_steps") == [(3, 1)]
    assert "hyper_parameters" not in tags


def test_charts_are_written_in_one_order_whatever_order_the_metrics_come_in(tmp_path):
    def tag_order(logdir, metrics):
        trainer = make_trainer(logdir, hparams=None, metrics=dict(metrics))
        logger = VisualDLLogger(log_every_n_steps=1, log_images=False)
        logger.on_fit_start(trainer)
        train(logger, trainer, [1.0])
        logger.on_validation_end(trainer, {k: v for k, v in reversed(list(metrics.items())) if k.startswith("val")})
        logger.on_fit_end(trainer)
        return read_log(logdir / "visualdl").get_tags()["scalar"]  # in the order the tags first appear

    metrics = {"train/lr_group10": 0.1, "train/lr_group2": 0.2, "val/top5": 1.0, "val/loss": 0.3, "val/top1": 0.9,
               "train/custom": 7.0}
    first = tag_order(tmp_path / "a", metrics)
    second = tag_order(tmp_path / "b", dict(reversed(list(metrics.items()))))
    assert first == second == [
        "train/loss", "train/custom", "lr/lr", "lr/group2", "lr/group10", "system/throughput",
        "system/data_time_share", "val/loss", "val/top1", "val/top5"]


def test_scalar_tags_and_their_order():
    assert [scalar_tag(m) for m in ("train/lr", "train/lr_group3", "train/throughput", "train/top1", "val/loss")] \
        == ["lr/lr", "lr/group3", "system/throughput", "train/top1", "val/loss"]
    tags = ["system/loss_scale", "val/top1", "custom/x", "lr/group1", "train/top5", "train/loss", "lr/lr"]
    assert sorted(tags, key=tag_sort_key) == [
        "train/loss", "train/top5", "val/top1", "lr/lr", "lr/group1", "system/loss_scale", "custom/x"]


@pytest.mark.parametrize("batches, epochs, accumulate, max_steps, expected", [
    (100, 10, 1, None, 1),                  # 1000 steps: every step
    (100, 10, 1, 50, 1),
    (1001, 1, 1, None, 2),                  # just over: at most 1000 points
    (500, 10, 1, None, 5),
    (500, 10, 2, None, 3),                  # 2500 optimizer steps
    (500, 100, 1, 20_000, 20),              # max_steps ends the run first
    (None, 10, 1, 5000, 5),
    (None, 10, 1, None, 1),                 # unknown length: every step
])
def test_auto_interval_gives_every_step_on_short_runs_and_about_1000_points_on_long_ones(
        batches, epochs, accumulate, max_steps, expected):
    assert AUTO_LOG_POINTS == 1000
    assert auto_log_interval(batches, epochs, accumulate, max_steps) == expected


def test_the_last_step_of_every_epoch_is_written(tmp_path):
    trainer = make_trainer(tmp_path, hparams=None, num_train_batches=5, max_epochs=400)  # 2000 steps planned
    logger = VisualDLLogger(log_images=False)
    logger.on_fit_start(trainer)
    assert logger.every_n_steps == 2
    for _ in range(2):
        train(logger, trainer, [1.0] * 5)
        logger.on_train_epoch_end(trainer, {"train/top1": 0.5})
    train(logger, trainer, [1.0] * 3)  # max_steps or a stop cuts the third epoch after 3 batches
    logger.on_train_epoch_end(trainer, {"train/top1": 0.5})
    logger.on_fit_end(trainer)
    reader = read_log(tmp_path / "visualdl")
    assert steps(reader, "train/loss") == [2, 4, 5, 6, 8, 10, 12, 13]
    assert steps(reader, "train/top1") == [5, 10, 13]


def test_micro_batches_and_skipped_steps_write_nothing(tmp_path):
    trainer = make_trainer(tmp_path, hparams=None, num_train_batches=4)
    logger = VisualDLLogger(log_every_n_steps=1, log_images=False)
    logger.on_fit_start(trainer)
    train(logger, trainer, [1.0, 3.0], stepped=False)  # accumulation micro-batches
    train(logger, trainer, [5.0], start=2)
    logger.on_fit_end(trainer)
    assert scalar_points(read_log(tmp_path / "visualdl"), "train/loss") == [(1, 3.0)]


def test_epoch_aggregates_are_written_once_per_epoch_not_at_every_step(tmp_path):
    trainer = make_trainer(tmp_path, hparams=None)
    logger = VisualDLLogger(log_every_n_steps=1, log_images=False)
    logger.on_fit_start(trainer)
    trainer.metrics["train/lr_group1"] = 0.5  # a per-step value another callback publishes
    train(logger, trainer, [1.0, 1.0])
    trainer.metrics.update({"train/top1": 0.6, "train/loss": 7.0})  # the trainer's epoch aggregates
    logger.on_train_epoch_end(trainer, dict(trainer.metrics))
    train(logger, trainer, [2.0])
    state = logger.state_dict()
    logger.on_exception(trainer, KeyboardInterrupt())

    resumed = VisualDLLogger(log_every_n_steps=1, log_images=False)
    resumed.load_state_dict(state)
    resumed.on_fit_start(trainer)
    train(resumed, trainer, [3.0])  # trainer.metrics still holds last epoch's train/top1
    resumed.on_fit_end(trainer)

    reader = read_log(tmp_path / "visualdl")
    assert scalar_points(reader, "train/top1") == [(2, 0.6)]
    assert scalar_points(reader, "lr/group1") == [(1, 0.5), (2, 0.5), (3, 0.5), (4, 0.5)]
    assert scalar_points(reader, "train/loss") == [(1, 1.0), (2, 1.0), (3, 2.0), (4, 3.0)]


def test_hparam_names_are_short_distinct_and_free_of_dots():
    names = hparam_names(["model.name", "optim.name", "optim.lr", "data.batch_size", "trainer.seed",
                          "data.shapes.seed", "experiment", "optim/weight_decay"])
    assert names == {"model.name": "model", "optim.name": "optim", "optim.lr": "lr", "data.batch_size": "batch_size",
                     "trainer.seed": "trainer/seed", "data.shapes.seed": "shapes/seed", "experiment": "experiment",
                     "optim/weight_decay": "weight_decay"}
    assert hparam_names(["model.name", "model"]) == {"model.name": "model/name", "model": "model"}


def test_select_hparams_keeps_the_first_that_fit_visualdls_comparison_view():
    metrics = ["val/top1", "val/loss"]
    chosen, left_out = select_hparams({f"group.key{i}": i for i in range(12)}, metrics)
    assert list(chosen) == [f"key{i}" for i in range(MAX_HPARAMS)] and len(left_out) == 12 - MAX_HPARAMS
    # A long name needs wide axes, so fewer fit; one too long for any axis is skipped and the next one still fits.
    hparams = {"optim.lr": 0.1, "trainer.accumulate_grad_batches": 4, "x.a_name_far_too_long_for_any_axis_of_it": 1,
               "model.name": "resnet20", "data.batch_size": 64, "data.name": "shapes"}
    chosen, left_out = select_hparams(hparams, metrics)
    assert chosen == {"lr": 0.1, "accumulate_grad_batches": 4, "model": "resnet20"}
    assert left_out == ["x.a_name_far_too_long_for_any_axis_of_it", "data.batch_size", "data.name"]


def test_display_name_puts_what_tells_runs_apart_first(tmp_path):
    assert run_display_name("outputs/resnet20-shapes/2026-11-23_13-37-00/visualdl") == \
        "2026-11-23_13-37-00 resnet20-shapes"
    assert run_display_name("multirun/resnet20-shapes/2026-11-23_13-37-00/3") == \
        "#3 2026-11-23_13-37-00 resnet20-shapes"
    trainer = make_trainer(tmp_path / "outputs" / "exp" / "2026-01-02_03-04-05", hparams=None)
    logger = VisualDLLogger(log_images=False)
    logger.on_fit_start(trainer)
    train(logger, trainer, [1.0])
    logger.on_fit_end(trainer)
    assert display_name(read_log(os.path.join(trainer.run_dir, "visualdl"))) == "2026-01-02_03-04-05 exp"
    named = VisualDLLogger(logdir=str(tmp_path / "mine"), log_images=False, display_name="lr 0.01")
    trainer = make_trainer(tmp_path, hparams=None)
    named.on_fit_start(trainer)
    train(named, trainer, [1.0])
    named.on_fit_end(trainer)
    assert display_name(read_log(tmp_path / "mine")) == "lr 0.01"


def test_sample_grid_tiles_denormalised_images(tmp_path):
    pixels, batch = normalised_batch(20)
    trainer = make_trainer(tmp_path)
    logger = VisualDLLogger(log_every_n_steps=100, mean=MEAN, std=STD)
    logger.on_fit_start(trainer)
    train(logger, trainer, [1.0, 1.0], batch=batch)
    logger.on_fit_end(trainer)

    [record] = read_log(tmp_path / "visualdl").get_data("image", "train/samples")
    assert record.id == 0
    grid = np.asarray(Image.open(io.BytesIO(record.image.encoded_image_string)))
    # 16 of the 20 images, 8 per row: 2 rows of 8x6 images.
    assert grid.shape == (16, 48, 3) and grid.dtype == np.uint8
    np.testing.assert_array_equal(grid[:8, :6], pixels[0].transpose(1, 2, 0))
    np.testing.assert_array_equal(grid[8:, 42:], pixels[15].transpose(1, 2, 0))


def test_denormalize_images_inverts_normalisation():
    pixels, (images, _) = normalised_batch(4)
    restored = denormalize_images(images, MEAN, STD, max_images=3)
    assert restored.dtype == np.uint8
    np.testing.assert_array_equal(restored, pixels[:3])
    with pytest.raises(ValueError, match="mean has 2 values but the images have 3 channels"):
        denormalize_images(images, [0.5, 0.5], None)


def test_unusable_batch_skips_images_with_a_warning(tmp_path, caplog):
    trainer = make_trainer(tmp_path)
    logger = VisualDLLogger(log_every_n_steps=1)
    logger.on_fit_start(trainer)
    with caplog.at_level(logging.WARNING, logger="paddletrain.test.visualdl"):
        train(logger, trainer, [1.0], batch=(np.zeros((2, 5)), None))
    logger.on_fit_end(trainer)
    assert "not logging sample images" in caplog.text
    assert scalar_points(read_log(tmp_path / "visualdl"), "train/loss") == [(1, 1.0)]


def test_resume_continues_the_same_log_without_fold_back_or_visualdls_message(tmp_path, capfd):
    _, batch = normalised_batch(2)
    trainer = make_trainer(tmp_path)
    first = VisualDLLogger(log_every_n_steps=2, mean=MEAN, std=STD)
    first.on_fit_start(trainer)
    train(first, trainer, [1.0, 1.0, 2.0, 2.0], batch=batch)
    state = json.loads(json.dumps(first.state_dict()))  # checkpoint at step 4
    assert state["last_step"] == 4
    train(first, trainer, [9.0, 9.0], batch=batch)  # step 6, written after the checkpoint...
    first.on_exception(trainer, RuntimeError("killed"))  # ...then the run dies

    trainer = make_trainer(tmp_path, global_step=4)
    resumed = VisualDLLogger(log_every_n_steps=2, mean=MEAN, std=STD)
    resumed.load_state_dict(state)
    resumed.on_fit_start(trainer)
    train(resumed, trainer, [3.0, 3.0, 4.0, 4.0], batch=batch)
    resumed.on_fit_end(trainer)

    reader = read_log(tmp_path / "visualdl")
    assert scalar_points(reader, "train/loss") == [(2, 1.0), (4, 2.0), (6, 3.0), (8, 4.0)]
    assert len(reader.get_data("image", "train/samples")) == 1
    assert len(reader.get_data("hyper_parameters", "hparam")) == 1
    assert resumed.state_dict()["last_step"] == 8
    printed = capfd.readouterr()
    assert "is exists" not in printed.out + printed.err  # VisualDL's own line about appending


def test_needs_a_logdir_or_run_dir(tmp_path):
    with pytest.raises(ValueError, match="logdir"):
        VisualDLLogger().on_fit_start(make_trainer(tmp_path, run_dir=None))
    with pytest.raises(ValueError, match="log_every_n_steps"):
        VisualDLLogger(log_every_n_steps=0)


def test_a_real_short_run_logs_every_step_and_each_epochs_last(tmp_path):
    paddle.seed(0)
    rng = np.random.default_rng(0)
    batches = [(paddle.to_tensor(rng.normal(size=(4, 3, 4, 4)).astype("float32")),
                paddle.to_tensor(rng.integers(0, 3, 4).astype("int64"))) for _ in range(5)]
    model = paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(48, 3))
    optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=model.parameters())
    logger = VisualDLLogger(log_images=False)
    trainer = Trainer(model, optimizer, limits=Limits(max_epochs=2, accumulate_grad_batches=2), num_classes=3,
                      run_dir=str(tmp_path), callbacks=[logger],
                      hparams={"optim.lr": 0.1, "trainer.accumulate_grad_batches": 2})
    trainer.fit(batches, batches[:2])

    reader = read_log(tmp_path / "visualdl")
    # 5 batches, 2 per step: steps 1, 2 and 3 (the last batch's own step) in each epoch.
    assert steps(reader, "train/loss") == steps(reader, "lr/lr") == [1, 2, 3, 4, 5, 6]
    assert steps(reader, "train/top1") == steps(reader, "val/top1") == [3, 6]
    scalar_tags = reader.get_tags()["scalar"]
    assert set(scalar_tags) == {"train/loss", "train/top1", "val/loss", "val/top1", "val/balanced_accuracy", "lr/lr",
                                "system/throughput", "system/data_time_share"}
    # Each validation's confusion matrix (3 classes, named by index): its counts are those of trainer.val_report.
    images = reader.get_data("image", CONFUSION_TAG)
    assert [record.id for record in images] == [3, 6]
    last = np.asarray(Image.open(io.BytesIO(images[-1].image.encoded_image_string)).convert("RGB"))
    np.testing.assert_array_equal(last, render_confusion_matrix(trainer.val_report.confusion, ["0", "1", "2"]))
    assert trainer.val_report.confusion.sum() == 8  # the two validation batches of 4
    [hparams] = reader.get_data("hyper_parameters", "hparam")
    assert [info.name for info in hparams.hparam.hparamInfos] == ["lr", "accumulate_grad_batches"]
    assert display_name(reader) == f"{tmp_path.name} {tmp_path.parent.name}"


# ---------------------------------------------------------------------------------- `python -m paddletrain.fit`
RUN_NAME, RUN_TIME = "tiny-shapes", "2026-01-02_03-04-05"


@pytest.fixture(scope="module")
def fit_run(tmp_path_factory):
    """A real 2-epoch run of the default job, shrunk, with an override of its own: 4 steps an epoch."""
    root = tmp_path_factory.mktemp("vdl_fit")
    run_dir = root / "outputs" / RUN_NAME / RUN_TIME
    result = run_module("paddletrain.fit", [*TINY, "trainer.max_epochs=2", "optim.lr=0.01",
                                            "data.root=/nowhere/used", f"hydra.run.dir={run_dir}"], cwd=root)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "is exists" not in result.stdout + result.stderr
    return run_dir


def test_fit_logs_every_step_the_overridden_hparams_and_names_the_run(fit_run):
    reader = read_log(fit_run / "visualdl")
    assert steps(reader, "train/loss") == steps(reader, "lr/lr") == steps(reader, "system/throughput") == \
        list(range(1, 9))
    assert steps(reader, "val/top1") == steps(reader, "train/top1") == [4, 8]  # each epoch's last step
    assert {tag.split("/")[0] for tag in reader.get_tags()["scalar"]} == {"train", "val", "lr", "system"}
    assert not [tag for tag in reader.get_tags()["scalar"] if "amp" in tag or "loss_scale" in tag]
    [hparams] = reader.get_data("hyper_parameters", "hparam")
    # The command line's keys first (TINY's, then optim.lr; data.root and the plumbing ones are not
    # hyper-parameters), then the fixed set, as many as fit VisualDL's view.
    assert [info.name for info in hparams.hparam.hparamInfos] == [
        "num_train", "num_val", "image_size", "batch_size", "max_epochs", "lr", "model", "data"]
    assert {info.name: info.float_value for info in hparams.hparam.hparamInfos}["lr"] == pytest.approx(0.01)
    assert display_name(reader) == f"{RUN_TIME} {RUN_NAME}"


def test_screenshot_script_saves_visualdls_pages_of_a_run(fit_run, tmp_path):
    pytest.importorskip("playwright", reason="the screenshot script drives Chromium with Playwright")
    script = Path(__file__).resolve().parents[1] / "examples" / "visualdl_screenshots.py"
    spec = importlib.util.spec_from_file_location("visualdl_screenshots", script)
    screenshots = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(screenshots)
    if screenshots.find_chromium() is None:
        pytest.skip("no Chromium installed (Debian: apt-get install chromium)")

    out = tmp_path / "images"
    result = subprocess.run([sys.executable, str(script), str(fit_run.parent.parent), "--out", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    for page in screenshots.PAGES:
        image = np.asarray(Image.open(out / f"visualdl-{page}.png").convert("RGB"))
        assert image.shape[1] == 1280 and image.shape[0] >= 900
        # Not blank: the page drew many colours (charts, text, images), not one background.
        assert len(np.unique(image.reshape(-1, 3), axis=0)) > 200, page
    assert Image.open(out / "visualdl-scalars.png").height > 1500  # every group opened, not only VisualDL's first


def _report(matrix, names):
    matrix = np.asarray(matrix)
    return ClassReport(support=matrix.sum(axis=1), predicted=matrix.sum(axis=0), correct=np.diag(matrix),
                       confusion=matrix, class_names=names)


def test_each_validation_writes_the_row_normalised_confusion_matrix_as_an_image(tmp_path):
    matrix = [[8, 2, 0], [0, 5, 0], [0, 0, 0]]  # class "c" has no validation samples
    trainer = make_trainer(tmp_path, val_report=_report(matrix, ["a", "b", "c"]))
    logger = VisualDLLogger(log_every_n_steps=1, log_images=False)
    logger.on_fit_start(trainer)
    train(logger, trainer, [1.0, 1.0])
    logger.on_validation_end(trainer, {"val/top1": 13 / 15})
    trainer.val_report = _report([[10, 0, 0], [0, 5, 0], [0, 0, 0]], ["a", "b", "c"])
    train(logger, trainer, [1.0], start=2)
    logger.on_validation_end(trainer, {"val/top1": 1.0})
    logger.on_fit_end(trainer)

    records = read_log(tmp_path / "visualdl").get_data("image", CONFUSION_TAG)
    assert [record.id for record in records] == [2, 3]
    first = np.asarray(Image.open(io.BytesIO(records[0].image.encoded_image_string)).convert("RGB"))
    expected = render_confusion_matrix(matrix, ["a", "b", "c"])
    assert first.shape == expected.shape and first.dtype == np.uint8
    np.testing.assert_array_equal(first, expected)  # PNG is lossless


def test_the_confusion_image_colours_each_cell_by_its_rows_share():
    counts = np.array([[3, 1], [0, 0]])
    cells = render_confusion_matrix(counts, max_named=0, max_pixels=8)  # no names: the cells alone, 4 px each
    assert cells.shape == (8, 8, 3)
    white, dark = np.array([255, 255, 255]), np.array([8, 48, 107])
    np.testing.assert_array_equal(cells[0, 0], np.rint(white + 0.75 * (dark - white)))
    np.testing.assert_array_equal(cells[0, 4], np.rint(white + 0.25 * (dark - white)))
    np.testing.assert_array_equal(cells[4:, :].reshape(-1, 3), np.tile(white, (32, 1)))  # a class without samples
    assert render_confusion_matrix(np.eye(100)).shape == (800, 800, 3)  # names only up to 30 classes
    assert render_confusion_matrix(np.eye(2000)).shape == (2000, 2000, 3)  # at least a pixel a class
    named = render_confusion_matrix(np.eye(6), ["circle", "ring", "square", "triangle", "star", "cross"])
    assert named.shape[0] > 6 * 32 and named.shape[1] > 6 * 32  # the names take a margin on both axes


def test_no_confusion_image_without_a_matrix_or_when_switched_off(tmp_path):
    for name, logger, report in (("off", VisualDLLogger(log_images=False, log_confusion_matrix=False),
                                  _report([[1, 0], [0, 1]], ["a", "b"])),
                                 ("none", VisualDLLogger(log_images=False), None)):
        trainer = make_trainer(tmp_path / name, val_report=report)
        logger.on_fit_start(trainer)
        train(logger, trainer, [1.0])
        logger.on_validation_end(trainer, {"val/top1": 1.0})
        logger.on_fit_end(trainer)
        assert CONFUSION_TAG not in read_log(tmp_path / name / "visualdl").get_tags().get("image", [])


@pytest.mark.parametrize(("overrides", "expected"), [
    ([], ["val/top1", "val/loss"]),
    (["data=labellist", "data.multilabel=true"], ["val/mAP", "val/loss"]),  # the monitor a multi-label run gets
    (["monitor=val/loss", "monitor_mode=min"], ["val/loss"]),
])
def test_the_hparams_view_compares_runs_by_the_monitored_metric(overrides, expected):
    from paddletrain.build import build_callbacks, resolve_task
    from tests.conftest import compose_fit

    callbacks = build_callbacks(resolve_task(compose_fit(overrides)))
    (logger,) = [cb for cb in callbacks if isinstance(cb, VisualDLLogger)]
    assert logger.hparam_metrics == expected
