"""The device names every CLI and API accepts (``trainer.device``, ``export``/``predict`` ``device=``).

A leaf module, so that the light inference module and the config schema can share the one list without importing
each other or Paddle.
"""
from __future__ import annotations

# auto: a GPU when this Paddle build has CUDA and sees one, else the CPU.
DEVICES = ("auto", "cpu", "gpu")
