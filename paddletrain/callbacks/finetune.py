"""Fine-tuning callbacks: train only the head for the first epochs, and keep BatchNorm statistics fixed.

Both are stateless across resume: what they do depends only on the trainer's epoch, so a resumed run
freezes (or not) exactly as the original did.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import paddle
from paddle import nn

from paddletrain.engine.callback import Callback
from paddletrain.registry import CALLBACKS

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.engine.trainer import Trainer

__all__ = ["BackboneFreeze", "FreezeBatchNorm", "head_parameters"]

log = logging.getLogger("paddletrain")

_BATCH_NORMS = (nn.BatchNorm, nn.BatchNorm1D, nn.BatchNorm2D, nn.BatchNorm3D, nn.SyncBatchNorm)


def head_parameters(model: nn.Layer) -> list[paddle.Tensor]:
    """The classifier head's parameters: ``model.get_classifier()``'s, else those of a child named ``fc``.

    Raises:
        ValueError: the model has neither.
    """
    if hasattr(model, "get_classifier"):
        return list(model.get_classifier().parameters())
    head = getattr(model, "fc", None)
    if isinstance(head, nn.Layer):
        return list(head.parameters())
    raise ValueError(f"{type(model).__name__} has no get_classifier() and no `fc` child: cannot tell its head "
                     f"from its backbone")


@CALLBACKS.register("backbone_freeze")
class BackboneFreeze(Callback):
    """Train only the classifier head for the first ``epochs`` epochs, then the whole model.

    Freezing sets ``stop_gradient`` on the backbone's parameters, so no gradient is computed for them and the
    optimizer (built over every parameter) skips them; unfreezing clears it again and the optimizer updates
    them from then on. Parameters that were already frozen before fit stay frozen. The learning-rate
    schedule is not touched: combine with ``optim.head_lr_mult`` / ``optim.layer_decay`` for gentler
    backbone updates.

    Args:
        epochs: epochs with a frozen backbone (0 disables the callback).
    """

    option_rules = {"epochs": dict(ge=0)}

    def __init__(self, epochs: int) -> None:
        self.check_options({"epochs": epochs})
        self.epochs = epochs
        self._frozen: list[paddle.Tensor] = []

    def on_train_epoch_start(self, trainer: Trainer) -> None:
        if trainer.epoch < self.epochs and not self._frozen:
            self._freeze(trainer.module)
            log.info("Backbone frozen for epochs 0-%d: training the classifier head only", self.epochs - 1)
        elif trainer.epoch >= self.epochs and self._frozen:
            self._unfreeze()
            log.info("Epoch %d: backbone unfrozen, training the whole model", trainer.epoch)

    def on_fit_end(self, trainer: Trainer) -> None:
        self._unfreeze()  # leave the model as it was given, whatever epoch training stopped at

    def on_exception(self, trainer: Trainer, exception: BaseException) -> None:
        self._unfreeze()

    @property
    def frozen(self) -> bool:
        """Whether the backbone is frozen now."""
        return bool(self._frozen)

    def _freeze(self, model: nn.Layer) -> None:
        head = {id(p) for p in head_parameters(model)}
        self._frozen = [p for p in model.parameters() if id(p) not in head and not p.stop_gradient]
        for param in self._frozen:
            param.stop_gradient = True

    def _unfreeze(self) -> None:
        for param in self._frozen:
            param.stop_gradient = False
        self._frozen = []


@CALLBACKS.register("freeze_bn")
class FreezeBatchNorm(Callback):
    """Keep every BatchNorm in eval mode during training: running statistics stay those of the weights.

    Useful when fine-tuning with small batches, whose statistics are noisy estimates of the pretrained ones.
    The norms' scale and shift still train (freeze them with :class:`BackboneFreeze` or ``stop_gradient``).
    The trainer switches the model to train mode at each epoch and after validation, so the norms are put
    back into eval mode before every training batch.
    """

    def __init__(self) -> None:
        self._norms: list[nn.Layer] | None = None

    def on_fit_start(self, trainer: Trainer) -> None:
        self._norms = [layer for layer in trainer.module.sublayers() if isinstance(layer, _BATCH_NORMS)]
        if not self._norms:
            log.warning("FreezeBatchNorm: %s has no BatchNorm layers; nothing to freeze", type(trainer.module).__name__)

    def on_train_batch_start(self, trainer: Trainer, batch: Any, batch_idx: int) -> None:
        for norm in self._norms or ():
            if norm.training:
                norm.eval()
