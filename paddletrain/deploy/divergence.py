"""Find the first layer whose output a deployment runtime gets wrong (PaddleSlim #364: "which layer loses it?").

Approach, and why: a model is read as a *chain* of blocks, its top-level sub-layers in order with every
``nn.Sequential`` or ``nn.LayerList`` (a ResNet stage) opened into its members, and the classifier head
(``forward_head`` where the model has one) as the last link. The first ``k`` links form a *prefix*, a Layer of its
own that holds the very same sub-layers under the model's own names. Each prefix is exported and run through the
target under test, the same export function and the same runtime, precision and options that ship the whole model,
and its output is compared with the dygraph prefix's output on the same inputs. Bisection over ``k`` then finds the
first link whose output is beyond the target's tolerance in ``log2(links)`` exports.

Running the real runtime on real sub-graphs is what makes the answer trustworthy: graph passes (oneDNN's
conv + batch-norm fusion, int8 quantisation, paddle2onnx's op mapping) act on the exported graph, so a check that
simulates them in Python, or reads weights, can miss what the runtime does. Fetching intermediate tensors from
the full graph would cost one run instead of ``log2(links)`` exports, but only onnxruntime allows it, and fused
graphs have no tensor for a fused layer's output; prefixes work the same way in every runtime. Bisection assumes
that once a link's output is wrong, the outputs after it stay wrong (a broken layer's error propagates); a link
whose error later layers wash out is then not named, and the report says the whole model is within tolerance.

A model whose forward is not such a chain (the chain's output differs from the model's own in dygraph) is
reported as such rather than guessed at.
"""
from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import paddle
from paddle import nn

# The chain must reproduce the model in dygraph: the same kernels on the same inputs, so only the order of a few
# float32 operations may differ.
CHAIN_TOLERANCE = 1e-5


@dataclass
class Divergence:
    """Where a target's outputs first leave the checkpoint's.

    ``layer`` is the first link of the chain whose output's relative error exceeds ``tolerance``; None when
    none does (``reason`` says why: the whole model is within tolerance, or the model is not a chain).
    ``checked`` holds every prefix that was exported and run: its last link and its relative error.
    """

    layer: str | None
    tolerance: float
    relative_error: float | None = None
    checked: list[tuple[str, float]] = field(default_factory=list)
    reason: str | None = None

    def __str__(self) -> str:
        if self.layer is None:
            return f"no layer named: {self.reason}"
        return (f"first diverging layer: {self.layer} (relative error {self.relative_error:.2e} > tolerance "
                f"{self.tolerance:.2e})")


def layer_chain(model: nn.Layer) -> list[str]:
    """The dotted names of ``model``'s chain (see the module notes), head last."""
    head = model.get_classifier() if hasattr(model, "forward_head") and hasattr(model, "get_classifier") else None
    names: list[str] = []

    def walk(prefix: str, layer: nn.Layer) -> None:
        for name, child in layer.named_children():
            if child is head:
                continue
            # A stage: nn.Sequential, or an nn.LayerList that the forward runs in order (paddle.vision's
            # shufflenet); the chain check below refuses a model whose forward does otherwise.
            if isinstance(child, (nn.Sequential, nn.LayerList)) and len(child) > 0:
                walk(f"{prefix}{name}.", child)
            else:
                names.append(f"{prefix}{name}")

    walk("", model)
    return [*names, HEAD] if head is not None else names


HEAD = "head"


class Prefix(nn.Layer):
    """The first links of a model's chain as a Layer of its own, its sub-layers under the model's own names (so
    its exported weights carry the checkpoint's names)."""

    def __init__(self, model: nn.Layer, links: list[str]) -> None:
        super().__init__()
        self._links = list(links)
        for link in links:
            if link == HEAD:
                # The head runs the model's own forward_head (pooling, flattening, classifier): register only
                # its classifier, whose weights are the head's.
                self._forward_head = model.forward_head
                classifier = model.get_classifier()
                name = next(n for n, child in model.named_sublayers() if child is classifier)
                self._place(name, classifier)
            else:
                self._place(link, _sublayer(model, link))
        # A prefix is an inference graph, and it shares its sub-layers with the model: left in train mode, an export
        # (which restores the mode it found) would switch the model's own batch norms to batch statistics.
        self.eval()

    def _place(self, dotted: str, layer: nn.Layer) -> None:
        parent: nn.Layer = self
        *path, last = dotted.split(".")
        for part in path:
            children = dict(parent.named_children())
            if part not in children:
                parent.add_sublayer(part, nn.LayerDict())
                children = dict(parent.named_children())
            parent = children[part]
        parent.add_sublayer(last, layer)

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        for link in self._links:
            if link == HEAD:
                x = self._forward_head(x)
            else:
                layer = _sublayer(self, link)
                if isinstance(layer, nn.Linear) and x.ndim > 2:  # a model without forward_head flattens here
                    x = paddle.flatten(x, 1)
                x = layer(x)
        return x


def _sublayer(root: nn.Layer, dotted: str) -> nn.Layer:
    layer = root
    for part in dotted.split("."):
        layer = dict(layer.named_children())[part]
    return layer


def relative_error(output: np.ndarray, reference: np.ndarray) -> float:
    """``||output - reference|| / ||reference||`` over the whole tensor (an RMS of 1e-6 when the reference is 0)."""
    output = np.asarray(output, np.float64).reshape(-1)
    reference = np.asarray(reference, np.float64).reshape(-1)
    scale = max(float(np.linalg.norm(reference)), 1e-6 * np.sqrt(reference.size))
    return float(np.linalg.norm(output - reference) / scale)


# Runs a Layer through the target under test: (layer, input size CHW, inputs, scratch dir) -> outputs.
RunLayer = Callable[[nn.Layer, tuple[int, int, int], np.ndarray, Path], np.ndarray]


def find_divergence(model: nn.Layer, inputs: np.ndarray, run_layer: RunLayer, tolerance: float) -> Divergence:
    """Name the first link of ``model``'s chain whose output through ``run_layer`` (the target: export + runtime)
    differs from the dygraph output by more than ``tolerance`` (relative error) on ``inputs`` (NCHW float32)."""
    model.eval()
    links = layer_chain(model)
    result = Divergence(layer=None, tolerance=tolerance)
    with paddle.no_grad():
        x = paddle.to_tensor(inputs)
        try:
            chain_error = relative_error(Prefix(model, links)(x).numpy(), model(x).numpy())
            why = f"the chain's output differs by {chain_error:.1e}"
        except (ValueError, RuntimeError) as exc:  # Paddle's shape errors: the links do not even fit together
            chain_error, why = float("inf"), f"its sub-layers in order fail: {str(exc).splitlines()[0]}"
    if chain_error > CHAIN_TOLERANCE:
        result.reason = (f"{type(model).__name__} is not a chain of its sub-layers ({why}), so its layers cannot "
                         "be compared one prefix at a time")
        return result
    input_size = tuple(int(v) for v in inputs.shape[1:])
    with tempfile.TemporaryDirectory(prefix="paddletrain-divergence-") as scratch:

        def error_after(k: int) -> float:
            prefix = Prefix(model, links[:k])
            with paddle.no_grad():
                reference = prefix(paddle.to_tensor(inputs)).numpy()
            error = relative_error(run_layer(prefix, input_size, inputs, Path(scratch) / f"prefix{k}"), reference)
            result.checked.append((links[k - 1], error))
            return error

        full = error_after(len(links))
        if full <= tolerance:
            result.reason = (f"the whole model's output is within tolerance (relative error {full:.2e} <= "
                             f"{tolerance:.2e}): the disagreements are near ties, not a broken layer")
            return result
        good, bad, errors = 0, len(links), {len(links): full}
        while bad - good > 1:
            middle = (good + bad) // 2
            errors[middle] = error_after(middle)
            good, bad = (good, middle) if errors[middle] > tolerance else (middle, bad)
    result.layer, result.relative_error = links[bad - 1], errors[bad]
    return result
