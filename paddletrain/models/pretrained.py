"""Load pretrained weights into a model, exactly and loudly, and report what was loaded.

``load_pretrained(model, source)`` reads the source (see :mod:`paddletrain.models.weights.sources`), converts
its parameter names onto the model's (:mod:`~paddletrain.models.weights.mapping`), adapts the first conv to
another ``in_chans`` (:mod:`~paddletrain.models.weights.adapt`) and copies the weights. Under ``strict``
(the default) anything but the classifier head missing, unexpected or of another shape is an error listing
the keys. A head of another ``num_classes`` is dropped on purpose: it keeps its fresh initialisation and the
:class:`LoadReport` says so. The weights' preprocessing and label names go into ``model.pretrained_cfg``.
"""
from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import paddle
from safetensors.numpy import save_file

from paddletrain.engine.state_checks import compare_state

from .weights.adapt import adapt_input_conv
from .weights.mapping import FIRST_PROJECTION_PREFIXES, HEAD_PREFIXES, IDENTITY, convert_state
from .weights.report import LoadReport, PretrainedLoadError, abbreviate
from .weights.sources import (
    META_LABEL_NAMES,
    META_PREPROCESSING,
    WeightsInfo,
    describe,
    read_state_dict,
    read_weights,
)

__all__ = [
    "LoadReport",
    "PretrainedLoadError",
    "describe",
    "load_pretrained",
    "load_state",
    "read_state_dict",
    "save_pretrained",
]

log = logging.getLogger(__name__)

PREPROCESSING_KEYS = ("input_size", "mean", "std", "interpolation", "crop_pct")


def load_pretrained(
    model: paddle.nn.Layer, source: str, strict: bool = True, trust_pickle: bool = False
) -> LoadReport:
    """Load the weights of ``source`` into ``model`` and return the :class:`LoadReport`.

    Args:
        model: the model; ``pretrained_cfg["classifier"]`` names its head and ``["first_conv"]`` its first conv.
        source: a ``.safetensors``/``.pdparams`` file, a paddletrain checkpoint directory, ``vision:<arch>``,
            ``paddleclas:<ModelName>`` or ``hub:<module>``.
        strict: raise if anything but the classifier head is missing, unexpected or of another shape.
        trust_pickle: allow ``paddle.load`` on a ``.pdparams`` pickle that holds more than arrays.

    Raises:
        PretrainedLoadError: the source cannot be read, or (strict) does not fit; the message lists the keys.
    """
    state, info = read_weights(source, trust_pickle=trust_pickle)
    return load_state(model, state, info, strict=strict)


def load_state(
    model: paddle.nn.Layer, state: Mapping[str, np.ndarray], info: WeightsInfo, strict: bool = True
) -> LoadReport:
    """Load an already-read ``state`` (arrays in any supported naming) into ``model``; see :func:`load_pretrained`."""
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    classifier = cfg.get("classifier", "")
    first_conv = f"{cfg['first_conv']}.weight" if cfg.get("first_conv") else ""
    conversion = convert_state(state, model)
    report = LoadReport(source=info.source, path=str(info.path or ""), scheme=conversion.scheme)

    expected = model.state_dict()
    arrays = {key: np.asarray(value) for key, value in conversion.state.items()}
    if first_conv in arrays and first_conv in expected:
        model_shape = tuple(expected[first_conv].shape)
        if _differs_in_channels_only(arrays[first_conv].shape, model_shape):
            arrays[first_conv], how = adapt_input_conv(arrays[first_conv], model_shape[1])
            report.input_conv_adapted = f"{first_conv}: {how}"
    diff = compare_state(expected, arrays)
    report.missing = diff.missing
    report.shape_mismatched = diff.mismatched
    report.unexpected = list(conversion.unmapped) + diff.unexpected
    unfit = {key for key, _, _ in diff.mismatched}
    to_load = {key: arrays[key].astype(_numpy_dtype(param), copy=False)
               for key, param in expected.items() if key in arrays and key not in unfit}
    report.matched = list(to_load)

    def is_head(key: str) -> bool:
        return bool(classifier) and (key == classifier or key.startswith(classifier + "."))

    # The source's own name for the head, which a feature extractor (num_classes=0) leaves unmatched.
    source_head = (classifier + ".",) if conversion.scheme == IDENTITY else HEAD_PREFIXES[conversion.scheme]
    report.head_reinitialised = any(is_head(k) for k in report.missing) or any(
        is_head(k) for k, _, _ in report.shape_mismatched
    )
    problems = [f"{k} (missing)" for k in report.missing if not is_head(k)]
    problems += [f"{k} (source {list(s)} vs model {list(d)})" for k, s, d in report.shape_mismatched if not is_head(k)]
    problems += [f"{k} (unexpected)" for k in report.unexpected if not (classifier and k.startswith(source_head))]
    if not any(not is_head(key) for key in report.matched):  # strict=False would return the model as if trained
        raise PretrainedLoadError(
            f"Weights from {info.source!r} fit none of {_model_name(model)}'s weights (naming {conversion.scheme!r}, "
            f"{len(arrays)} tensors read, 0 of {len(expected)} loaded besides the head): weights of another "
            f"architecture?{_hints(model, info, report, conversion.scheme)} Drop pretrained (model.pretrained=null) "
            "to start from random weights.")
    if problems and strict:
        raise PretrainedLoadError(
            f"Weights from {info.source!r} do not fit {_model_name(model)} (strict loading, naming "
            f"{conversion.scheme!r}, {len(report.matched)} keys matched): {abbreviate(problems, limit=20)}."
            f"{_hints(model, info, report, conversion.scheme)} Pass strict=False (config: model.strict=false) "
            f"to load the matching weights only."
        )

    with warnings.catch_warnings():
        # Paddle warns once per key it does not find; the report already accounts for each of them.
        warnings.filterwarnings("ignore", message="Skip loading for")
        model.set_state_dict(to_load)
    _record_weights_cfg(model, info, report)
    if problems:
        log.warning("%s", report)
    else:
        log.info("%s", report)
    return report


def _differs_in_channels_only(source: Sequence[int], model: Sequence[int]) -> bool:
    return len(source) == len(model) == 4 and source[1] != model[1] and (source[0], *source[2:]) == (
        model[0], *model[2:])


def _model_name(model: paddle.nn.Layer) -> str:
    arch = (getattr(model, "pretrained_cfg", {}) or {}).get("architecture")
    return f"{type(model).__name__} {arch!r}" if arch else type(model).__name__


def _hints(model: paddle.nn.Layer, info: WeightsInfo, report: LoadReport, scheme: str) -> str:
    hints = []
    arch = (getattr(model, "pretrained_cfg", {}) or {}).get("architecture")
    if info.architecture and arch and info.architecture != arch:
        hints.append(f"these weights are for {info.architecture!r}, the model is {arch!r}")
    prefixes = FIRST_PROJECTION_PREFIXES.get(scheme, ())
    if any(k.startswith(prefixes) for k in report.unexpected):
        hints.append("the weights have a projection shortcut in the first block (PaddleClas/PaddleHub layout): "
                     "build the model with project_first_shortcut=True")
    elif any(k.startswith("layer1.0.downsample.") for k in report.missing):
        hints.append("the model has a projection shortcut in the first block that the weights lack: build it "
                     "without project_first_shortcut")
    return "".join(f" Hint: {h}." for h in hints)


def _record_weights_cfg(model: paddle.nn.Layer, info: WeightsInfo, report: LoadReport) -> None:
    """Put what the weights carry (preprocessing, label names, origin) into ``model.pretrained_cfg``."""
    cfg = getattr(model, "pretrained_cfg", None)
    if not isinstance(cfg, dict):
        return
    updated = dict(cfg)
    in_chans = (cfg.get("input_size") or (3,))[0]
    for key in PREPROCESSING_KEYS:
        if key in info.preprocessing:
            updated[key] = info.preprocessing[key]
    for key in ("mean", "std"):
        if key in info.preprocessing and len(updated[key]) != in_chans:
            # RGB statistics for a grey or multi-band model: their average per channel, as the ResNet default.
            updated[key] = (sum(updated[key]) / len(updated[key]),) * in_chans
    if "input_size" in info.preprocessing:
        updated["input_size"] = (in_chans, *tuple(info.preprocessing["input_size"])[1:])
    head_loaded = not report.head_reinitialised and cfg.get("num_classes")
    if info.label_names and head_loaded and len(info.label_names) == cfg.get("num_classes"):
        updated["label_names"] = list(info.label_names)
    updated["source"] = info.source
    model.pretrained_cfg = updated


def save_pretrained(model: paddle.nn.Layer, path: str, label_names: Sequence[str] | None = None) -> None:
    """Write ``model``'s weights to a ``.safetensors`` file that carries its preprocessing and label names.

    :func:`load_pretrained` reads them back into ``pretrained_cfg``, and ``fit`` uses the preprocessing for
    ``data.*`` keys set to null.
    """
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    metadata = {META_PREPROCESSING: json.dumps({k: cfg[k] for k in PREPROCESSING_KEYS if k in cfg})}
    names = label_names if label_names is not None else cfg.get("label_names")
    if names is not None:
        metadata[META_LABEL_NAMES] = json.dumps(list(names))
    save_file({k: v.numpy() for k, v in model.state_dict().items()}, str(path), metadata=metadata)


def _numpy_dtype(param: paddle.Tensor) -> Any:
    # A float16 file loads into a float32 model (and back) by casting; numpy knows every dtype used here.
    return np.dtype(str(param.dtype).replace("paddle.", ""))
