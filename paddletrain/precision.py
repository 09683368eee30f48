"""Float32 and automatic mixed precision (AMP) behind one small interface.

The Trainer only ever calls::

    model, optimizer = precision.setup(model, optimizer)   # O2: float16/bfloat16 weights + float32 masters
    with precision.autocast():                             # auto_cast, or nothing for float32
        loss = criterion(model(x), y)
    precision.backward(loss)                               # scaled backward under float16
    result = precision.step(optimizer, model.parameters(), clip_norm)

``step`` follows Lightning's documented order: unscale -> finiteness check of every gradient -> clip (on the
unscaled gradients) -> optimizer step, or skip it -> scaler update -> clear gradients. The finiteness check is
the trainer's own guard and runs on every device, including CPU, where Paddle's GradScaler and auto_cast do
nothing and a single inf loss would otherwise corrupt the weights.
"""
from __future__ import annotations

import logging
import warnings
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ContextManager, Dict, Iterable, List, Optional, Protocol, Tuple, Union

import numpy as np
import paddle

from paddletrain.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.config import AmpConfig

logger = logging.getLogger(__name__)

LEVELS = ("O1", "O2")
DTYPES = ("float16", "bfloat16")


class ScalerLike(Protocol):
    """The part of ``paddle.amp.GradScaler``'s API that :class:`Precision` relies on."""

    _found_inf: Any
    _scale: Any

    def scale(self, var: paddle.Tensor) -> paddle.Tensor: ...

    def unscale_(self, optimizer: Any) -> None: ...

    def step(self, optimizer: Any) -> None: ...

    def update(self) -> None: ...

    def state_dict(self) -> Dict[str, Any]: ...

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None: ...


class GradScaler(paddle.amp.GradScaler):
    """``paddle.amp.GradScaler`` whose loss-scale back-off works with NumPy >= 2.4.

    Paddle 3.3's ``_update`` logs ``float(self._scale)`` on a shape-[1] tensor, which NumPy 2.4 turned into a
    TypeError: the first overflow would crash a float16 run. Same counters and rules, without that print.
    """

    def _update(self) -> None:
        if not self._enable:
            return
        if self._cache_found_inf:
            self._incr_count = 0
            self._decr_count += 1
            if self._decr_count == self._decr_every_n_nan_or_inf:
                self._scale = self._scale * self._decr_ratio
                self._decr_count = 0
        else:
            self._decr_count = 0
            self._incr_count += 1
            if self._incr_count == self._incr_every_n_steps:
                self._scale = self._scale * self._incr_ratio
                self._incr_count = 0


@dataclass(frozen=True)
class StepResult:
    """What one optimizer step did, as host values."""

    # Whether the optimizer updated the weights (False when a gradient was non-finite).
    stepped: bool
    found_inf: bool
    # Global L2 norm of the unscaled gradients before clipping (None when no parameter had a gradient).
    grad_norm: Optional[float]
    # The loss scale this step's loss was multiplied by (None without a scaler).
    loss_scale: Optional[float]


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
        scaler: Union[ScalerLike, None, bool, str] = "auto",
        init_loss_scaling: float = 65536.0,
        incr_ratio: float = 2.0,
        decr_ratio: float = 0.5,
        incr_every_n_steps: int = 2000,
        decr_every_n_nan_or_inf: int = 1,
        use_dynamic_loss_scaling: bool = True,
        eval_in_amp: bool = False,
        device: Optional[str] = None,
    ) -> None:
        if level not in LEVELS:
            raise ConfigError(f"trainer.amp.level must be one of {list(LEVELS)}, got {level!r}")
        if dtype not in DTYPES:
            raise ConfigError(f"trainer.amp.dtype must be one of {list(DTYPES)}, got {dtype!r}")
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
        self.scaler: Optional[ScalerLike] = self._resolve_scaler(scaler, on_cpu, scaler_kwargs)
        self._is_setup = False
        if self.enabled and on_cpu:
            injected = " (the injected loss scaler is still used)" if self.scaler is not None else ""
            logger.info(
                "AMP (trainer.amp.enabled=true) is inert on CPU: training runs in float32%s.", injected
            )

    @classmethod
    def from_config(cls, amp_cfg: "AmpConfig", device: str) -> "Precision":
        """Build from ``trainer.amp``; ``use_scaler`` None means a scaler exactly when the dtype is float16."""
        use_scaler = amp_cfg.use_scaler
        scaler: Union[bool, str] = "auto" if use_scaler is None else bool(use_scaler)
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
        self, scaler: Union[ScalerLike, None, bool, str], on_cpu: bool, kwargs: Dict[str, Any]
    ) -> Optional[ScalerLike]:
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
    def setup(self, model: paddle.nn.Layer, optimizer: Any) -> Tuple[paddle.nn.Layer, Any]:
        """Cast for O2 (float32 master weights, float32 state_dict); O1 and float32 return them unchanged.

        Call before wrapping the model in ``paddle.DataParallel``. Idempotent: a second call (e.g. by the
        Trainer after ``fit.py`` already set up and wrapped the model) changes nothing.
        """
        if self._is_setup:
            return model, optimizer
        self._is_setup = True
        if self.amp_active and self.level == "O2":
            model, optimizer = paddle.amp.decorate(
                models=model,
                optimizers=optimizer,
                level="O2",
                dtype=self.dtype,
                master_weight=True,
                save_dtype="float32",
            )
        return model, optimizer

    def autocast(self, training: bool = True) -> ContextManager:
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
             clip_norm: Optional[float] = None) -> StepResult:
        """Unscale, check, clip, step (or skip), update the scale and clear the gradients.

        A step is skipped when any gradient is non-finite (or the global gradient norm overflows float32), so
        the weights and the optimizer state stay exactly as they were. One host synchronisation per call.
        """
        if clip_norm is not None and not clip_norm > 0:
            raise ConfigError(f"trainer.grad_clip_norm must be > 0 or null, got {clip_norm!r}")
        scale_used = self.scaler._scale if self.scaler is not None else None
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)
        grads = [p.grad for p in parameters if p.grad is not None]
        with paddle.no_grad():
            total_norm = _global_norm(grads)
            if clip_norm is not None and total_norm is not None:
                _scale_grads_(grads, clip_norm, total_norm)
        grad_norm, scale_used = _to_host(total_norm, scale_used)
        found_inf = grad_norm is not None and not np.isfinite(grad_norm)

        if self.scaler is not None:
            if found_inf:
                # Our check covers every gradient; make sure the scaler skips and backs off on it too.
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
    def loss_scale(self) -> Optional[float]:
        """The current loss scale (after the last update), or None without a scaler."""
        if self.scaler is None:
            return None
        return _to_host(None, self.scaler._scale)[1]

    def state_dict(self) -> Dict[str, Any]:
        """The scaler's state (scale and good/bad step counters) as plain Python values, or an empty dict."""
        if self.scaler is None:
            return {}
        return {"scaler": {k: _plain(v) for k, v in self.scaler.state_dict().items()}}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Restore the loss scale and counters saved by :meth:`state_dict`."""
        saved = state.get("scaler") if state else None
        if self.scaler is None:
            if saved:
                logger.warning("The checkpoint holds loss-scaler state but this run uses no scaler: ignored.")
            return
        if not saved:
            logger.info("The checkpoint holds no loss-scaler state: starting from the initial loss scale.")
            return
        saved = _checked_scaler_state(saved)
        # paddle.amp.GradScaler reads the scale as state["scale"][0].
        saved["scale"] = np.asarray(saved["scale"], dtype=np.float32).reshape([1])
        self.scaler.load_state_dict(saved)


def _checked_scaler_state(saved: Any) -> Dict[str, Any]:
    """The saved loss-scaler state with every value in the range paddle's scaler assumes (else StateValueError)."""
    from paddletrain.checkpoint.untrusted import (StateValueError, checked_bool, checked_int, checked_mapping,
                                                  checked_number, required, show)

    saved = dict(checked_mapping(saved, "scaler"))
    scale = required(saved, "scale", "scaler.scale")
    saved["scale"] = scale[0] if isinstance(scale, (list, tuple)) and len(scale) == 1 else scale
    for name, allowed, wanted in (("scale", lambda x: x > 0, "> 0"), ("incr_ratio", lambda x: x >= 1, ">= 1"),
                                  ("decr_ratio", lambda x: 0 < x <= 1, "in (0, 1]")):
        number = checked_number(required(saved, name, f"scaler.{name}"), f"scaler.{name}", finite=True)
        if not allowed(number):
            raise StateValueError(f"scaler.{name}", f"is {show(saved[name])}: expected a number {wanted}")
        saved[name] = number
    for name, low in (("incr_every_n_steps", 1), ("decr_every_n_nan_or_inf", 1), ("incr_count", 0),
                      ("decr_count", 0)):
        saved[name] = checked_int(required(saved, name, f"scaler.{name}"), f"scaler.{name}", minimum=low)
    key = "scaler.use_dynamic_loss_scaling"
    saved["use_dynamic_loss_scaling"] = checked_bool(required(saved, "use_dynamic_loss_scaling", key), key)
    return saved


def _check_scaler_settings(
    init_loss_scaling: float,
    incr_ratio: float,
    decr_ratio: float,
    incr_every_n_steps: int,
    decr_every_n_nan_or_inf: int,
    use_dynamic_loss_scaling: bool,
) -> None:
    """Paddle only asserts these; name the offending key instead."""
    checks = [
        ("init_loss_scaling", init_loss_scaling, init_loss_scaling > 0, "> 0"),
        ("incr_ratio", incr_ratio, incr_ratio > 1.0, "> 1"),
        ("decr_ratio", decr_ratio, 0.0 < decr_ratio < 1.0, "in (0, 1)"),
        ("incr_every_n_steps", incr_every_n_steps, incr_every_n_steps >= 1, ">= 1"),
        ("decr_every_n_nan_or_inf", decr_every_n_nan_or_inf, decr_every_n_nan_or_inf >= 1, ">= 1"),
    ]
    for key, value, ok, rule in checks:
        if not ok:
            raise ConfigError(f"trainer.amp.{key} must be {rule}, got {value!r}")


def _squared_norm(grad: paddle.Tensor) -> paddle.Tensor:
    # Accumulate in float32: a float16 sum of squares overflows once a gradient's norm passes 256.
    if grad.dtype != paddle.float32:
        grad = grad.astype("float32")
    # The fused kernel Paddle's own ClipGradByGlobalNorm uses: ~3x faster than square().sum() on CPU.
    fused = getattr(paddle._C_ops, "squared_l2_norm", None)
    return fused(grad).reshape([]) if fused is not None else paddle.square(grad).sum()


def _global_norm(grads: List[paddle.Tensor]) -> Optional[paddle.Tensor]:
    """L2 norm of all gradients as one vector; inf/nan iff some gradient is non-finite (or the norm overflows)."""
    if not grads:
        return None
    return paddle.stack([_squared_norm(g) for g in grads]).sum().sqrt()


def _scale_grads_(grads: List[paddle.Tensor], max_norm: float, total_norm: paddle.Tensor) -> None:
    """Clip by global norm in place, on the device (no host sync)."""
    # Shape [1], not 0-d: Paddle's in-place multiply broadcasts a 0-d factor ~6x slower on CPU.
    coef = paddle.clip(max_norm / (total_norm + 1e-6), max=1.0).reshape([1])
    by_dtype = {paddle.float32: coef}
    for g in grads:
        if g.dtype not in by_dtype:
            by_dtype[g.dtype] = coef.astype(g.dtype)
        g.multiply_(by_dtype[g.dtype])


def _to_host(norm: Optional[paddle.Tensor], scale: Any) -> Tuple[Optional[float], Optional[float]]:
    """Fetch the norm and the loss scale with a single device-to-host copy."""
    tensors = [t.astype("float32").reshape([1]) for t in (norm, scale) if isinstance(t, paddle.Tensor)]
    fetched = iter(paddle.concat(tensors).numpy().tolist()) if tensors else iter(())

    def value(x: Any) -> Optional[float]:
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
