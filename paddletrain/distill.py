"""Knowledge distillation: the losses and a :class:`Distiller` that runs a frozen teacher next to the student.

Two ways to learn from a teacher's logits:

* ``kd`` (Hinton, Vinyals & Dean 2015, "Distilling the Knowledge in a Neural Network"):
  ``T^2 * KL(softmax(teacher / T) || softmax(student / T))``, summed over classes and averaged over the batch.
  The ``T^2`` keeps the gradient's scale independent of the temperature.
* ``ssld``: PaddleClas' SSLD ("Simple Semi-supervised Label Distillation", the recipe behind
  ``ResNet50_vd_ssld``). Its loss needs no labels, so unlabeled images can join the training set. PaddleClas
  calls it "JS divergence", but what its code computes (``JSDivLoss`` in the 2020 ``ppcls/modeling/loss.py``
  that trained the SSLD models, ``DMLLoss`` in PaddleClas 2.x) is the symmetrised KL divergence
  ``(KL(p_t || p_s) + KL(p_s || p_t)) / 2`` of the softmax outputs at temperature 1, summed over classes and
  averaged over the batch; no hard-label term. This module implements that quantity.

Either is combined with the hard-label loss as ``alpha * distill + (1 - alpha) * hard_loss``; ``alpha = 1``
needs no labels.

Trainer integration: ``Trainer(..., distiller=Distiller(...))`` (built from ``trainer.distill`` by
:func:`build_distiller`). The teacher is not a sublayer of the student, so
``Trainer.state_dict()`` and every checkpoint hold the student only, and the optimizer never sees the
teacher's parameters. The training step computes the student's logits as usual and asks the distiller for the
loss (:meth:`Distiller.training_step` is the same step for a Trainer subclass of your own)::

    with self.precision.autocast(training=True):
        logits = self.model(images)
        loss = self.distiller.loss(logits, images, labels)

Validation keeps ``Trainer.loss_fn`` (the hard-label loss). The teacher runs in eval mode, consumes no random
numbers, and runs on every rank on that rank's batch, so exact resume and data parallelism are unaffected.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import paddle
import paddle.nn.functional as F
from omegaconf import OmegaConf

from paddletrain.config import DISTILL_KINDS, DistillConfig
from paddletrain.errors import ConfigError
from paddletrain.losses import cross_entropy
from paddletrain.models import create_model
from paddletrain.registry import MODELS

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.engine.precision import Precision

log = logging.getLogger("paddletrain")

KINDS = DISTILL_KINDS


# ---------------------------------------------------------------------------------------------- losses
def kd_loss(student_logits: paddle.Tensor, teacher_logits: paddle.Tensor, temperature: float = 1.0) -> paddle.Tensor:
    """``T^2 * KL(softmax(teacher / T) || softmax(student / T))``, summed over classes, mean over the batch."""
    if not temperature > 0:
        raise ValueError(f"the distillation temperature must be > 0, got {temperature!r}")
    log_p_student = F.log_softmax(student_logits.astype("float32") / temperature, axis=-1)
    log_p_teacher = F.log_softmax(teacher_logits.astype("float32") / temperature, axis=-1)
    kl = (log_p_teacher.exp() * (log_p_teacher - log_p_student)).sum(axis=-1).mean()
    return kl * (temperature * temperature)


def ssld_loss(student_logits: paddle.Tensor, teacher_logits: paddle.Tensor) -> paddle.Tensor:
    """PaddleClas' SSLD loss: ``(KL(p_t || p_s) + KL(p_s || p_t)) / 2`` of the softmax outputs, batch mean.

    The two KL terms add up to ``sum((p_t - p_s) * (log p_t - log p_s))``, computed that way in one pass.
    """
    log_p_student = F.log_softmax(student_logits.astype("float32"), axis=-1)
    log_p_teacher = F.log_softmax(teacher_logits.astype("float32"), axis=-1)
    symmetric = (log_p_teacher.exp() - log_p_student.exp()) * (log_p_teacher - log_p_student)
    return 0.5 * symmetric.sum(axis=-1).mean()


def resolve_alpha(kind: str, alpha: float | None) -> float:
    """The distillation weight: ``alpha`` checked to lie in [0, 1], or the kind's default."""
    if kind not in KINDS:
        raise ConfigError(f"distill.kind must be one of {list(KINDS)}, got {kind!r}")
    if alpha is None:
        return 1.0 if kind == "ssld" else 0.5
    if not 0.0 <= alpha <= 1.0:
        raise ConfigError(f"distill.alpha must be in [0, 1], got {alpha!r}")
    return float(alpha)


def check_distill_config(d: Any, sampler: str | None = None, mixing: bool = False) -> None:
    """The ``trainer.distill.*`` rules: a teacher named in the model registry with trained weights, an ``alpha``
    and ``temperature`` that suit the kind, and unlabeled images only with a loss that needs no labels, neither a
    class-balanced ``sampler`` (``data.sampler``) nor Mixup/CutMix (``mixing``: ``data.mixup`` is on) beside them:
    those need every image's class."""
    if not d.teacher:
        if d.unlabeled_root or d.pretrained:
            set_key = "unlabeled_root" if d.unlabeled_root else "pretrained"
            raise ConfigError(f"trainer.distill.{set_key} is set but trainer.distill.teacher is null: name the "
                              "teacher model (e.g. trainer.distill.teacher=resnet50_vd)")
        return
    try:
        MODELS.get(d.teacher)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("model.name=", "trainer.distill.teacher=", 1)) from None
    if not d.pretrained:
        raise ConfigError(f"missing required value for trainer.distill.pretrained: the teacher "
                          f"{d.teacher} needs trained weights (a file, a paddletrain checkpoint directory, "
                          "vision:<arch>, paddleclas:<Name>, ...)")
    try:
        alpha = resolve_alpha(d.kind, d.alpha)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("distill.", "trainer.distill.", 1)) from None
    if d.kind == "ssld" and d.temperature != 1.0:
        raise ConfigError(f"trainer.distill.temperature={d.temperature} applies to trainer.distill.kind=kd; "
                          "ssld works at temperature 1")
    if d.unlabeled_root and alpha != 1.0:
        raise ConfigError(f"trainer.distill.unlabeled_root needs a loss without labels: trainer.distill.alpha=1 "
                          f"(got {alpha}); the unlabeled images have no hard-label term")
    if d.unlabeled_root and sampler == "class_balanced":
        raise ConfigError("data.sampler=class_balanced weighs each image by its class, but the images of "
                          "trainer.distill.unlabeled_root have none: set data.sampler=random")
    if d.unlabeled_root and mixing:
        raise ConfigError("trainer.distill.unlabeled_root cannot be combined with data.mixup: mixed targets need "
                          "every image's label; set data.mixup.mixup_alpha=0 and data.mixup.cutmix_alpha=0")


def build_distiller(d: Any, num_classes: int, in_chans: int, precision: Precision,
                    hard_loss: Callable[[paddle.Tensor, paddle.Tensor], paddle.Tensor]) -> Distiller | None:
    """The frozen teacher of ``trainer.distill`` (the node ``d``) and its loss; None when ``teacher`` is null.

    The teacher is built like the student (registry name + weight source) with the student's ``num_classes`` and
    ``in_chans``; its hard-label term is ``hard_loss`` (the run's loss).
    """
    if d is None or not d.teacher:
        return None
    options = OmegaConf.to_container(d.teacher_options, resolve=True) if d.teacher_options else {}
    teacher = create_model(d.teacher, num_classes=num_classes, in_chans=in_chans, pretrained=d.pretrained,
                           strict=True, trust_pickle=d.trust_pickle, **options)
    if precision.amp_active and precision.level == "O2":  # O2 autocast expects low-precision weights
        teacher = paddle.amp.decorate(models=teacher, level="O2", dtype=precision.dtype)
    log.info("Distilling from the teacher %s (%s), kind=%s", d.teacher, d.pretrained, d.kind)
    return Distiller(teacher, kind=d.kind, alpha=d.alpha, temperature=d.temperature, hard_loss=hard_loss,
                     precision=precision)


def distillation_loss(
    student_logits: paddle.Tensor,
    teacher_logits: paddle.Tensor,
    targets: paddle.Tensor | None,
    *,
    kind: str = "kd",
    alpha: float = 0.5,
    temperature: float = 1.0,
    hard_loss: Callable[[paddle.Tensor, paddle.Tensor], paddle.Tensor] = cross_entropy,
) -> paddle.Tensor:
    """``alpha * distill + (1 - alpha) * hard_loss(student_logits, targets)``; ``targets`` may be None when
    ``alpha == 1``. ``distill`` is :func:`kd_loss` at ``temperature`` or :func:`ssld_loss`."""
    if kind == "kd":
        soft = kd_loss(student_logits, teacher_logits, temperature)
    elif kind == "ssld":
        soft = ssld_loss(student_logits, teacher_logits)
    else:
        raise ConfigError(f"distill.kind must be one of {list(KINDS)}, got {kind!r}")
    if alpha == 1.0:
        return soft
    if targets is None:
        raise ValueError(f"distillation with alpha={alpha} mixes in the hard-label loss and needs labels; "
                         "set distill.alpha=1 to train on unlabeled images")
    return alpha * soft + (1.0 - alpha) * hard_loss(student_logits, targets)


# ---------------------------------------------------------------------------------------------- distiller
class Distiller:
    """A frozen teacher and the loss that distils it into the student.

    Args:
        teacher: a trained classifier with the student's classes (built like any model, e.g.
            ``create_model(name, num_classes=..., pretrained=source)``). It is put in eval mode and its
            parameters stop gradients; it is never part of the student's state.
        kind, alpha, temperature: see :class:`~paddletrain.config.DistillConfig` and :func:`distillation_loss`.
        hard_loss: the hard-label loss (``loss_fn(logits, targets)``), e.g. from
            :func:`paddletrain.losses.build_loss`; default cross-entropy.
        precision: the student's :class:`~paddletrain.engine.precision.Precision`; the teacher runs under the same
            autocast. Default float32.
    """

    def __init__(
        self,
        teacher: paddle.nn.Layer,
        *,
        kind: str = "kd",
        alpha: float | None = None,
        temperature: float = 1.0,
        hard_loss: Callable[[paddle.Tensor, paddle.Tensor], paddle.Tensor] | None = None,
        precision: Precision | None = None,
    ) -> None:
        self.alpha = resolve_alpha(kind, alpha)
        if not temperature > 0:
            raise ConfigError(f"distill.temperature must be > 0, got {temperature!r}")
        if kind == "ssld" and temperature != 1.0:
            raise ConfigError(f"distill.temperature={temperature} applies to distill.kind=kd; ssld works at 1")
        self.kind = kind
        self.temperature = float(temperature)
        self.hard_loss = hard_loss or cross_entropy
        self.precision = precision
        self.teacher = teacher
        teacher.eval()
        for param in teacher.parameters():
            param.stop_gradient = True

    @classmethod
    def from_config(cls, teacher: paddle.nn.Layer, cfg: DistillConfig, **kwargs: Any) -> Distiller:
        """A distiller configured by a :class:`DistillConfig` (``hard_loss``/``precision`` as keywords)."""
        return cls(teacher, kind=cfg.kind, alpha=cfg.alpha, temperature=cfg.temperature, **kwargs)

    def teacher_logits(self, images: paddle.Tensor, precision: Precision | None = None) -> paddle.Tensor:
        """The teacher's float32 logits for ``images``: eval mode, no graph, under the given (or own) autocast."""
        if self.teacher.training:  # a stray .train() on the teacher would update its BatchNorm statistics
            self.teacher.eval()
        precision = precision or self.precision
        with paddle.no_grad():
            if precision is None:
                logits = self.teacher(images)
            else:
                with precision.autocast(training=True):
                    logits = self.teacher(images)
        return logits.astype("float32").detach()

    def loss(self, student_logits: paddle.Tensor, images: paddle.Tensor, targets: paddle.Tensor | None = None,
             precision: Precision | None = None) -> paddle.Tensor:
        """The combined loss of the student's logits on ``images`` (``targets`` may be None when alpha is 1)."""
        return distillation_loss(student_logits, self.teacher_logits(images, precision), targets,
                                 kind=self.kind, alpha=self.alpha, temperature=self.temperature,
                                 hard_loss=self.hard_loss)

    __call__ = loss

    def training_step(self, trainer: Any, batch: Any, batch_idx: int) -> tuple[paddle.Tensor, paddle.Tensor, Any]:
        """``Trainer.training_step`` with the distillation loss: ``(loss, student_logits, labels)``."""
        images, labels = batch[0], batch[1]
        with trainer.precision.autocast(training=True):
            logits = trainer.model(images)
        loss = self.loss(logits, images, labels, precision=trainer.precision)
        return loss, logits, labels
