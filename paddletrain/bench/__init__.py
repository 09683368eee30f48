"""Benchmarks: ``python -m paddletrain.bench <train|threads|overhead|data|inference> key=value ...``.

Every benchmark returns a JSON-ready dict (``benchmark``, ``config``, ``environment``, ``rows``, and where it
applies ``summary``/``goals``/``notes``); :mod:`paddletrain.bench.report` renders it as a markdown table.
"""
