"""Float32 and automatic mixed precision (AMP) behind one small interface.

The Trainer only ever calls::

    model, optimizer = precision.setup(model, optimizer)   # O2: float16/bfloat16 weights + float32 masters
    with precision.autocast():                             # auto_cast, or nothing for float32
        loss = criterion(model(x), y)
    precision.backward(loss)                               # scaled backward under float16
    result = precision.step(optimizer, model.parameters(), clip_norm)

``step`` follows Lightning's documented order: unscale -> clip (on the unscaled gradients, with
``paddle.nn.utils.clip_grad_norm_``) -> finiteness check of the global gradient norm -> optimizer step, or skip
it -> scaler update -> clear gradients. The finiteness check is the trainer's own guard and runs on every
device, including CPU, where Paddle's GradScaler and auto_cast do nothing and a single inf loss would otherwise
corrupt the weights.

Two private parts of Paddle's GradScaler remain, because no public API does their job (each has a test in
tests/test_engine_precision.py that fails when Paddle changes it): :meth:`GradScaler._update` (a NumPy 2.4 crash) and,
in :meth:`Precision.step`, ``scaler._scale`` (read with the norm in the step's one host copy) and
``scaler._found_inf`` (set when our check found what the scaler's own did not).
"""
from __future__ import annotations

import logging
import math
import warnings
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import paddle

from paddletrain.config import AmpConfig, check_field
from paddletrain.engine.state_checks import checked_scaler_state
from paddletrain.errors import ConfigError

log = logging.getLogger(__name__)

class ScalerLike(Protocol):
    """The part of ``paddle.amp.GradScaler``'s API that :class:`Precision` relies on."""

    _found_inf: Any
    _scale: Any

    def scale(self, var: paddle.Tensor) -> paddle.Tensor: ...

    def unscale_(self, optimizer: Any) -> None: ...

    def step(self, optimizer: Any) -> None: ...

    def update(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class GradScaler(paddle.amp.GradScaler):
    """``paddle.amp.GradScaler`` whose loss-scale back-off does not crash under NumPy >= 2.4.

    When Paddle 3.3's ``_update`` lowers the scale it prints ``float(self._scale)``; the scale is a shape-[1]
    tensor and NumPy 2.4 refuses to turn a 1-element array into a float (TypeError), so the first overflow of a
    float16 run would crash it. No public method reaches that line, hence this one override: Paddle's own update
    runs on a 0-d reshape of the scale, which converts. When Paddle fixes it,
    ``test_upstream_grad_scaler_backoff_still_crashes_under_numpy_2_4`` fails: then delete this class.
    """

    def _update(self) -> None:
        if not isinstance(self._scale, paddle.Tensor):  # disabled: Paddle's update does nothing
            return super()._update()
        self._scale = self._scale.reshape([])
        try:
            super()._update()
        finally:
            # Paddle's unscale kernel and state_dict expect shape [1].
            self._scale = self._scale.reshape([1])


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step did, as host values."""

    # Whether the optimizer updated the weights (False when a gradient was non-finite).
    stepped: bool
    found_inf: bool
    # Global L2 norm of the unscaled gradients before clipping (None when no parameter had a gradient).
    grad_norm: float | None
    # The loss scale this step's loss was multiplied by (None without a scaler).
    loss_scale: float | None


class Precision:
    """float32 or AMP (O1/O2, float16/bfloat16) training, with an optional dynamic loss scaler.

    Args:
        enabled: train under AMP; False means plain float32.
        level: ``"O1"`` (autocast white-listed ops) or ``"O2"`` (low-precision weights, float32 masters).
        dtype: ``"float16"`` or ``"bfloat16"``.
        scaler: ``"auto"`` builds a :class:`GradScaler` for float16 on an accelerator; ``True`` asks for one
            explicitly; ``None``/``False`` for none; or any object with GradScaler's API (tests inject
            :class:`paddletrain.testing.FakeGradScaler`). Only float16 uses a scaler.
        init_loss_scaling ... use_dynamic_loss_scaling: passed to ``paddle.amp.GradScaler``.
        eval_in_amp: evaluate under autocast too (O2 always does: its weights are low precision).
        device: ``"cpu"``, ``"gpu:0"``, ...; None reads ``paddle.device.get_device()``. On CPU AMP is inert.
    """

    def __init__(
        self,
        enabled: bool = False,
        level: str = "O1",
        dtype: str = "float16",
        scaler: ScalerLike | bool | str | None = "auto",
        init_loss_scaling: float = 65536.0,
        incr_ratio: float = 2.0,
        decr_ratio: float = 0.5,
        incr_every_n_steps: int = 2000,
        decr_every_n_nan_or_inf: int = 1,
        use_dynamic_loss_scaling: bool = True,
        eval_in_amp: bool = False,
        device: str | None = None,
    ) -> None:
        # The schema's declarations (their one home); the entry point validated a config already.
        check_field(AmpConfig, "level", level, context="trainer.amp.")
        check_field(AmpConfig, "dtype", dtype, context="trainer.amp.")
        self.enabled = bool(enabled)
        self.level = level
        self.dtype = dtype
        self.eval_in_amp = bool(eval_in_amp)
        self.device = device or paddle.device.get_device()
        on_cpu = self.device.split(":")[0] == "cpu"
        # AMP kernels only exist on accelerators: on CPU auto_cast and GradScaler silently do nothing.
        self.amp_active = self.enabled and not on_cpu
        scaler_kwargs = dict(
            init_loss_scaling=init_loss_scaling,
            incr_ratio=incr_ratio,
            decr_ratio=decr_ratio,
            incr_every_n_steps=incr_every_n_steps,
            decr_every_n_nan_or_inf=decr_every_n_nan_or_inf,
            use_dynamic_loss_scaling=use_dynamic_loss_scaling,
        )
        if self.enabled and dtype == "float16":
            _check_scaler_settings(**scaler_kwargs)
        self.scaler: ScalerLike | None = self._resolve_scaler(scaler, on_cpu, scaler_kwargs)
        self._is_setup = False
        if self.enabled and on_cpu:
            injected = " (the injected loss scaler is still used)" if self.scaler is not None else ""
            log.info(
                "AMP (trainer.amp.enabled=true) is inert on CPU: training runs in float32%s.", injected
            )

    @classmethod
    def from_config(cls, amp_cfg: AmpConfig, device: str) -> Precision:
        """Build from ``trainer.amp``; ``use_scaler`` None means a scaler exactly when the dtype is float16."""
        use_scaler = amp_cfg.use_scaler
        scaler: bool | str = "auto" if use_scaler is None else bool(use_scaler)
        return cls(
            enabled=amp_cfg.enabled,
            level=amp_cfg.level,
            dtype=amp_cfg.dtype,
            scaler=scaler,
            init_loss_scaling=amp_cfg.init_loss_scaling,
            incr_ratio=amp_cfg.incr_ratio,
            decr_ratio=amp_cfg.decr_ratio,
            incr_every_n_steps=amp_cfg.incr_every_n_steps,
            decr_every_n_nan_or_inf=amp_cfg.decr_every_n_nan_or_inf,
            use_dynamic_loss_scaling=amp_cfg.use_dynamic_loss_scaling,
            eval_in_amp=amp_cfg.eval_in_amp,
            device=device,
        )

    def _resolve_scaler(
        self, scaler: ScalerLike | bool | str | None, on_cpu: bool, kwargs: dict[str, Any]
    ) -> ScalerLike | None:
        if isinstance(scaler, str) and scaler != "auto":
            raise ConfigError(f"scaler must be 'auto', True, False, None or a GradScaler-like object, got {scaler!r}")
        wants_scaler = scaler is True or not isinstance(scaler, (str, bool, type(None)))
        if not self.enabled:
            if wants_scaler and scaler is not True:
                raise ConfigError("a loss scaler was given but AMP is off: set trainer.amp.enabled=true")
            return None
        if self.dtype == "bfloat16":
            if wants_scaler:
                raise ConfigError(
                    "bfloat16 has float32's exponent range and needs no loss scaling: "
                    "set trainer.amp.use_scaler to false or null"
                )
            return None
        if scaler is None or scaler is False:
            warnings.warn(
                "float16 AMP without a loss scaler (trainer.amp.use_scaler=false): small gradients may "
                "underflow to zero; prefer use_scaler=null or bfloat16",
                stacklevel=3,
            )
            return None
        if scaler == "auto" or scaler is True:
            # Paddle's GradScaler is disabled on CPU (it warns and passes through), so build none there.
            return None if on_cpu else GradScaler(enable=True, **kwargs)
        if hasattr(scaler, "is_enable") and not scaler.is_enable():
            # A disabled GradScaler steps even on inf gradients; the plain float32 path skips them instead.
            warnings.warn("the given GradScaler is disabled; running without loss scaling", stacklevel=3)
            return None
        return scaler

    # ------------------------------------------------------------------ training hooks
    def setup(self, model: paddle.nn.Layer, optimizer: Any) -> tuple[paddle.nn.Layer, Any]:
        """Cast for O2 (float32 master weights, float32 state_dict); O1 and float32 return them unchanged.

        Call before wrapping the model in ``paddle.DataParallel``. Idempotent: a second call (e.g. by the
        Trainer after ``fit.py`` already set up and wrapped the model) changes nothing.
        """
        if self._is_setup:
            return model, optimizer
        self._is_setup = True
        if self.amp_active and self.level == "O2":
            decorated = paddle.amp.decorate(
                models=model,
                optimizers=optimizer,
                level="O2",
                dtype=self.dtype,
                master_weight=True,
                save_dtype="float32",
            )
            # Without an optimizer (evaluation only) Paddle returns the model alone.
            model, optimizer = decorated if optimizer is not None else (decorated, None)
        return model, optimizer

    def autocast(self, training: bool = True) -> AbstractContextManager:
        """The context to run the forward pass in: ``paddle.amp.auto_cast`` under AMP, else a no-op.

        Evaluation runs in float32 unless ``eval_in_amp``; O2 always autocasts because its weights are low precision.
        """
        if not self.amp_active:
            return nullcontext()
        if not training and not self.eval_in_amp and self.level != "O2":
            return nullcontext()
        return paddle.amp.auto_cast(enable=True, level=self.level, dtype=self.dtype)

    def backward(self, loss: paddle.Tensor) -> None:
        """Backpropagate ``loss``, multiplied by the loss scale when a scaler is in use."""
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
        else:
            loss.backward()

    def step(self, optimizer: Any, parameters: Iterable[paddle.Tensor],
             clip_norm: float | None = None) -> StepResult:
        """Unscale, clip, check, step (or skip), update the scale and clear the gradients.

        A step is skipped when any gradient is non-finite (or the global gradient norm overflows float32), so
        the weights and the optimizer state stay exactly as they were. One host synchronisation per call.
        """
        scale_used = self.scaler._scale if self.scaler is not None else None
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        total_norm = clip_grad_norm_(parameters, clip_norm)
        grad_norm, scale_used = _to_host(total_norm, scale_used)
        found_inf = grad_norm is not None and not math.isfinite(grad_norm)

        if self.scaler is not None:
            if found_inf:
                # The scaler checked the gradients before clipping; a norm that overflows float32 (finite
                # gradients, then zeroed by the clip) is ours alone. GradScaler has no public way to be told.
                self.scaler._found_inf = True
            self.scaler.step(optimizer)
            self.scaler.update()
        elif not found_inf:
            optimizer.step()
        optimizer.clear_grad()
        return StepResult(
            stepped=not found_inf,
            found_inf=found_inf,
            grad_norm=grad_norm,
            loss_scale=scale_used,
        )

    # ------------------------------------------------------------------ state
    @property
    def loss_scale(self) -> float | None:
        """The current loss scale (after the last update), or None without a scaler."""
        if self.scaler is None:
            return None
        return float(np.asarray(self.scaler.state_dict()["scale"]).reshape(-1)[0])

    def state_dict(self) -> dict[str, Any]:
        """The scaler's state (scale and good/bad step counters) as plain Python values, or an empty dict."""
        if self.scaler is None:
            return {}
        return {"scaler": {k: _plain(v) for k, v in self.scaler.state_dict().items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the loss scale and counters saved by :meth:`state_dict`."""
        saved = state.get("scaler") if state else None
        if self.scaler is None:
            if saved:
                log.warning("The checkpoint holds loss-scaler state but this run uses no scaler: ignored.")
            return
        if not saved:
            log.info("The checkpoint holds no loss-scaler state: starting from the initial loss scale.")
            return
        saved = checked_scaler_state(saved)
        # paddle.amp.GradScaler reads the scale as state["scale"][0].
        saved["scale"] = np.asarray(saved["scale"], dtype=np.float32).reshape([1])
        self.scaler.load_state_dict(saved)


def _check_scaler_settings(**settings: Any) -> None:
    """Paddle only asserts these; name the offending key, by the schema's declaration (their one home)."""
    for key, value in settings.items():
        check_field(AmpConfig, key, value, context="trainer.amp.")


def clip_grad_norm_(parameters: Iterable[paddle.Tensor], max_norm: float | None) -> paddle.Tensor | None:
    """Global L2 norm of the gradients of ``parameters`` (as one vector), clipping them in place to ``max_norm``.

    Returns a 0-d float32 tensor left on the device (no host sync), or None when no parameter has a gradient.
    The norm is inf or nan exactly when some gradient is (or the norm overflows float32); the gradients are
    then garbage and the step must be skipped. ``max_norm=None`` only measures.
    """
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return None
    # Paddle multiplies every gradient by min(1, max_norm / norm): with an infinite max_norm that is exactly 1.0.
    limit = math.inf if max_norm is None else float(max_norm)
    if all(p.grad.dtype == paddle.float32 for p in params):
        # The public API, at a price on CPU: its p_norm kernel is ~100x slower there than the fused
        # squared_l2_norm used before, +55 ms a step on resnet18 (docs/precision.md has the figures).
        return paddle.nn.utils.clip_grad_norm_(params, limit)
    # O2 keeps norm layers in float32 and the rest in float16/bfloat16. Paddle's clip_grad_norm_ cannot stack
    # norms of different dtypes, computes a float16 norm in float16 (inf past 65504), and its in-place multiply
    # would turn a float16 gradient into float32; so norms are taken in float32 and the factor cast per dtype.
    with paddle.no_grad():
        norms = [paddle.linalg.vector_norm(p.grad.astype("float32")) for p in params]
        total = paddle.linalg.vector_norm(paddle.stack(norms))
        coef = paddle.clip(limit / (total + 1e-6), max=1.0)
        by_dtype = {paddle.float32: coef}
        for p in params:
            grad = p.grad
            if grad.dtype not in by_dtype:
                by_dtype[grad.dtype] = coef.astype(grad.dtype)
            grad.multiply_(by_dtype[grad.dtype])
    return total


def _to_host(norm: paddle.Tensor | None, scale: Any) -> tuple[float | None, float | None]:
    """Fetch the norm and the loss scale with a single device-to-host copy."""
    tensors = [t.astype("float32").reshape([1]) for t in (norm, scale) if isinstance(t, paddle.Tensor)]
    fetched = iter(paddle.concat(tensors).numpy().tolist()) if tensors else iter(())

    def value(x: Any) -> float | None:
        if x is None:
            return None
        return next(fetched) if isinstance(x, paddle.Tensor) else float(np.asarray(x).reshape(-1)[0])

    return value(norm), value(scale)


def _plain(value: Any) -> Any:
    """numpy/Tensor values to Python lists/scalars, so any checkpoint format can store them."""
    if isinstance(value, paddle.Tensor):
        value = value.numpy()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value
