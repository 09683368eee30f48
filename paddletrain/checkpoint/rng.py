"""Capture and restore the python, numpy and paddle random generators in a pickle-free form.

``paddle.get_rng_state()`` returns ``GeneratorState`` objects. Their ``__getstate__`` is a 4-tuple
``(device, seed, offset, engine)`` where ``engine`` is the text form of the mt19937 engine as a list of
byte values; that tuple is plain data, so it can be stored as JSON and fed back to ``__setstate__``.
"""
from __future__ import annotations

import random
from typing import Any

import numpy as np
import paddle
from paddle.base import libpaddle

GeneratorState = libpaddle.GeneratorState


def generator_state_to_dict(state: GeneratorState) -> dict[str, Any]:
    """Plain-data form of a paddle ``GeneratorState`` (JSON-storable, exact)."""
    device, seed, offset, engine = state.__getstate__()
    # The engine is ASCII digits; latin-1 maps every byte value to one character, so it is lossless.
    return {"device": device, "seed": seed, "offset": offset, "engine": bytes(engine).decode("latin-1")}


def generator_state_from_dict(data: dict[str, Any]) -> GeneratorState:
    """Inverse of :func:`generator_state_to_dict`."""
    # GeneratorState has no Python constructor; __new__ + __setstate__ is how pickle rebuilds it too.
    state = GeneratorState.__new__(GeneratorState)
    engine = list(data["engine"].encode("latin-1"))
    state.__setstate__((int(data["device"]), int(data["seed"]), int(data["offset"]), engine))
    return state


def rng_state() -> dict[str, Any]:
    """Snapshot of every global random generator, storable with ``save_checkpoint``.

    Keys: ``python`` (``random.getstate()``), ``numpy`` (``np.random.get_state()``), ``paddle_cpu``
    and, when the current device is not the CPU, ``paddle_device`` (one state per device).
    """
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "paddle_cpu": paddle.get_rng_state("cpu"),
    }
    if not isinstance(paddle.framework._current_expected_place_(), paddle.CPUPlace):
        state["paddle_device"] = paddle.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore generators captured by :func:`rng_state` (missing keys are left untouched)."""
    if "python" in state:
        version, internal, gauss_next = state["python"]
        random.setstate((version, tuple(internal), gauss_next))
    if "numpy" in state:
        np.random.set_state(tuple(state["numpy"]))
    if "paddle_cpu" in state:
        paddle.set_rng_state(list(state["paddle_cpu"]), "cpu")
    if "paddle_device" in state:
        paddle.set_rng_state(list(state["paddle_device"]))
