"""Load pretrained weights into a model and report exactly what was loaded.

Sources (for now): a local ``.safetensors`` file, or a ``.pdparams`` pickle when the caller passes
``trust_pickle=True`` (unpickling can run code from the file). The classifier head, named by
``model.pretrained_cfg["classifier"]``, may differ: when its shape does not match (another ``num_classes``)
it is skipped and keeps its fresh initialisation, so fine-tuning on a new label set needs no extra step.
"""
from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np
import paddle

from ..errors import UserError

__all__ = ["LoadReport", "PretrainedLoadError", "load_pretrained", "read_state_dict"]

logger = logging.getLogger(__name__)

SAFE_SUFFIXES = (".safetensors",)
PICKLE_SUFFIXES = (".pdparams",)


class PretrainedLoadError(UserError):
    """Weights could not be read, or do not fit the model under ``strict`` loading."""


@dataclass
class LoadReport:
    """What :func:`load_pretrained` did with each weight of the source.

    Attributes:
        source: the file loaded.
        matched: keys copied into the model.
        missing: model keys absent from the source (they keep their fresh initialisation).
        unexpected: source keys the model does not have (ignored).
        shape_mismatched: ``(key, source_shape, model_shape)`` for keys skipped because shapes differ.
        head_reinitialised: the classifier head was not loaded (other shape or absent) and stays fresh.
    """

    source: str
    matched: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    shape_mismatched: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = field(default_factory=list)
    head_reinitialised: bool = False

    def __str__(self) -> str:
        total = len(self.matched) + len(self.missing) + len(self.shape_mismatched)
        lines = [f"Loaded {len(self.matched)}/{total} weights from {self.source}"]
        if self.head_reinitialised:
            lines.append("  classifier head: not loaded, freshly initialised (its shape differs or it is absent)")
        for title, keys in (("missing", self.missing), ("unexpected", self.unexpected)):
            if keys:
                lines.append(f"  {title} ({len(keys)}): {_abbreviate(keys)}")
        if self.shape_mismatched:
            items = [f"{k} {list(src)} vs model {list(dst)}" for k, src, dst in self.shape_mismatched]
            lines.append(f"  shape mismatched ({len(items)}): {_abbreviate(items)}")
        return "\n".join(lines)


def _abbreviate(items: list[str], limit: int = 10) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f", ... (+{len(items) - limit} more)" if len(items) > limit else "")


def read_state_dict(path: str, trust_pickle: bool = False) -> dict[str, np.ndarray]:
    """Read a weight file into a dict of numpy arrays, without unpickling unless ``trust_pickle``.

    Raises:
        PretrainedLoadError: a missing file, an unsupported suffix, a pickle without ``trust_pickle``, or an unreadable file.
    """
    if not os.path.isfile(path):
        raise PretrainedLoadError(f"Pretrained weight file not found: {path!r}")
    suffix = os.path.splitext(path)[1].lower()
    if suffix in SAFE_SUFFIXES:
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            return dict(load_file(path))
        except (SafetensorError, OSError, ValueError) as err:
            raise PretrainedLoadError(f"Cannot read safetensors file {path!r}: {err}") from err
    if suffix in PICKLE_SUFFIXES:
        if not trust_pickle:
            raise PretrainedLoadError(
                f"{path!r} is a pickle, and unpickling can run code from the file. If you trust it, pass "
                f"trust_pickle=True, or convert it once to .safetensors."
            )
        try:
            state = paddle.load(path)
        except Exception as err:  # paddle.load raises many types for a corrupt pickle
            raise PretrainedLoadError(f"Cannot read pickled weights {path!r}: {err}") from err
        if not isinstance(state, Mapping):
            raise PretrainedLoadError(f"{path!r} holds a {type(state).__name__}, not a dict of weights.")
        return {str(k): _to_numpy(v) for k, v in state.items()}
    supported = ", ".join(SAFE_SUFFIXES + PICKLE_SUFFIXES)
    raise PretrainedLoadError(f"Unsupported weight file {path!r}: expected one of {supported}.")


def _to_numpy(value: Any) -> np.ndarray:
    return value.numpy() if isinstance(value, paddle.Tensor) else np.asarray(value)


def _is_head_key(key: str, classifier: str) -> bool:
    return bool(classifier) and (key == classifier or key.startswith(classifier + "."))


def load_pretrained(
    model: paddle.nn.Layer, source: str, strict: bool = True, trust_pickle: bool = False
) -> LoadReport:
    """Copy the weights in ``source`` into ``model`` by parameter name and return a :class:`LoadReport`.

    Args:
        model: the model; its ``pretrained_cfg["classifier"]`` (if any) names the head that may differ.
        source: path to a ``.safetensors`` file, or a ``.pdparams`` file with ``trust_pickle=True``.
        strict: raise if anything outside the classifier head is missing, unexpected or of another shape.
        trust_pickle: allow unpickling ``.pdparams`` (only for files you trust).

    Raises:
        PretrainedLoadError: see :func:`read_state_dict`; under ``strict``, the message lists the
        offending keys.
    """
    state = read_state_dict(source, trust_pickle=trust_pickle)
    classifier = getattr(model, "pretrained_cfg", {}).get("classifier", "")
    target = model.state_dict()
    report = LoadReport(source=str(source))
    to_load: dict[str, np.ndarray] = {}
    for key, param in target.items():
        if key not in state:
            report.missing.append(key)
            continue
        value = state[key]
        model_shape = tuple(param.shape)
        if tuple(value.shape) != model_shape:
            report.shape_mismatched.append((key, tuple(value.shape), model_shape))
            continue
        to_load[key] = value.astype(_numpy_dtype(param), copy=False)
        report.matched.append(key)
    report.unexpected = [k for k in state if k not in target]

    head_problems = [k for k in report.missing if _is_head_key(k, classifier)]
    head_problems += [k for k, _, _ in report.shape_mismatched if _is_head_key(k, classifier)]
    report.head_reinitialised = bool(head_problems)
    if strict:
        problems = [k for k in report.missing if not _is_head_key(k, classifier)]
        problems += [
            f"{k} (file {list(s)} vs model {list(d)})"
            for k, s, d in report.shape_mismatched
            if not _is_head_key(k, classifier)
        ]
        problems += [f"{k} (unexpected)" for k in report.unexpected if not _is_head_key(k, classifier)]
        if problems:
            raise PretrainedLoadError(
                f"Weights in {source!r} do not fit {type(model).__name__} (strict loading): "
                f"{_abbreviate(problems, limit=20)}. Pass strict=False (config: model.strict=false) to load "
                f"the matching weights only."
            )

    with warnings.catch_warnings():
        # Paddle warns once per key it does not find; the report already accounts for each of them.
        warnings.filterwarnings("ignore", message="Skip loading for")
        model.set_state_dict(to_load)
    logger.info("%s", report)
    return report


def _numpy_dtype(param: paddle.Tensor) -> np.dtype:
    # A float16 file loads into a float32 model (and back) by casting; numpy knows every dtype used here.
    return np.dtype(str(param.dtype).replace("paddle.", ""))
