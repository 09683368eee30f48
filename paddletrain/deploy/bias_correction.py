"""Bias correction for int8 weight rounding, applied to a model before post-training quantization.

Rounding a layer's weights to int8 shifts the mean of its outputs: per output channel by ``ΔW · E[x]``, where
``ΔW`` is the rounding error and ``E[x]`` the mean of the layer's inputs. Across the many small layers of a
depthwise network these shifts add up: on the ants/bees shufflenet, rounding the weights alone (activations kept
fp32) flipped 7 of 397 predictions and lost 2.6 points of top-1 (docs/inference.md, "int8"). The correction
measures ``E[x]`` on the calibration images in one fp32 pass and moves the shift into what follows the layer,
so the quantized layer's outputs keep their fp32 mean: the running mean of the batch norm that reads the layer's
output, or else the layer's own bias (the empirical bias correction of Nagel et al., "Data-Free Quantization
Through Weight Equalization and Bias Correction", ICCV 2019, section 4.2). Weights stay fp32: Paddle's
quantization rounds them afterwards exactly as :func:`rounded_weights` does here.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

log = logging.getLogger("paddletrain")


def quant_axis(layer: Any) -> int | None:
    """The axis Paddle's PostTrainingQuantization rounds ``layer``'s weight along (channel_wise_abs_max: per
    output channel): 0 for a ``Conv2D`` (weight [out, in / groups, kh, kw]), 1 for a ``Linear`` ([in, out]),
    ``None`` for a layer this module does not correct. Subclasses count: they run the same ops."""
    import paddle

    if isinstance(layer, paddle.nn.Conv2D):
        return 0
    if isinstance(layer, paddle.nn.Linear):
        return 1
    return None


def rounded_weights(weight: np.ndarray, axis: int, bits: int = 8) -> np.ndarray:
    """``weight`` rounded to the symmetric ``bits``-bit grid of each slice along ``axis`` and scaled back.

    Each slice's grid step is its largest magnitude over ``2 ** (bits - 1) - 1``; an all-zero slice stays zero.
    """
    levels = 2 ** (bits - 1) - 1
    moved = np.moveaxis(np.asarray(weight, np.float64), axis, 0)
    scale = np.abs(moved).reshape(len(moved), -1).max(axis=1).reshape(-1, *[1] * (moved.ndim - 1))
    scale = np.where(scale == 0, 1.0, scale)
    return np.moveaxis(np.round(moved / scale * levels) * scale / levels, 0, axis).astype(np.float32)


def output_shift(layer: Any, input_mean: np.ndarray, bits: int = 8) -> np.ndarray:
    """The mean change of each output channel of ``layer`` (a ``Conv2D`` or ``Linear``) when its weights are
    rounded to ``bits`` bits, for inputs whose per-channel mean is ``input_mean``.

    A convolution's zero padding is taken to have the inputs' mean too, a small error at the borders only.
    """
    axis = quant_axis(layer)
    weight = layer.weight.numpy()
    delta = rounded_weights(weight, axis, bits).astype(np.float64) - weight
    if axis == 1:  # Linear
        return (input_mean @ delta).astype(np.float32)
    per_tap = delta.reshape(*delta.shape[:2], -1).sum(axis=2)  # [out, in / groups]
    outputs, group_inputs = per_tap.shape
    groups = len(input_mean) // group_inputs
    means = input_mean.reshape(groups, group_inputs)[np.arange(outputs) // (outputs // groups)]
    return (per_tap * means).sum(axis=1).astype(np.float32)


@contextmanager
def weight_rounding_corrected(model: Any, inputs: np.ndarray, keep_ends: bool = True, batch: int = 8,
                              bits: int = 8) -> Iterator[int]:
    """Within the block, every ``Conv2D`` and ``Linear`` of ``model`` (in eval mode) keeps its fp32 output means
    once its weights are rounded to ``bits`` bits (see the module's docstring); on leaving, ``model`` is restored.

    ``inputs`` are the calibration images, float32 NCHW and preprocessed. With ``keep_ends`` the first and the
    last weighted layer to run are left as they are, as the quantization keeps them fp32. A layer followed by a
    batch norm gets the shift in that norm's running mean; one with a bias, in its bias; any other is left as it
    is and named in the log. Yields the number of layers corrected. The model is changed in place rather than
    copied so its parameters keep their names in the traced program.
    """
    order, reader = _layer_input_means(model, inputs, batch)
    names = {id(layer): name for name, layer in model.named_sublayers()}
    targets = _quantized(order, keep_ends)
    saved: list[tuple[Any, np.ndarray]] = []
    uncorrected = []
    try:
        for layer, input_mean in targets:
            shift = output_shift(layer, input_mean, bits)
            norm = reader.get(id(layer))
            if norm is not None:
                saved.append((norm._mean, norm._mean.numpy()))
                norm._mean.set_value(norm._mean.numpy() + shift)
            elif layer.bias is not None:
                saved.append((layer.bias, layer.bias.numpy()))
                layer.bias.set_value(layer.bias.numpy() - shift)
            else:
                uncorrected.append(names[id(layer)])
        if uncorrected:
            log.info("int8 bias correction: %d layer(s) have neither a batch norm after them nor a bias, left as "
                     "they are: %s", len(uncorrected), ", ".join(uncorrected))
        yield len(saved)
    finally:
        for parameter, value in reversed(saved):
            parameter.set_value(value)


@contextmanager
def weights_rounded(model: Any, inputs: np.ndarray, keep_ends: bool = True, bits: int = 8,
                    batch: int = 8) -> Iterator[int]:
    """Within the block, the weights of every ``Conv2D`` and ``Linear`` of ``model`` that int8 quantization rounds
    (all but the first and the last to run with ``keep_ends``) are rounded as it rounds them
    (:func:`rounded_weights`); activations stay fp32. On leaving, ``model`` is restored. Yields the number of
    layers rounded. What weight rounding alone costs a model, with or without :func:`weight_rounding_corrected`
    (comparisons/int8.py ``--weights-only``); ``inputs`` only find the order the layers run in.
    """
    order, _ = _layer_input_means(model, inputs[:batch], batch)
    targets = [layer for layer, _ in _quantized(order, keep_ends)]
    originals = [layer.weight.numpy() for layer in targets]
    try:
        for layer, original in zip(targets, originals, strict=True):
            layer.weight.set_value(rounded_weights(original, quant_axis(layer), bits))
        yield len(targets)
    finally:
        for layer, original in zip(targets, originals, strict=True):
            layer.weight.set_value(original)


def _quantized(order: list[Any], keep_ends: bool) -> list[Any]:
    """The entries of ``order`` (weighted layers in the order they run) whose weights int8 quantization rounds:
    all but the first and the last with ``keep_ends`` (paddletrain.deploy.quantize keeps those two fp32)."""
    return order[1:-1] if keep_ends else order


def _layer_input_means(model: Any, inputs: np.ndarray, batch: int) -> tuple[list[tuple[Any, np.ndarray]],
                                                                            dict[int, Any]]:
    """One eval pass of ``model`` over ``inputs``: each ``Conv2D``/``Linear`` in the order they first run with the
    mean of its input per channel, and for each (by id) the batch norm that reads its output, where one does."""
    import paddle
    from paddle.jit.dy2static.program_translator import ProgramTranslator

    weighted = {id(layer): layer for layer in model.sublayers() if quant_axis(layer) is not None}
    norms = [layer for layer in model.sublayers()
             if isinstance(layer, (paddle.nn.layer.norm._BatchNormBase, paddle.nn.BatchNorm))]
    sums: dict[int, np.ndarray] = {}  # in the order the layers first run
    counts: dict[int, int] = {}
    outputs: dict[int, tuple[Any, Any]] = {}  # id(output) -> (layer, output): the output kept so ids stay unique
    reader: dict[int, Any] = {}

    def record_input(layer: Any, args: tuple) -> None:
        x = args[0]
        channels = 1 if quant_axis(layer) == 0 and layer._data_format == "NCHW" else x.ndim - 1
        axes = [axis for axis in range(x.ndim) if axis != channels]
        rows = int(np.prod([x.shape[a] for a in axes]))
        sums[id(layer)] = sums.get(id(layer), 0) + x.astype("float64").mean(axis=axes).numpy() * rows
        counts[id(layer)] = counts.get(id(layer), 0) + rows

    def record_output(layer: Any, args: tuple, output: Any) -> None:
        outputs[id(output)] = (layer, output)

    def record_norm(norm: Any, args: tuple) -> None:
        produced = outputs.get(id(args[0]))
        if produced is not None:
            reader[id(produced[0])] = norm

    hooks = [layer.register_forward_pre_hook(record_input) for layer in weighted.values()]
    hooks += [layer.register_forward_post_hook(record_output) for layer in weighted.values()]
    hooks += [norm.register_forward_pre_hook(record_norm) for norm in norms]
    was_training = model.training
    model.eval()
    translator = ProgramTranslator()
    was_static = translator.enable_to_static
    translator.enable(False)  # a model traced before (paddle.jit.to_static changes it) would not call the hooks
    try:
        with paddle.no_grad():
            for start in range(0, len(inputs), batch):
                model(paddle.to_tensor(inputs[start:start + batch]))
                outputs.clear()
    finally:
        for hook in hooks:
            hook.remove()
        translator.enable(was_static)
        model.train(was_training)
    return [(weighted[key], sums[key] / counts[key]) for key in sums], reader
