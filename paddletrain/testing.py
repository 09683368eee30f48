"""Test doubles for paddletrain's own tests and for users' tests.

``FakeGradScaler`` behaves like ``paddle.amp.GradScaler`` on a GPU (Paddle's real one is disabled on CPU), so
loss-scaling logic can be tested on any machine: inject it with ``Precision(enabled=True, scaler=FakeGradScaler())``.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import paddle

__all__ = ["FakeGradScaler"]

# The scaler's settings and counters besides the scale, under Paddle's state_dict keys; each is held in the
# attribute of the same name with a leading underscore, as in paddle.amp.GradScaler.
_STATE = ("incr_ratio", "decr_ratio", "incr_every_n_steps", "decr_every_n_nan_or_inf", "incr_count", "decr_count",
          "use_dynamic_loss_scaling")


def _optimizer_params(optimizer: Any) -> Iterator[paddle.Tensor]:
    """The parameters a Paddle optimizer updates, with or without parameter groups.

    Paddle's optimizers have no public accessor for them; these are the attributes its own GradScaler reads.
    """
    for item in getattr(optimizer, "_param_groups", None) or optimizer._parameter_list:
        yield from (item["params"] if isinstance(item, dict) else [item])


class FakeGradScaler:
    """A pure-Python dynamic loss scaler with ``paddle.amp.GradScaler``'s API, counters and state_dict keys.

    Per step it follows Paddle's state machine: ``unscale_`` at most once, then ``step`` (which unscales if
    needed and skips ``optimizer.step()`` on non-finite gradients), then ``update``.
    """

    def __init__(
        self,
        init_loss_scaling: float = 2.0**15,
        incr_ratio: float = 2.0,
        decr_ratio: float = 0.5,
        incr_every_n_steps: int = 1000,
        decr_every_n_nan_or_inf: int = 1,
        use_dynamic_loss_scaling: bool = True,
    ) -> None:
        self._scale = float(init_loss_scaling)
        self._set_state(dict(incr_ratio=incr_ratio, decr_ratio=decr_ratio, incr_every_n_steps=incr_every_n_steps,
                             decr_every_n_nan_or_inf=decr_every_n_nan_or_inf, incr_count=0, decr_count=0,
                             use_dynamic_loss_scaling=use_dynamic_loss_scaling))
        self._found_inf = False
        self._cache_found_inf = False
        self._reset_step_state()

    def _reset_step_state(self) -> None:
        self._unscaled = False
        self._stepped = False

    def is_enable(self) -> bool:
        return True

    def is_use_dynamic_loss_scaling(self) -> bool:
        return self._use_dynamic_loss_scaling

    def scale(self, var: paddle.Tensor) -> paddle.Tensor:
        return var * self._scale

    def unscale_(self, optimizer: Any) -> None:
        """Divide every gradient by the scale in place and record whether any was non-finite."""
        if self._unscaled:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if self._stepped:
            raise RuntimeError("unscale_() is being called after step().")
        found_inf = False
        with paddle.no_grad():
            for param in _optimizer_params(optimizer):
                grad = param.grad
                if grad is None:
                    continue
                grad.scale_(1.0 / self._scale)
                found_inf = found_inf or not bool(paddle.isfinite(grad).all())
        self._found_inf = found_inf
        self._unscaled = True

    def step(self, optimizer: Any) -> None:
        """``optimizer.step()`` unless a gradient was non-finite."""
        if self._stepped:
            raise RuntimeError("step() has already been called since the last update().")
        if not self._unscaled:
            self.unscale_(optimizer)
        self._cache_found_inf = bool(self._found_inf)
        if not self._cache_found_inf:
            optimizer.step()
        self._stepped = True
        if not self._use_dynamic_loss_scaling:
            self._reset_step_state()

    def update(self) -> None:
        """Back off after ``decr_every_n_nan_or_inf`` bad steps, grow after ``incr_every_n_steps`` good ones."""
        if not self._use_dynamic_loss_scaling:
            return
        if self._cache_found_inf:
            self._incr_count = 0
            self._decr_count += 1
            if self._decr_count == self._decr_every_n_nan_or_inf:
                self._scale *= self._decr_ratio
                self._decr_count = 0
        else:
            self._decr_count = 0
            self._incr_count += 1
            if self._incr_count == self._incr_every_n_steps:
                self._scale *= self._incr_ratio
                self._incr_count = 0
        self._reset_step_state()

    def state_dict(self) -> dict[str, Any]:
        return {"scale": np.array([self._scale], dtype=np.float32), **{key: getattr(self, f"_{key}") for key in _STATE}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if len(state_dict) == 0:
            raise RuntimeError("The input state dict is empty, possibly because it was saved from a disabled scaler.")
        self._scale = float(np.asarray(state_dict["scale"]).reshape(-1)[0])
        self._set_state(state_dict)

    def _set_state(self, values: dict[str, Any]) -> None:
        for key in _STATE:
            setattr(self, f"_{key}", values[key])
