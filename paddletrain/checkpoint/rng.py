"""Capture and restore the python, numpy and paddle random generators in a pickle-free form.

``paddle.get_rng_state()`` returns ``GeneratorState`` objects. Their ``__getstate__`` is a 4-tuple
``(device, seed, offset, engine)`` where ``engine`` is the text form of the mt19937 engine as a list of
byte values; that tuple is plain data, so it can be stored as JSON and fed back to ``__setstate__``.
"""
from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import paddle
from paddle.base import libpaddle

from .untrusted import StateValueError, checked_int, checked_mapping, required, show

GeneratorState = libpaddle.GeneratorState


def generator_state_to_dict(state: GeneratorState) -> dict[str, Any]:
    """Plain-data form of a paddle ``GeneratorState`` (JSON-storable, exact)."""
    device, seed, offset, engine = state.__getstate__()
    # The engine is ASCII digits; latin-1 maps every byte value to one character, so it is lossless.
    return {"device": device, "seed": seed, "offset": offset, "engine": bytes(engine).decode("latin-1")}


# The engine's text form: 312 64-bit words and a position (mt19937_64). Paddle parses any text without
# complaint and silently yields another stream, so the form is checked here; the bound leaves room for
# engines of other builds while keeping a crafted state small.
_MAX_ENGINE_NUMBERS = 1024


def generator_state_from_dict(data: dict[str, Any], key: str = "paddle generator state") -> GeneratorState:
    """Inverse of :func:`generator_state_to_dict`; a malformed ``data`` raises ``StateValueError`` naming ``key``."""
    checked_mapping(data, key)
    device = checked_int(required(data, "device", f"{key}.device"), f"{key}.device", minimum=-1, maximum=2**16)
    seed = checked_int(required(data, "seed", f"{key}.seed"), f"{key}.seed", maximum=2**64 - 1)
    offset = checked_int(required(data, "offset", f"{key}.offset"), f"{key}.offset", maximum=2**64 - 1)
    text = required(data, "engine", f"{key}.engine")
    numbers = text.split() if isinstance(text, str) else []
    if (not numbers or len(numbers) > _MAX_ENGINE_NUMBERS
            or not all(n.isascii() and n.isdigit() and int(n) < 2**64 for n in numbers)):
        raise StateValueError(f"{key}.engine", f"is {show(text)}: expected up to {_MAX_ENGINE_NUMBERS} "
                                               "unsigned 64-bit numbers separated by spaces")
    # GeneratorState has no Python constructor; __new__ + __setstate__ is how pickle rebuilds it too.
    state = GeneratorState.__new__(GeneratorState)
    state.__setstate__((device, seed, offset, list(text.encode("latin-1"))))
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


def set_rng_state(state: dict[str, Any], key: str = "rng") -> None:
    """Restore generators captured by :func:`rng_state` (missing keys are left untouched).

    Every part is checked before any generator changes; a malformed one raises ``StateValueError`` naming it.
    """
    apply = _checked_steps(state, key)
    for step in apply:
        step()


def check_rng_state(state: Any, key: str = "rng") -> None:
    """Raise ``StateValueError`` naming the part of ``state`` that :func:`set_rng_state` could not restore."""
    _checked_steps(state, key)


def _checked_steps(state: Any, key: str) -> list[Callable[[], None]]:
    """One call per part of ``state``, each bound to its value already checked."""
    checked_mapping(state, key)
    apply = []
    if "python" in state:
        apply.append(functools.partial(random.setstate, _python_state(state["python"], f"{key}.python")))
    if "numpy" in state:
        apply.append(functools.partial(np.random.set_state, _numpy_state(state["numpy"], f"{key}.numpy")))
    for name, device in (("paddle_cpu", "cpu"), ("paddle_device", None)):
        if name in state:
            generators = _generator_list(state[name], f"{key}.{name}")
            apply.append(functools.partial(paddle.set_rng_state, generators, device))
    return apply


def _python_state(value: Any, key: str) -> tuple:
    # random.getstate(): (3, 625 ints (624 words < 2**32 and a position <= 624), gauss_next float or None).
    ok = isinstance(value, (list, tuple)) and len(value) == 3 and value[0] == 3
    internal = value[1] if ok else None
    ok = ok and isinstance(internal, (list, tuple)) and len(internal) == 625 and all(
        isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**32 for v in internal) and internal[-1] <= 624
    ok = ok and (value[2] is None or isinstance(value[2], float))
    if not ok:
        raise StateValueError(key, f"is {show(value)}: expected python's random.getstate() "
                                   "(3, 625 integers, a float or null)")
    return (3, tuple(internal), value[2])


def _numpy_state(value: Any, key: str) -> tuple:
    # np.random.get_state(): ("MT19937", 624 uint32 words, position <= 624, has_gauss 0/1, cached gaussian).
    ok = isinstance(value, (list, tuple)) and len(value) == 5 and value[0] == "MT19937"
    ok = ok and isinstance(value[1], np.ndarray) and value[1].shape == (624,) and value[1].dtype.kind in "ui"
    ok = ok and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in value[2:4])
    ok = ok and 0 <= int(value[2]) <= 624 and int(value[3]) in (0, 1) and isinstance(value[4], (float, np.floating))
    if not ok:
        raise StateValueError(key, f"is {show(value)}: expected numpy's random.get_state() "
                                   "('MT19937', 624 words, position, has_gauss, cached gaussian)")
    return ("MT19937", value[1].astype(np.uint32), int(value[2]), int(value[3]), float(value[4]))


def _generator_list(value: Any, key: str) -> list[GeneratorState]:
    if not isinstance(value, (list, tuple)) or not 1 <= len(value) <= 1024 or not all(
            isinstance(v, GeneratorState) for v in value):
        raise StateValueError(key, f"is {show(value)}: expected a list of paddle generator states")
    return list(value)
