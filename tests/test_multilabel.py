"""Multi-label classification (issue 18): metrics against NumPy references, the loss and its smoothing, Mixup on
multi-hot rows, the config rules, the export's parity rule, and fit -> evaluate -> export -> predict via the CLI."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import paddle
import pytest
from omegaconf import OmegaConf
from PIL import Image

from paddletrain.config import LossConfig
from paddletrain.data.transforms.mixup import Mixup
from paddletrain.deploy.exporter import TOLERANCE, compare_logits
from paddletrain.errors import ConfigError, ExitCode
from paddletrain.losses import binary_cross_entropy, build_loss, loss_name
from paddletrain.metrics.multilabel import MultiLabelMeter, average_precision, multilabel_report
from tests.conftest import run_module, write_multilabel_squares


# ---------------------------------------------------------------------------------------------- references
def reference_ap(scores: np.ndarray, targets: np.ndarray) -> float:
    """scikit-learn's AP written out: sum over distinct thresholds (high to low) of (R_k - R_{k-1}) * P_k."""
    positives = targets.sum()
    ap, last_recall = 0.0, 0.0
    for threshold in sorted(set(scores.tolist()), reverse=True):
        chosen = scores >= threshold
        tp = float((chosen & (targets == 1)).sum())
        recall = tp / positives
        ap += (recall - last_recall) * tp / chosen.sum()
        last_recall = recall
    return ap


def test_ap_matches_hand_computed_values_with_and_without_ties():
    scores = np.array([[0.9, 0.5], [0.8, 0.5], [0.7, 0.5], [0.6, 0.1]])
    targets = np.array([[1, 1], [0, 0], [1, 1], [0, 1]])
    # column 0: hits at ranks 1 and 3 -> (1 + 2/3) / 2; column 1: three tied at 0.5 hold 2 of 3 positives
    # (P 2/3, R 2/3), then 0.1 adds the third (P 3/4, R 1).
    expected = [(1 + 2 / 3) / 2, 2 / 3 * 2 / 3 + 1 / 3 * 3 / 4]
    np.testing.assert_allclose(average_precision(scores, targets), expected, rtol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_ap_matches_the_reference_on_random_scores_with_many_ties(seed):
    rng = np.random.default_rng(seed)
    # scores on a coarse grid: most values are shared by several samples
    scores = rng.integers(0, 6, size=(40, 7)) / 5.0
    targets = (rng.random((40, 7)) < 0.3).astype(np.uint8)
    targets[0, :] = 1  # every class has a positive
    found = average_precision(scores, targets)
    expected = [reference_ap(scores[:, c], targets[:, c]) for c in range(7)]
    np.testing.assert_allclose(found, expected, rtol=1e-12)


def test_map_and_f1_count_only_classes_with_positives():
    scores = np.array([[0.9, 0.2, 0.7], [0.4, 0.6, 0.8], [0.3, 0.1, 0.2]])
    targets = np.array([[1, 0, 0], [0, 1, 0], [1, 0, 0]])  # class 2 has no positive
    report = multilabel_report(scores, targets, threshold=0.5)
    assert np.isnan(report.ap[2]) and np.isnan(report.f1[2]) and np.isnan(report.recall[2])
    metrics = report.metrics("val")
    np.testing.assert_allclose(metrics["val/mAP"], np.mean([reference_ap(scores[:, c], targets[:, c])
                                                             for c in (0, 1)]), rtol=1e-12)
    # counted by hand at 0.5: predictions (0,0), (0,2), (1,1), (1,2); TP (0,0), (1,1)
    tp, predicted, positives = 2, 4, 3
    assert metrics["val/precision"] == pytest.approx(tp / predicted)
    assert metrics["val/recall"] == pytest.approx(tp / positives)
    assert metrics["val/f1"] == pytest.approx(2 * tp / (predicted + positives))
    # per class: class 0 P 1, R 1/2 -> F1 2/3; class 1 P 1, R 1 -> F1 1
    assert metrics["val/f1_macro"] == pytest.approx((2 / 3 + 1) / 2)
    assert report.positives.tolist() == [2, 1, 0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_meter_over_batches_equals_the_report_of_the_whole_set(seed):
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(23, 5)).astype(np.float32)
    targets = (rng.random((23, 5)) < 0.4).astype(np.float32)
    meter = MultiLabelMeter(5, threshold=0.4)
    losses = []
    for start in range(0, 23, 8):
        part = slice(start, start + 8)
        loss = binary_cross_entropy(paddle.to_tensor(logits[part]), paddle.to_tensor(targets[part]), multilabel=True)
        losses.append((float(loss), len(logits[part])))
        meter.update(loss, paddle.to_tensor(logits[part]), paddle.to_tensor(targets[part]), len(logits[part]))
    metrics = meter.compute("val")
    scores = 1 / (1 + np.exp(-logits.astype(np.float64)))
    expected = multilabel_report(scores, targets, threshold=0.4).metrics("val")
    for key, value in expected.items():  # scores pass through float32 on the device: compare at its precision
        assert metrics[key] == pytest.approx(value, rel=1e-5), key
    assert metrics["val/loss"] == pytest.approx(sum(v * n for v, n in losses) / 23, rel=1e-6)
    assert not any(key.startswith("val/top") for key in metrics)


# ---------------------------------------------------------------------------------------------- loss
def test_multilabel_bce_smooths_each_class_towards_one_half():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 4))
    targets = (rng.random((6, 4)) < 0.5).astype(np.float32)
    eps = 0.2
    smoothed = targets * (1 - eps) + eps / 2  # Keras's BinaryCrossentropy(label_smoothing=eps)
    expected = np.mean(np.logaddexp(0, logits) - smoothed * logits)  # BCE with logits, per element
    found = binary_cross_entropy(paddle.to_tensor(logits.astype(np.float32)), paddle.to_tensor(targets),
                                 label_smoothing=eps, multilabel=True)
    assert float(found) == pytest.approx(expected, rel=1e-5)
    # target_threshold comes after the smoothing, as timm orders them: smoothed 0/1 rows become 0/1 again
    thresholded = binary_cross_entropy(paddle.to_tensor(logits.astype(np.float32)), paddle.to_tensor(targets),
                                       label_smoothing=eps, target_threshold=0.5, multilabel=True)
    plain = binary_cross_entropy(paddle.to_tensor(logits.astype(np.float32)), paddle.to_tensor(targets),
                                 multilabel=True)
    assert float(thresholded) == pytest.approx(float(plain), rel=1e-6)
    with pytest.raises(ValueError, match="multi-label targets"):
        binary_cross_entropy(paddle.to_tensor(logits.astype(np.float32)), paddle.to_tensor([0, 1, 2, 3, 0, 1]),
                             multilabel=True)


def test_the_default_loss_follows_the_task_and_a_softmax_loss_is_refused_for_multilabel():
    assert loss_name(None) == "cross_entropy" and loss_name(None, multilabel=True) == "binary_cross_entropy"
    assert loss_name("Binary_Cross_Entropy", multilabel=True) == "binary_cross_entropy"
    for name in ("cross_entropy", "soft_target_cross_entropy"):
        with pytest.raises(ConfigError, match=f"loss.name={name} .*data.multilabel=true"):
            loss_name(name, multilabel=True)
    loss = build_loss(LossConfig(label_smoothing=0.1), multilabel=True)
    targets = paddle.to_tensor([[1.0, 0.0, 1.0]])
    logits = paddle.to_tensor([[0.3, -0.2, 1.0]])
    manual = binary_cross_entropy(logits, targets * 0.9 + 0.05)
    assert float(loss(logits, targets)) == pytest.approx(float(manual), rel=1e-6)


# ---------------------------------------------------------------------------------------------- mixup
@pytest.mark.parametrize(("mixup_alpha", "cutmix_alpha"), [(1.0, 0.0), (0.0, 1.0)])
@pytest.mark.parametrize("mode", ["batch", "elem"])
def test_mixup_mixes_multi_hot_rows_with_the_drawn_weights(mixup_alpha, cutmix_alpha, mode):
    rng = np.random.default_rng(7)
    images = paddle.to_tensor(rng.random((5, 3, 8, 8)).astype(np.float32))
    rows = (rng.random((5, 4)) < 0.5).astype(np.float32)
    mixup = Mixup(4, mixup_alpha=mixup_alpha, cutmix_alpha=cutmix_alpha, mode=mode, label_smoothing=0.0, seed=3)
    params = mixup.draw(5, 8, 8)
    _, targets = mixup.apply(images, paddle.to_tensor(rows), params)
    lam = params.lam[:, None]
    np.testing.assert_allclose(targets.numpy(), lam * rows + (1 - lam) * rows[::-1], rtol=1e-6, atol=1e-7)
    # a class present in either image keeps a weight; smoothing afterwards equals mixing smoothed rows
    eps = 0.1
    np.testing.assert_allclose(targets.numpy() * (1 - eps) + eps / 2,
                               lam * (rows * (1 - eps) + eps / 2) + (1 - lam) * (rows[::-1] * (1 - eps) + eps / 2),
                               rtol=1e-6)


def test_mixup_with_label_smoothing_refuses_multi_hot_rows():
    mixup = Mixup(3, mixup_alpha=1.0, label_smoothing=0.1)
    with pytest.raises(ValueError, match="belongs to the multi-label loss"):
        mixup(paddle.zeros([2, 3, 4, 4]), paddle.to_tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))
    with pytest.raises(ValueError, match="rows of 2 classes, not 3"):
        Mixup(3, mixup_alpha=1.0, label_smoothing=0.0)(paddle.zeros([2, 3, 4, 4]), paddle.ones([2, 2]))


# ---------------------------------------------------------------------------------------------- export parity
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_multilabel_parity_judges_decisions_at_the_threshold_and_the_uncentred_error(seed):
    rng = np.random.default_rng(seed)
    reference = rng.normal(scale=3.0, size=(16, 6))
    tolerance = TOLERANCE["fp32"]
    noisy = reference * (1 + rng.normal(scale=1e-6, size=reference.shape))
    report = compare_logits(noisy, reference, tolerance, threshold=0.5)
    assert report.passed and report.decision_agreement == 1.0 and report.top1_agreement is None
    # a constant shift leaves softmax unchanged but moves every sigmoid: the single-label rule misses it
    shifted = reference + 0.5
    assert compare_logits(shifted, reference, tolerance).passed
    shifted_report = compare_logits(shifted, reference, tolerance, threshold=0.5)
    assert not shifted_report.passed and shifted_report.decision_flips > 0
    # a logit far from the boundary that changes side is a clear flip; one at the boundary is not
    flipped = reference.copy()
    row, col = np.unravel_index(np.argmax(np.abs(reference)), reference.shape)
    flipped[row, col] = -reference[row, col]
    report = compare_logits(flipped, reference, 0.1, threshold=0.5)
    assert report.decision_flips == 1 and not report.passed
    reference[0, 0], near = 1e-4, reference.copy()
    near[0, 0] = -1e-4
    report = compare_logits(near, reference, tolerance, threshold=0.5)
    assert report.decision_agreement < 1 and report.decision_flips == 0 and report.passed


# ---------------------------------------------------------------------------------------------- config rules
def _config(*overrides: str, command: str = "fit"):
    from hydra import compose, initialize_config_module

    from paddletrain.config import register_configs

    register_configs()
    with initialize_config_module("paddletrain.conf", version_base="1.3"):
        return compose(command, overrides=["data=labellist", "data.root=/tmp", "data.train_list=a.txt",
                                         "data.val_list=b.txt", "data.multilabel=true", *overrides])


@pytest.mark.parametrize(("overrides", "message"), [
    (["loss=cross_entropy"], "loss.name=cross_entropy is a single-label (softmax) loss but data.multilabel=true"),
    (["callbacks.checkpoint.monitor=val/top1"], "callbacks.checkpoint.monitor=val/top1 does not exist"),
    (["monitor=val/top5"], "monitor=val/top5 does not exist with data.multilabel=true"),
    (["data=imagefolder", "data.multilabel=true"], "data.name=imagefolder has one class per image"),
])
def test_config_rules_of_a_multilabel_run(overrides, message):
    from paddletrain.validation import validate_config

    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_config(_config(*overrides), use="export")


def test_test_time_augmentation_is_refused_for_multilabel():
    from paddletrain.validation import validate_config

    cfg = _config("checkpoint=x", "tta.flip=true", command="evaluate")
    with pytest.raises(ConfigError, match="tta.flip/crops/translate average softmax outputs"):
        validate_config(cfg, use="export")
    with pytest.raises(ConfigError, match=r"set trainer\.tta\.flip=false trainer\.tta\.crops=1 trainer\.tta\."
                                          r"translate=0"):
        validate_config(_config("trainer.tta.translate=1"))


def test_validation_scores_are_gathered_from_ranks_of_unequal_size(monkeypatch):
    """Two ranks simulated: this one holds 3 rows, the other 1; all_gather needs equal shapes, so both pad."""
    from paddletrain.metrics import multilabel as metrics_multilabel

    other = paddle.to_tensor([[9.0, 8.0]])

    def all_gather(out: list, tensor: paddle.Tensor) -> None:
        if tensor.shape == [1]:  # the row counts
            out.extend([tensor, paddle.to_tensor([other.shape[0]], dtype="int64")])
            return
        assert tensor.shape[0] >= other.shape[0]  # padded to the largest rank's rows
        theirs = other.astype(tensor.dtype)
        if tensor.shape[0] > other.shape[0]:
            theirs = paddle.concat([theirs, paddle.zeros([tensor.shape[0] - other.shape[0], 2], tensor.dtype)])
        out.extend([tensor, theirs])

    monkeypatch.setattr(paddle.distributed, "all_gather", all_gather)
    mine = paddle.to_tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    gathered = metrics_multilabel._all_gather_rows(mine)
    assert gathered.numpy().tolist() == [[1, 2], [3, 4], [5, 6], [9, 8]]
    other = paddle.to_tensor([[7.0, 7.0], [6.0, 6.0], [5.0, 5.0]])  # now this rank is the smaller: it pads itself
    gathered = metrics_multilabel._all_gather_rows(paddle.to_tensor([[1.0, 2.0]]))
    assert gathered.numpy().tolist() == [[1, 2], [7, 7], [6, 6], [5, 5]]
    meter = MultiLabelMeter(2, world_size=2)
    meter.update(paddle.to_tensor(0.5), paddle.to_tensor([[0.0, 0.0]]), paddle.to_tensor([[1.0, 0.0]]), 1)
    other = paddle.to_tensor([[0.0, 1.0]])  # the other rank's targets; its logits are the same shape
    scores, targets = meter._gathered()
    assert scores.shape == (2, 2) and targets.tolist() == [[1, 0], [0, 1]]


def test_a_multilabel_run_monitors_map_unless_told_otherwise():
    from paddletrain.build import monitored_metric, resolve_task
    from paddletrain.validation import validate_config

    cfg = _config()
    validate_config(cfg, use="export")
    resolved = resolve_task(cfg)
    assert monitored_metric(cfg) == "val/mAP" and resolved.callbacks.checkpoint.monitor == "val/mAP"
    assert OmegaConf.select(resolved, "callbacks.checkpoint.mode") == "max"
    assert monitored_metric(_config("monitor=val/f1")) == "val/f1"


# ---------------------------------------------------------------------------------------------- CLI end to end
NAMES = ["red", "green", "blue", "yellow"]


@pytest.fixture
def squares(tmp_path: Path) -> Path:
    """16x16 images holding 2 of 4 coloured squares (one per quadrant), in PaddleClas multi-label lists."""
    root = write_multilabel_squares(tmp_path / "data")
    (root / "names.txt").write_text("\n".join(NAMES) + "\n")
    return root


def _fit_args(root: Path, run_dir: Path, *extra: str) -> list[str]:
    return ["data=labellist", "data.multilabel=true", f"data.root={root}", "data.train_list=train_list.txt",
            "data.val_list=val_list.txt", "data.class_names=names.txt", "model=resnet20", "data.image_size=16",
            "data.batch_size=8", "data.num_workers=0", "trainer.max_epochs=2", "trainer.cpu_threads=1",
            "callbacks.progress_bar.enabled=false", "data.train_transform=small", "data.eval_transform=small",
            *extra, f"hydra.run.dir={run_dir}"]


def test_fit_evaluate_export_and_predict_a_multilabel_list(squares, tmp_path):
    run_dir = tmp_path / "run"
    result = run_module("paddletrain.fit", _fit_args(squares, run_dir, "data.mixup.mixup_alpha=0.2",
                                                      "loss.label_smoothing=0.1"), cwd=squares)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0 <= summary["val/mAP"] <= 1 and 0 <= summary["val/f1"] <= 1 and "val/top1" not in summary
    assert summary["best"]["monitor"] == "val/mAP" and "| val/mAP " in output
    result = run_module("paddletrain.evaluate", [f"checkpoint={run_dir}:best", f"hydra.run.dir={tmp_path / 'ev'}"],
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    evaluated = json.loads(result.stdout.strip().splitlines()[-1])
    assert evaluated["val/mAP"] == pytest.approx(summary["best"]["value"], abs=1e-6)
    assert [row["class"] for row in evaluated["val/per_class"]] == NAMES
    assert all(row["positives"] == 6 for row in evaluated["val/per_class"])  # each colour is in half the pairs
    table = result.stdout + result.stderr
    assert "class       AP    prec  recall      F1  positives" in table and "\nyellow  " in table
    export_dir = tmp_path / "export"
    result = run_module("paddletrain.export", [f"checkpoint={run_dir}:best", f"out_dir={export_dir}",
                                               "num_check_images=6", f"hydra.run.dir={tmp_path / 'ex'}"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    parity = json.loads(result.stdout.strip().splitlines()[-1])["parity"]
    assert parity["passed"] and parity["threshold"] == 0.5 and parity["decision_flips"] == 0
    meta = json.loads((export_dir / "preprocess.json").read_text())
    assert meta["multilabel"] is True and meta["threshold"] == 0.5 and meta["labels"] == NAMES
    preds = tmp_path / "preds.jsonl"
    result = run_module("paddletrain.predict", [f"model_dir={export_dir}", "input=val_list.txt",
                                                f"data_root={squares}", f"output={preds}", "num_workers=0",
                                                "progress_bar=false", "topk=3", "threshold=0.3",
                                                f"hydra.run.dir={tmp_path / 'pr'}"], cwd=squares)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in preds.read_text().splitlines()]
    pairs = list(itertools.combinations(range(4), 2))
    assert [line["target"] for line in lines] == [list(pairs[i % 6]) for i in range(12)]
    for line in lines:
        assert all(score > 0.3 for score in line["scores"]) and line["scores"] == sorted(line["scores"])[::-1]
        assert line["labels"] == [NAMES[i] for i in line["class_ids"]] and len(line["topk_scores"]) == 3
        above = [s for s in line["topk_scores"] if s > 0.3]  # the top-k agree with the thresholded labels
        assert line["scores"][:len(above)] == above


def test_two_ranks_gather_multilabel_scores_as_one_process_computes_them(squares, tmp_path):
    """A real two-rank run (gloo) on 11 validation images, 6 and 5 per rank: its val/mAP is what one process
    computes on the same checkpoint and images, so no rank's rows are lost, padded in or counted twice."""
    lines = (squares / "val_list.txt").read_text().splitlines()[:11]
    (squares / "val_list.txt").write_text("\n".join(lines) + "\n")
    # The squares repeat every 6 images, and identical images tie exactly or differ in the last bits depending on
    # their place in a batch (1e-8 here on oneDNN), which reorders them in the ranking: one corner pixel apiece
    # makes every score distinct, so mAP compares the rows gathered, not how a tie fell.
    for i, line in enumerate(lines):
        path = squares / line.split("\t")[0]
        pixels = np.asarray(Image.open(path)).copy()
        pixels[0, 0] = (10 * i, 0, 255 - 10 * i)
        Image.fromarray(pixels).save(path)
    run_dir = tmp_path / "run"
    result = run_module("paddletrain.fit", _fit_args(squares, run_dir, "trainer.devices=2", "callbacks.visualdl=null"),
                        cwd=squares, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["best"]["monitor"] == "val/mAP"
    result = run_module("paddletrain.evaluate", [f"checkpoint={run_dir}:best", f"hydra.run.dir={tmp_path / 'ev'}"],
                        cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    evaluated = json.loads(result.stdout.strip().splitlines()[-1])
    assert sum(row["positives"] for row in evaluated["val/per_class"]) == 22  # 11 images, 2 classes each
    assert evaluated["val/mAP"] == pytest.approx(summary["best"]["value"], abs=1e-6)


def test_a_softmax_loss_with_multilabel_stops_fit_with_one_line(squares, tmp_path):
    result = run_module("paddletrain.fit", _fit_args(squares, tmp_path / "run", "loss=cross_entropy"), cwd=squares)
    output = result.stdout + result.stderr
    assert result.returncode == ExitCode.USER_ERROR and "Traceback" not in output
    assert "loss.name=cross_entropy is a single-label (softmax) loss but data.multilabel=true" in output


HYMENOPTERA = Path("/work/shared/data/hymenoptera_data")


@pytest.mark.skipif(not HYMENOPTERA.is_dir(), reason=f"the ants/bees images are not at {HYMENOPTERA}")
def test_a_multilabel_list_of_the_ants_and_bees_photos_trains_and_reports_map(tmp_path):
    # Two columns (ants, bees), one of them on: real JPEGs of every size through the multi-label path.
    for split in ("train", "val"):
        lines = [f"{split}/{name}/{image.name}\t{'1,0' if name == 'ants' else '0,1'}"
                 for name in ("ants", "bees") for image in sorted((HYMENOPTERA / split / name).glob("*.jpg"))]
        (tmp_path / f"{split}.txt").write_text("\n".join(lines) + "\n")
    (tmp_path / "names.txt").write_text("ants\nbees\n")
    run_dir = tmp_path / "run"
    result = run_module("paddletrain.fit", [
        "data=labellist", "data.multilabel=true", f"data.root={HYMENOPTERA}", f"data.train_list={tmp_path}/train.txt",
        f"data.val_list={tmp_path}/val.txt", f"data.class_names={tmp_path}/names.txt", "model=resnet20",
        "data.image_size=32", "data.batch_size=16", "data.num_workers=0", "trainer.max_epochs=1",
        "trainer.limit_train_batches=3", "trainer.limit_val_batches=2", "trainer.cpu_threads=1",
        "callbacks.progress_bar.enabled=false", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert 0.0 <= summary["val/mAP"] <= 1.0 and "val/top1" not in summary
    assert summary["best"]["monitor"] == "val/mAP"
