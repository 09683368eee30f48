"""A faster input gradient for stride-1 convolutions in CPU training.

Paddle's CPU ``conv2d_grad`` computes a convolution's input gradient by a matrix product per image followed by
``col2im`` (scattering the columns back into the image): on the Fashion-MNIST recipe's 3x3 convolutions it takes
about twice as long as the forward pass of the same size. For a stride-1, ungrouped, undilated convolution with
"same" zero padding, that gradient *is* a forward convolution: of the output gradient with the kernel transposed
(in and out channels swapped) and flipped in space. :func:`use_conv_input_grad` makes the eligible ``Conv2D``
layers of a model compute it that way; their weight and bias gradients still come from Paddle's own kernel, so
parameter gradient hooks (``paddle.DataParallel``'s all-reduce) see nothing different.

The arithmetic is the same, summed in another order: gradients agree with Paddle's to float32 rounding, not
bitwise. Parameter names and state dicts are unchanged (the layers keep their class's parameters; only their
class becomes :class:`InputGradConv2D`, a ``paddle.nn.Conv2D``). Evaluation, inputs that need no gradient and
static graphs run Paddle's own path. Measured in docs/performance.md ("A convolution's input gradient").
"""
from __future__ import annotations

import logging

import paddle
import paddle.nn.functional as F
from paddle.autograd import PyLayer

log = logging.getLogger("paddletrain")


def input_grad(grad_y: paddle.Tensor, weight: paddle.Tensor, padding: list[int]) -> paddle.Tensor:
    """The input gradient of a stride-1 "same" convolution with ``weight``: a forward convolution of ``grad_y``
    with the kernel transposed ([out, in, kh, kw] -> [in, out, kh, kw]) and flipped in space (its adjoint)."""
    return F.conv2d(grad_y, weight.transpose([1, 0, 2, 3]).flip([2, 3]), padding=padding)


class _InputGradAsConvolution(PyLayer):
    """Identity on the convolution's output ``y``; its backward also returns the input gradient, as a convolution.

    ``y`` was computed from a detached input, so Paddle's backward of ``y`` yields only the weight (and bias)
    gradient; this layer hands ``x`` its gradient from the output gradient and the (detached) weight.
    """

    @staticmethod
    def forward(ctx, y: paddle.Tensor, x: paddle.Tensor, weight: paddle.Tensor,  # noqa: ARG004 (x: for its grad)
                padding: list[int]) -> paddle.Tensor:
        ctx.save_for_backward(weight)
        ctx.padding = padding
        return y

    @staticmethod
    def backward(ctx, grad_y: paddle.Tensor) -> tuple[paddle.Tensor, paddle.Tensor]:
        (weight,) = ctx.saved_tensor()
        return grad_y, input_grad(grad_y, weight, ctx.padding)


class InputGradConv2D(paddle.nn.Conv2D):
    """A ``paddle.nn.Conv2D`` whose input gradient in dygraph training is a forward convolution.

    Made by :func:`use_conv_input_grad` from an eligible layer (:func:`takes_conv_input_grad`), never built
    directly; everything but the backward is ``Conv2D``'s.
    """

    def forward(self, x: paddle.Tensor) -> paddle.Tensor:
        if x.stop_gradient or not paddle.in_dynamic_mode():
            return super().forward(x)
        y = F.conv2d(x.detach(), self.weight, self.bias, stride=self._stride, padding=self._updated_padding,
                     dilation=self._dilation, groups=self._groups, data_format=self._data_format)
        return _InputGradAsConvolution.apply(y, x, self.weight.detach(), list(self._updated_padding))


def takes_conv_input_grad(layer: paddle.nn.Layer) -> bool:
    """Whether ``layer`` is a plain ``Conv2D`` whose input gradient is a convolution of the output gradient:
    stride 1, no dilation, one group, NCHW, odd kernel sides with "same" zero padding (``k // 2`` each side)."""
    if type(layer) is not paddle.nn.Conv2D:  # a subclass may have its own forward
        return False
    kernel_h, kernel_w = layer._kernel_size
    return (list(layer._stride) == [1, 1] and list(layer._dilation) == [1, 1] and layer._groups == 1
            and layer._data_format == "NCHW" and layer._padding_mode == "zeros"
            and layer._padding_algorithm == "EXPLICIT" and kernel_h % 2 == 1 and kernel_w % 2 == 1
            and list(layer._updated_padding) == [kernel_h // 2, kernel_w // 2])


def use_conv_input_grad(model: paddle.nn.Layer, device: str | None = None) -> int:
    """Make every eligible convolution of ``model`` (itself included) an :class:`InputGradConv2D`, in place;
    returns how many. Call on the bare model, before ``paddle.DataParallel`` wraps it; idempotent.

    ``device`` (``model.conv_input_grad`` in a run): the run's device, and the conversion is logged; on anything
    but a CPU nothing is converted (it is a CPU kernel's workaround) and that is logged instead.
    """
    if device is not None and not device.startswith("cpu"):
        log.info("model.conv_input_grad is for CPU training: %s keeps Paddle's kernels", device)
        return 0
    converted = 0
    for layer in [model, *model.sublayers()]:
        if takes_conv_input_grad(layer):
            layer.__class__ = InputGradConv2D
            converted += 1
    if device is not None:
        log.info("model.conv_input_grad: %d convolutions compute their input gradient as a convolution", converted)
    return converted
