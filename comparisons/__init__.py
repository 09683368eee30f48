"""The maintainers' comparisons, kept beside the package and out of the wheel (as timm keeps benchmark.py):
the Trainer's overhead over a hand-written loop, the recipes against a plain run, predict's decode pool against
``paddle.io.DataLoader``. Run from a checkout: ``python -m comparisons <benchmark> [key=value ...]``. They build
through :mod:`paddletrain.build` and share :mod:`paddletrain.bench`'s timing and report code; what a user measures
on their own hardware is ``python -m paddletrain.bench``.
"""
