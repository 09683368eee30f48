import io
import json
import logging
import os
import types

import numpy as np
import pytest
from PIL import Image
from visualdl import LogReader

from paddletrain.callbacks import StepOutput, VisualDLLogger
from paddletrain.callbacks.visualdl import denormalize_images

MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.5]


def make_trainer(tmp_path, **overrides):
    state = dict(
        global_step=0,
        run_dir=str(tmp_path),
        metrics={},
        nonfinite_steps=0,
        hparams={"lr": 0.1, "amp": False, "milestones": [30, 60], "name": "resnet20", "unset": None},
        precision=types.SimpleNamespace(loss_scale=None, enabled=False),
        logger=logging.getLogger("paddletrain.test.visualdl"),
    )
    state.update(overrides)
    return types.SimpleNamespace(**state)


def normalised_batch(n, height=8, width=6, seed=0):
    pixels = np.random.default_rng(seed).integers(0, 256, size=(n, 3, height, width)).astype(np.uint8)
    images = (pixels / 255.0 - np.reshape(MEAN, (1, 3, 1, 1))) / np.reshape(STD, (1, 3, 1, 1))
    return pixels, (images.astype(np.float32), np.zeros(n, dtype=np.int64))


def train(logger, trainer, losses, batch=None, batch_size=8):
    for i, loss in enumerate(losses):
        logger.on_train_batch_start(trainer, batch, i)
        trainer.global_step += 1
        output = StepOutput(loss=loss, batch_size=batch_size, lr=0.05, stepped=True,
                            data_time=0.01, compute_time=0.03)
        logger.on_train_batch_end(trainer, output, batch, i)


def read_log(logdir):
    [name] = [f for f in os.listdir(logdir) if "vdlrecords" in f]  # one file: VisualDL shows only the newest
    return LogReader(file_path=os.path.join(logdir, name))


def scalar_points(reader, tag):
    return [(record.id, pytest.approx(record.value, rel=1e-6)) for record in reader.get_data("scalar", tag)]


def test_scalars_hparams_and_validation_metrics_are_written(tmp_path):
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
    assert scalar_points(reader, "train/lr") == [(2, 0.05), (4, 0.05)]
    assert scalar_points(reader, "train/throughput") == [(2, 200.0), (4, 200.0)]  # 16 images / 0.08 s
    assert scalar_points(reader, "train/data_time_share") == [(2, 0.25), (4, 0.25)]
    assert scalar_points(reader, "train/lr_group1") == [(2, 0.5), (4, 0.5)]
    assert scalar_points(reader, "amp/loss_scale") == [(2, 1024.0), (4, 1024.0)]
    assert scalar_points(reader, "amp/nonfinite_steps") == [(2, 3), (4, 3)]
    assert scalar_points(reader, "val/top1") == [(4, 0.75)]
    assert scalar_points(reader, "val/loss") == [(4, 0.5)]
    [hparams] = reader.get_data("hyper_parameters", "hparam")
    infos = {info.name: info for info in hparams.hparam.hparamInfos}
    assert infos["lr"].float_value == pytest.approx(0.1)
    assert infos["amp"].string_value == "False"
    assert infos["milestones"].string_value == "[30, 60]"
    assert infos["name"].string_value == "resnet20"
    assert "unset" not in infos
    assert [m.name for m in hparams.hparam.metricInfos] == ["val/top1", "val/loss"]


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
    assert scalar_points(reader, "train/lr_group1") == [(1, 0.5), (2, 0.5), (3, 0.5), (4, 0.5)]
    assert scalar_points(reader, "train/loss") == [(1, 1.0), (2, 1.0), (3, 2.0), (4, 3.0)]


def test_no_loss_scale_means_no_amp_scale_curve(tmp_path):
    trainer = make_trainer(tmp_path, hparams=None)
    logger = VisualDLLogger(logdir=str(tmp_path / "vdl"), log_every_n_steps=1, log_images=False)
    logger.on_fit_start(trainer)
    train(logger, trainer, [1.0])
    logger.on_fit_end(trainer)
    tags = read_log(tmp_path / "vdl").get_tags()
    assert "amp/loss_scale" not in tags["scalar"]
    assert "hyper_parameters" not in tags


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


def test_resume_continues_the_same_log_without_fold_back(tmp_path):
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


def test_needs_a_logdir_or_run_dir(tmp_path):
    with pytest.raises(ValueError, match="logdir"):
        VisualDLLogger().on_fit_start(make_trainer(tmp_path, run_dir=None))
    with pytest.raises(ValueError, match="log_every_n_steps"):
        VisualDLLogger(log_every_n_steps=0)
