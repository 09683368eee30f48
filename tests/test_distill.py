"""Distillation: KD and SSLD losses against their formulas, the combined loss, and the Distiller's teacher
(eval mode, no gradients, same autocast, never in the student's checkpoint, exact resume through a Trainer)."""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import paddle
import pytest

from paddletrain.checkpoint import save_checkpoint
from paddletrain.data.loading.loaders import CheckedDataLoader, SeededDataset
from paddletrain.data.sampling.sampler import ResumableBatchSampler
from paddletrain.distill import DistillConfig, Distiller, distillation_loss, kd_loss, ssld_loss
from paddletrain.engine.limits import Limits
from paddletrain.engine.precision import Precision
from paddletrain.engine.trainer import Trainer
from paddletrain.errors import ConfigError
from paddletrain.validation import validate_config
from tests.conftest import TINY, compose_fit

paddle.set_device("cpu")

RNG = np.random.default_rng(0)
STUDENT = RNG.standard_normal((4, 6)).astype("float32") * 2
TEACHER = RNG.standard_normal((4, 6)).astype("float32") * 3
LABELS = np.array([1, 5, 0, 2])


def softmax(x, temperature=1.0):
    z = x.astype("float64") / temperature
    z = np.exp(z - z.max(axis=1, keepdims=True))
    return z / z.sum(axis=1, keepdims=True)


def kl(p, q):
    """KL(p || q) per sample."""
    return (p * (np.log(p) - np.log(q))).sum(axis=1)


def t(array):
    return paddle.to_tensor(array)


def value(loss):
    return float(loss.numpy())


# ---------------------------------------------------------------------------------------------- losses
@pytest.mark.parametrize("temperature", [1.0, 4.0])
def test_kd_loss_is_t_squared_times_the_kl_of_the_softened_teacher_to_the_student(temperature):
    expected = temperature**2 * kl(softmax(TEACHER, temperature), softmax(STUDENT, temperature)).mean()
    assert value(kd_loss(t(STUDENT), t(TEACHER), temperature)) == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("temperature", [0.5, 1.0, 4.0])
def test_losses_are_zero_when_the_student_equals_the_teacher(temperature):
    assert value(kd_loss(t(TEACHER), t(TEACHER), temperature)) == pytest.approx(0.0, abs=1e-6)
    assert value(ssld_loss(t(TEACHER), t(TEACHER))) == pytest.approx(0.0, abs=1e-6)
    # Logits shifted by a constant give the same distribution: still zero.
    assert value(kd_loss(t(TEACHER + 3.0), t(TEACHER), temperature)) == pytest.approx(0.0, abs=1e-5)


def test_kd_gradient_is_t_times_the_softened_probability_difference():
    temperature = 3.0
    student = t(STUDENT)
    student.stop_gradient = False
    kd_loss(student, t(TEACHER), temperature).backward()
    expected = temperature * (softmax(STUDENT, temperature) - softmax(TEACHER, temperature)) / len(STUDENT)
    np.testing.assert_allclose(student.grad.numpy(), expected, rtol=1e-4, atol=1e-7)


def test_ssld_loss_is_paddleclas_symmetric_kl():
    p_s, p_t = softmax(STUDENT), softmax(TEACHER)
    expected = 0.5 * (kl(p_t, p_s) + kl(p_s, p_t)).mean()
    assert value(ssld_loss(t(STUDENT), t(TEACHER))) == pytest.approx(expected, rel=1e-5)
    assert value(ssld_loss(t(TEACHER), t(STUDENT))) == pytest.approx(expected, rel=1e-5)  # symmetric


def test_combined_loss_weights_distillation_against_the_hard_labels():
    alpha, temperature = 0.3, 2.0
    kd = temperature**2 * kl(softmax(TEACHER, temperature), softmax(STUDENT, temperature)).mean()
    ce = -np.log(softmax(STUDENT)[np.arange(4), LABELS]).mean()
    got = distillation_loss(t(STUDENT), t(TEACHER), t(LABELS), kind="kd", alpha=alpha, temperature=temperature)
    assert value(got) == pytest.approx(alpha * kd + (1 - alpha) * ce, rel=1e-5)
    # alpha = 1 needs no labels (unlabeled images).
    unlabeled = distillation_loss(t(STUDENT), t(TEACHER), None, kind="ssld", alpha=1.0)
    assert value(unlabeled) == pytest.approx(value(ssld_loss(t(STUDENT), t(TEACHER))))
    with pytest.raises(ValueError, match="needs labels"):
        distillation_loss(t(STUDENT), t(TEACHER), None, kind="kd", alpha=0.5)


# ---------------------------------------------------------------------------------------------- distiller
def teacher_net(seed: int = 0) -> paddle.nn.Layer:
    paddle.seed(seed)
    return paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.BatchNorm1D(16), paddle.nn.ReLU(),
                                paddle.nn.Dropout(0.5), paddle.nn.Linear(16, 3))


def student_net(seed: int = 1) -> paddle.nn.Layer:
    paddle.seed(seed)
    return paddle.nn.Linear(8, 3)


def batches(n: int, seed: int = 0, size: int = 8):
    rng = np.random.default_rng(seed)
    return [(t(rng.standard_normal((size, 8)).astype("float32")), t(rng.integers(0, 3, size).astype("int64")))
            for _ in range(n)]


def test_defaults_per_kind_and_config_errors():
    assert Distiller(teacher_net(), kind="kd").alpha == 0.5
    assert Distiller(teacher_net(), kind="ssld").alpha == 1.0  # PaddleClas' SSLD uses no labels
    assert Distiller.from_config(teacher_net(), DistillConfig(kind="kd", alpha=0.2, temperature=4.0)).alpha == 0.2
    with pytest.raises(ConfigError, match=r"distill\.kind"):
        Distiller(teacher_net(), kind="dml")
    with pytest.raises(ConfigError, match=r"distill\.alpha"):
        Distiller(teacher_net(), alpha=1.5)
    with pytest.raises(ConfigError, match=r"distill\.temperature"):
        Distiller(teacher_net(), kind="ssld", temperature=2.0)
    with pytest.raises(ConfigError, match=r"distill\.temperature"):
        Distiller(teacher_net(), temperature=0.0)


def test_teacher_runs_in_eval_mode_without_gradients():
    teacher = teacher_net()
    teacher.train()
    distiller = Distiller(teacher, kind="kd", alpha=1.0, temperature=2.0)
    assert not teacher.training and all(p.stop_gradient for p in teacher.parameters())
    images, labels = batches(1)[0]
    teacher.train()  # a stray .train() (e.g. on a container) must not leak dropout or BN updates
    first = distiller.teacher_logits(images).numpy()
    np.testing.assert_array_equal(distiller.teacher_logits(images).numpy(), first)  # no dropout draws
    assert not teacher.training
    bn = teacher[1]
    running_mean = bn._mean.numpy().copy()
    student = student_net()
    loss = distiller(student(images), images, labels)
    loss.backward()
    assert student.weight.grad is not None and float(student.weight.grad.abs().sum()) > 0
    assert all(p.grad is None for p in teacher.parameters())
    np.testing.assert_array_equal(bn._mean.numpy(), running_mean)


def test_teacher_runs_under_the_given_autocast():
    entered = []

    class SpyPrecision(Precision):
        @contextmanager
        def autocast(self, training: bool = True):
            entered.append(training)
            self.inside = True
            yield
            self.inside = False

    precision = SpyPrecision()
    seen = []

    class Recorder(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.fc = paddle.nn.Linear(8, 3)

        def forward(self, x):
            seen.append(getattr(precision, "inside", False))
            return self.fc(x)

    distiller = Distiller(Recorder(), kind="ssld", precision=precision)
    images, _ = batches(1)[0]
    distiller(student_net()(images), images)
    assert seen == [True] and entered == [True]


def make_trainer(teacher, max_steps, max_epochs=1):
    student = student_net()
    optimizer = paddle.optimizer.Momentum(learning_rate=0.1, momentum=0.9, parameters=student.parameters())
    distiller = Distiller(teacher, kind="kd", alpha=0.7, temperature=2.0)
    return Trainer(student, optimizer, limits=Limits(max_epochs=max_epochs, max_steps=max_steps), distiller=distiller,
                   handle_signals=False)


class Points:
    """48 labelled 8-d points, as a map-style dataset."""

    def __init__(self):
        rng = np.random.default_rng(5)
        self.x = rng.standard_normal((48, 8)).astype("float32")
        self.y = rng.integers(0, 3, 48)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index], int(self.y[index])


def resumable_loader():
    dataset = Points()
    return CheckedDataLoader(SeededDataset(dataset, seed=3), ResumableBatchSampler(dataset, 8, shuffle=True, seed=3))


def test_trainer_learns_from_the_teacher_and_checkpoints_hold_the_student_only(tmp_path):
    teacher = teacher_net()
    teacher_state = {k: v.numpy().copy() for k, v in teacher.state_dict().items()}
    data = batches(30, seed=3)
    trainer = make_trainer(teacher, max_steps=None)
    images = paddle.concat([x for x, _ in data])
    gap_before = value(kd_loss(trainer.model(images), teacher(images), 2.0))
    trainer.fit(data)
    assert value(kd_loss(trainer.model(images), teacher(images), 2.0)) < 0.5 * gap_before
    for key, array in teacher.state_dict().items():  # weights and BN statistics untouched
        np.testing.assert_array_equal(array.numpy(), teacher_state[key], err_msg=key)
    state = trainer.state_dict()
    assert set(state["model"]) == set(trainer.module.state_dict()) == {"weight", "bias"}
    saved = save_checkpoint(tmp_path / "ckpt", state)
    assert saved.is_dir()


def test_resuming_a_distillation_run_is_exact(tmp_path):
    teacher = teacher_net()
    with paddle.utils.unique_name.guard():
        straight = make_trainer(teacher, max_steps=None, max_epochs=2)
        straight.fit(resumable_loader())
    assert straight.global_step == 12
    with paddle.utils.unique_name.guard():
        first = make_trainer(teacher, max_steps=4, max_epochs=2)
        first.fit(resumable_loader())
        directory = save_checkpoint(tmp_path / "step4", first.state_dict())
    with paddle.utils.unique_name.guard():
        resumed = make_trainer(teacher, max_steps=None, max_epochs=2)
        resumed.fit(resumable_loader(), ckpt_path=directory)
    assert resumed.global_step == 12
    for a, b in zip(straight.module.parameters(), resumed.module.parameters(), strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("overrides, line", [
    (["trainer.distill.teacher=resnet20"], "missing required value for trainer.distill.pretrained"),
    (["trainer.distill.pretrained=/w.pdparams"], "trainer.distill.pretrained is set but trainer.distill.teacher is "
                                                 "null"),
    (["trainer.distill.teacher=resnet2O", "trainer.distill.pretrained=/w"],
     "unknown model trainer.distill.teacher='resnet2O'"),
    (["trainer.distill.teacher=resnet20", "trainer.distill.pretrained=/w", "trainer.distill.kind=ssld",
      "trainer.distill.temperature=4"], "trainer.distill.temperature=4.0 applies to trainer.distill.kind=kd"),
    (["trainer.distill.teacher=resnet20", "trainer.distill.pretrained=/w", "trainer.distill.unlabeled_root=/u"],
     "trainer.distill.unlabeled_root needs a loss without labels: trainer.distill.alpha=1 (got 0.5)"),
    (["trainer.distill.teacher=resnet20", "trainer.distill.pretrained=/w", "trainer.distill.kind=ssld",
      "trainer.distill.unlabeled_root=/u", "data.mixup.mixup_alpha=0.2"],
     "trainer.distill.unlabeled_root cannot be combined with data.mixup"),
    (["trainer.distill.kind=dml"], "trainer.distill.kind='dml' is not allowed; choose one of: kd, ssld"),
])
def test_distill_config_rules_are_one_line_naming_the_key(overrides, line):
    with pytest.raises(ConfigError) as info:
        validate_config(compose_fit([*TINY, *overrides]))
    assert str(info.value).startswith(line) and "\n" not in str(info.value)
