"""paddletrain: a reusable training library for image classification on PaddlePaddle."""

__version__ = "0.1.0"
