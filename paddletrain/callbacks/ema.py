"""ModelEMA: an exponential moving average of the weights, validated with and saved in every checkpoint."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import paddle

from paddletrain.checkpoint.untrusted import StateValueError, checked_int, checked_mapping, show
from paddletrain.engine.callback import Callback, StepOutput
from paddletrain.registry import CALLBACKS

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.engine.trainer import Trainer


@CALLBACKS.register("ema")
class ModelEMA(Callback):
    """Keep ``ema = decay * ema + (1 - decay) * weights`` after every optimizer step (like timm's ModelEmaV2).

    The average covers every floating-point entry of the state dict, BatchNorm statistics included. With
    ``validate_with_ema`` the model is evaluated with the averaged weights (the training weights are put
    back afterwards), so ``val/*`` metrics and the best checkpoint follow the EMA. Its state (the averaged
    weights and the count of updates) is part of every checkpoint, so a resumed run continues the same average.

    ``warmup=True`` uses ``min(decay, (1 + n) / (10 + n))`` at the n-th update (timm's ``ModelEmaV3`` warm-up, as
    airbench does its own), so a short run's average is not dominated by its random initial weights.
    """

    option_rules = {"decay": dict(gt=0, lt=1)}

    def __init__(self, decay: float = 0.9999, validate_with_ema: bool = True, warmup: bool = False) -> None:
        self.check_options({"decay": decay})
        self.decay = decay
        self.validate_with_ema = validate_with_ema
        self.warmup = warmup
        self.updates = 0
        self.shadow: dict[str, paddle.Tensor] | None = None
        self._backup: dict[str, paddle.Tensor] | None = None

    def current_decay(self) -> float:
        """The decay of the next update."""
        return min(self.decay, (1 + self.updates) / (10 + self.updates)) if self.warmup else self.decay

    def _floating(self, model: paddle.nn.Layer) -> dict[str, paddle.Tensor]:
        return {k: v for k, v in model.state_dict().items() if v.dtype in (paddle.float32, paddle.float64,
                                                                            paddle.float16, paddle.bfloat16)}

    def on_fit_start(self, trainer: Trainer) -> None:
        if self.shadow is None:
            self.shadow = {k: v.detach().astype("float32").clone() for k, v in self._floating(trainer.module).items()}

    @paddle.no_grad()
    def on_train_batch_end(self, trainer: Trainer, output: StepOutput, batch: Any, batch_idx: int) -> None:
        if not output.stepped or self.shadow is None:
            return
        decay = self.current_decay()
        for key, value in self._floating(trainer.module).items():
            average = self.shadow[key]
            average.set_value(average * decay + value.astype("float32") * (1.0 - decay))
        self.updates += 1

    def on_validation_start(self, trainer: Trainer) -> None:
        if self.validate_with_ema and self.shadow is not None:
            self._backup = {k: v.clone() for k, v in self._floating(trainer.module).items()}
            trainer.module.set_state_dict(self.shadow)

    def on_validation_end(self, trainer: Trainer, metrics: dict[str, float]) -> None:
        if self._backup is not None:
            trainer.module.set_state_dict(self._backup)
            self._backup = None

    def on_exception(self, trainer: Trainer, exception: BaseException) -> None:
        self.on_validation_end(trainer, {})  # never leave the EMA weights in place of the trained ones

    def state_dict(self) -> dict[str, Any]:
        # validate_with_ema tells a reader of the checkpoint which weights its run validated (averaged_weights).
        return {"decay": self.decay, "shadow": self.shadow, "validate_with_ema": self.validate_with_ema,
                "updates": self.updates}

    def on_load_checkpoint(self, trainer: Trainer, checkpoint: dict[str, Any]) -> None:
        # The averaged weights must fit the model they will be validated in (checked before anything loads).
        saved = (checkpoint.get("callbacks") or {}).get(self.state_key) if isinstance(checkpoint, dict) else None
        shadow = saved.get("shadow") if isinstance(saved, dict) else None
        if shadow is None:
            return
        key = f"callbacks.{self.state_key}.shadow"
        expected = self._floating(trainer.module)
        for name, value in checked_mapping(shadow, key).items():
            shape = list(getattr(value, "shape", ()))
            if name not in expected or not hasattr(value, "dtype") or shape != list(expected[name].shape):
                wanted = list(expected[name].shape) if name in expected else "no such weight"
                raise StateValueError(f"{key}.{name}", f"is {show(value)} of shape {shape}: the model has {wanted}")

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.updates = checked_int(state.get("updates", 0), f"callbacks.{self.state_key}.updates")
        shadow = state.get("shadow")
        if shadow is not None:
            self.shadow = {k: paddle.to_tensor(v.numpy() if hasattr(v, "numpy") else v, dtype="float32")
                           for k, v in shadow.items()}


def averaged_weights(state: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """The averaged weights a checkpoint's ``state`` was validated with, and what they are (``{"average": "ema",
    "decay": ...}``); None when its run validated with the trained weights (no EMA, or ``validate_with_ema=False``).

    The best checkpoint of such a run was chosen on these weights, so ``evaluate``, ``export``, ``predict`` and
    ``ship`` use them unless told ``weights=raw``. (Checkpoints written before the flag was saved validated with
    the average whenever they hold one: the option's default.)
    """
    callbacks = state.get("callbacks") if isinstance(state, dict) else None
    saved = callbacks.get(ModelEMA.__name__) if isinstance(callbacks, dict) else None
    if not isinstance(saved, dict) or saved.get("shadow") is None or not saved.get("validate_with_ema", True):
        return None
    return checked_mapping(saved["shadow"], f"callbacks.{ModelEMA.__name__}.shadow"), {
        "average": "ema", "decay": saved.get("decay")}
