"""The `fit` and `evaluate` command lines end to end, in subprocesses, on a tiny config."""
from __future__ import annotations

import itertools
import json
import logging
import math
from pathlib import Path

import numpy as np
import paddle
import pytest
from PIL import Image

from paddletrain.build import build_run, train
from paddletrain.callbacks import Callback
from paddletrain.data.sampling.sampler import WeightedBatchSampler
from paddletrain.engine.trainer import Trainer
from paddletrain.models import register_model
from paddletrain.models._registry import list_models
from paddletrain.validation import validate_config
from tests.conftest import TINY, compose_fit, run_module


def test_fit_then_evaluate_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    result = run_module("paddletrain.fit", [*TINY, "trainer.max_epochs=2", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 2 and 0.0 <= summary["val/top1"] <= 1.0 and summary["val/loss"] > 0
    assert "Summary:" in result.stdout + result.stderr
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert any((run_dir / "visualdl").iterdir())
    checkpoints = sorted(p for p in (run_dir / "checkpoints").iterdir() if p.is_dir() and not p.name.startswith("."))
    assert checkpoints, "no checkpoint written"

    # The run directory with `:last` (through Hydra's override parser, colon and all) finds the same checkpoint.
    result = run_module("paddletrain.evaluate", [f"checkpoint={run_dir}:last", f"hydra.run.dir={tmp_path / 'ev'}"],
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    reported = json.loads(result.stdout.strip().splitlines()[-1])
    assert reported["checkpoint"] == str(checkpoints[-1])
    # The last checkpoint holds the final weights: evaluation reproduces the final validation metrics.
    assert abs(reported["val/top1"] - summary["val/top1"]) < 1e-6
    assert abs(reported["val/loss"] - summary["val/loss"]) < 1e-4
    # ... and the per-class results: the same counts, and a readable table in the log.
    assert reported["val/confusion_matrix"] == summary["val/confusion_matrix"]
    assert reported["val/per_class"] == summary["val/per_class"]  # ratios of the same integer counts
    assert reported["val/balanced_accuracy"] == pytest.approx(summary["val/balanced_accuracy"], abs=1e-12)
    table = [line for line in (result.stdout + result.stderr).splitlines() if "precision  recall" in line]
    assert len(table) == 1 and "circle" in result.stderr + result.stdout


def test_a_held_out_run_validates_on_its_holdout_and_evaluate_reads_its_test_split(tmp_path):
    run_dir = tmp_path / "run"
    result = run_module("paddletrain.fit", [*TINY, "data.holdout=0.25", "callbacks.visualdl=null",
                                            f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert sum(map(sum, summary["val/confusion_matrix"])) == 18  # a quarter of each class of the 64 training images

    def evaluate(*extra: str) -> dict:
        ran = run_module("paddletrain.evaluate", [f"checkpoint={run_dir}:best", *extra,
                                                  f"hydra.run.dir={tmp_path / 'ev'}"], cwd=tmp_path)
        assert ran.returncode == 0, ran.stderr[-3000:]
        return json.loads(ran.stdout.strip().splitlines()[-1])

    val = evaluate()
    assert val["split"] == "val" and val["val/top1"] == summary["val/top1"]
    test = evaluate("split=test")
    assert test["split"] == "test" and "val/top1" not in test and 0 <= test["test/top1"] <= 1
    assert sum(map(sum, test["test/confusion_matrix"])) == 32  # the shapes val split, now the test split


@pytest.mark.parametrize("override, line", [
    ("trainer.max_epoch=3", "unknown config key trainer.max_epoch (not in the schema; did you mean "
                            "trainer.max_epochs, trainer.max_steps?)"),
    ("optim.lr=fast", "optim.lr: Value 'fast' of type 'str' could not be converted to Float"),
    ("model=resnet_20", "In 'fit': Could not find 'model/resnet_20'; did you mean resnet20, resnet50, resnet32?"),
    ("trainer.distill.teacher_options={arch:x}", "trainer.distill.teacher_options takes any key, but a new one "
                                                 "needs a leading +: +trainer.distill.teacher_options.arch=<value>"),
])
def test_a_command_line_hydra_rejects_is_one_line(tmp_path, override, line):
    run_dir = tmp_path / "run"
    result = run_module("paddletrain.fit", [override, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 2
    assert (result.stdout + result.stderr).strip().splitlines() == [f"[paddletrain][ERROR] - {line}"]
    assert not run_dir.exists()


def test_hydra_full_error_keeps_hydras_own_report(tmp_path):
    env_result = run_module("paddletrain.fit", ["trainer.max_epoch=3", f"hydra.run.dir={tmp_path / 'run'}"],
                            cwd=tmp_path, env={"HYDRA_FULL_ERROR": "1"})
    assert env_result.returncode != 0
    assert "Traceback" in env_result.stderr and "ConfigCompositionException" in env_result.stderr


def test_bad_choice_fails_before_building_anything(tmp_path):
    result = run_module("paddletrain.fit", [*TINY, "optim.name=rmsprob", f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2
    assert "optim.name='rmsprob'; did you mean rmsprop?" in output and "Traceback" not in output
    assert "Device" not in output  # stopped before the runtime was even set up


def test_missing_data_root_names_the_key(tmp_path):
    result = run_module("paddletrain.fit", ["data=imagefolder", f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "data.root" in output and "Traceback" not in output


def test_multirun_sweep(tmp_path):
    result = run_module("paddletrain.fit", ["-m", *TINY, "optim.lr=0.1,0.05", "callbacks.checkpoint=null",
                                            "callbacks.visualdl=null", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summaries = sorted((tmp_path / "sweep").glob("*/summary.json"))
    assert len(summaries) == 2


@pytest.mark.slow
def test_the_default_job_trains_a_real_model(tmp_path):
    """The README's first command, unchanged: resnet20 on the embedded shapes data must reach 0.90 top-1.

    Slow (2 minutes on 2 idle cores): the default suite runs the same command shrunk (tests/test_docs.py)."""
    run_dir = tmp_path / "default"
    result = run_module("paddletrain.fit", [f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["epochs"] == 5
    assert summary["val/top1"] >= 0.90, summary


def test_batch_larger_than_the_training_split_is_an_error(tmp_path):
    result = run_module("paddletrain.fit", [*TINY, "data.batch_size=128", f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "data.batch_size=128" in output and "64 training samples" in output
    assert "Traceback" not in output


def test_fewer_classes_than_the_dataset_is_an_error(tmp_path):
    result = run_module("paddletrain.fit", [*TINY, "model.num_classes=3", f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "model.num_classes=3" in output and "6 classes" in output
    assert "Traceback" not in output


def test_train_accepts_a_user_builder_extra_callbacks_and_a_trainer_subclass(tmp_path):
    if "user_mlp" not in list_models():
        @register_model
        def user_mlp(num_classes: int = 10, in_chans: int = 3) -> paddle.nn.Layer:  # takes no other option
            return paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(in_chans * 16 * 16, num_classes))

    class Counting(Trainer):
        def training_step(self, batch, batch_idx):
            self.steps_seen = getattr(self, "steps_seen", 0) + 1
            return super().training_step(batch, batch_idx)

    class Ends(Callback):
        def on_fit_end(self, trainer):
            self.steps = trainer.steps_seen

    ends = Ends()
    cfg = compose_fit([*TINY, "model.name=user_mlp", "callbacks.visualdl=null", "callbacks.checkpoint=null",
                       "data.num_workers=0"])
    metrics = train(cfg, tmp_path, callbacks=[ends], trainer_cls=Counting)
    assert ends.steps == 4 and "val/top1" in metrics


def test_an_imbalanced_folder_trains_with_balanced_weights_sampler_and_focal_loss(tmp_path, caplog):
    """12 images of `common` against 3 of `rare`: the weights are sklearn's, the sampler is class-balanced and the
    checkpoints are ranked by balanced accuracy."""
    rng = np.random.default_rng(0)
    for split, counts in (("train", {"common": 12, "rare": 3}), ("val", {"common": 4, "rare": 2})):
        for name, count in counts.items():
            (tmp_path / "data" / split / name).mkdir(parents=True)
            for i in range(count):
                Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(
                    tmp_path / "data" / split / name / f"{i}.png")
    cfg = compose_fit([*TINY, "data=imagefolder", f"data.root={tmp_path / 'data'}", "data.image_size=8",
                       "data.batch_size=5", "data.num_workers=0", "loss=focal", "loss.class_weights=balanced",
                       "data.sampler=class_balanced", "monitor=val/balanced_accuracy", "callbacks.visualdl=null"])
    validate_config(cfg)
    run = build_run(cfg, tmp_path / "run")
    assert isinstance(run.train_loader.batch_sampler, WeightedBatchSampler)
    np.testing.assert_allclose(run.trainer.loss_fn.keywords["class_weights"].numpy(), [15 / 24, 15 / 6], rtol=1e-6)
    with caplog.at_level(logging.INFO, logger="paddletrain"):
        metrics = train(cfg, tmp_path / "run")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["best"]["monitor"] == "val/balanced_accuracy"
    assert summary["best"]["value"] == pytest.approx(metrics["val/balanced_accuracy"])  # one epoch: the best
    assert summary["val/classes"] == ["common", "rare"]
    assert [row["support"] for row in summary["val/per_class"].values()] == [4, 2]
    assert "loss.class_weights=balanced: 0.625, 2.5" in caplog.text



HYMENOPTERA = Path("/work/shared/data/hymenoptera_data")


@pytest.mark.skipif(not HYMENOPTERA.is_dir(), reason=f"the ants/bees images are not at {HYMENOPTERA}")
def test_the_class_balanced_sampler_evens_out_a_12_to_1_split_of_the_ants_and_bees_photos(tmp_path):
    # Every ant photo against 10 bee photos, as a label list: the draw of an epoch is about half bees.
    ants = sorted((HYMENOPTERA / "train" / "ants").glob("*.jpg"))
    bees = sorted((HYMENOPTERA / "train" / "bees").glob("*.jpg"))[:10]
    (tmp_path / "train.txt").write_text("".join(f"train/ants/{p.name} 0\n" for p in ants)
                                         + "".join(f"train/bees/{p.name} 1\n" for p in bees))
    cfg = compose_fit([*TINY, "data=labellist", f"data.root={HYMENOPTERA}", f"data.train_list={tmp_path}/train.txt",
                       f"data.val_list={tmp_path}/train.txt", "data.image_size=32", "data.num_workers=0",
                       "data.sampler=class_balanced", "loss=focal", "loss.class_weights=balanced",
                       "callbacks.visualdl=null"])
    validate_config(cfg)
    run = build_run(cfg, tmp_path / "run")
    sampler = run.train_loader.batch_sampler
    sampler.set_epoch(0)
    # the list's order is the index's: the first len(ants) samples are ants (label 0), the rest bees
    drawn = np.array([key.index for batch in sampler for key in batch]) >= len(ants)
    # 131 draws of p = 1/2: 3.5 standard deviations either side is [0.35, 0.65]
    assert len(ants) / len(bees) > 10 and 0.35 < drawn.mean() < 0.65, drawn.mean()
    weights = run.trainer.loss_fn.keywords["class_weights"].numpy()
    total = len(ants) + len(bees)
    np.testing.assert_allclose(weights, [total / (2 * len(ants)), total / (2 * len(bees))], rtol=1e-6)


def test_class_weights_of_the_wrong_length_end_in_one_line_naming_the_key(tmp_path):
    result = run_module("paddletrain.fit", [*TINY, "loss.class_weights=[1,2]", f"hydra.run.dir={tmp_path}"],
                        cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and "Traceback" not in output
    assert "loss.class_weights has 2 values but the model has 6 classes" in output


@pytest.mark.parametrize("accumulate", [1, 3])
@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("limit", [None, 4])
def test_the_last_optimizer_step_trains_with_the_schedules_last_learning_rate(tmp_path, accumulate, drop_last, limit):
    """The schedule spans exactly the optimizer steps the Trainer takes: no flat tail at min_lr, none cut off."""
    class RecordLR(Callback):
        def __init__(self):
            self.lrs = []

        def on_before_optimizer_step(self, trainer, optimizer):
            self.lrs.append(trainer.current_lr)

    # 70 images in batches of 16: 4 full batches, plus a fifth of 6 images without drop_last.
    batches = min(4 if drop_last else 5, limit or 99)
    expected_steps = 2 * math.ceil(batches / accumulate)  # two epochs; a short last group still steps
    record = RecordLR()
    cfg = compose_fit([*TINY, "data.shapes.num_train=70", f"data.drop_last={drop_last}", "trainer.max_epochs=2",
                       f"trainer.accumulate_grad_batches={accumulate}",
                       f"trainer.limit_train_batches={limit or 'null'}",
                       "sched.warmup_epochs=0", "sched.min_lr=0", "optim.lr=0.1", "callbacks.visualdl=null",
                       "callbacks.checkpoint=null", "trainer.val_every_n_epochs=0"])
    train(cfg, tmp_path, callbacks=[record])
    assert len(record.lrs) == expected_steps
    # Cosine from 0.1 to 0 over exactly those steps: strictly falling, the last one at step T - 1 of T.
    assert record.lrs[0] == pytest.approx(0.1)
    assert all(b < a for a, b in itertools.pairwise(record.lrs)), record.lrs
    last = 0.1 * 0.5 * (1 + math.cos(math.pi * (expected_steps - 1) / expected_steps))
    assert record.lrs[-1] == pytest.approx(last, rel=1e-6)


def test_class_balanced_training_resumed_mid_epoch_ends_as_an_uninterrupted_run(tmp_path):
    """The sampler's draw, its position and the weighted focal loss survive a checkpoint mid-epoch (fresh
    processes, as a resume is: layer names would differ between two models built in one)."""
    from paddletrain.checkpoint import find_latest, load_checkpoint

    parts = [*TINY, "trainer.max_epochs=2", "data.num_workers=0", "data.sampler=class_balanced", "loss=focal",
             "loss.class_weights=[1,2,3,1,2,3]", "callbacks.visualdl=null"]

    def fit(run_dir, *extra):
        result = run_module("paddletrain.fit", [*parts, *extra, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
        assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
        return load_checkpoint(find_latest(run_dir / "checkpoints")).state

    straight = fit(tmp_path / "straight")
    stopped = fit(tmp_path / "resumed", "trainer.max_steps=6")  # 4 steps per epoch: batch 2 of the second
    assert stopped["progress"]["batch_in_epoch"] == 2 and stopped["sampler"]["sampling"].startswith("weighted:")
    resumed = fit(tmp_path / "resumed", "trainer.resume=auto")
    assert resumed["progress"]["global_step"] == straight["progress"]["global_step"] == 8
    for key, value in straight["model"].items():
        np.testing.assert_array_equal(resumed["model"][key].numpy(), value.numpy(), err_msg=key)
