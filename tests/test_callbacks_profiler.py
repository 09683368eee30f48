"""ProfilerCallback: paddle.profiler over a window of steps, summary + Chrome trace written to its directory."""
from __future__ import annotations

import json
import logging
from dataclasses import replace

import paddle
import pytest

from paddletrain.bench.common import TinyNet, synthetic_batches
from paddletrain.build import build_callbacks
from paddletrain.callbacks import ProfilerCallback
from paddletrain.engine.trainer import Trainer


def _fit(callback: ProfilerCallback, batches: int) -> Trainer:
    paddle.seed(0)
    model = TinyNet(num_classes=10)
    trainer = Trainer(model, paddle.optimizer.SGD(0.01, parameters=model.parameters()), callbacks=[callback],
                      num_classes=10, handle_signals=False)
    trainer.fit(synthetic_batches(batches, 4, 8, 10))
    return trainer


def test_writes_summary_and_chrome_trace_for_the_window(tmp_path):
    callback = ProfilerCallback(tmp_path / "profiler", wait=1, warmup=1, active=2)
    _fit(callback, batches=6)

    summary = callback.summary_path.read_text()
    assert "Profiled batches 2..3" in summary
    assert "data wait" in summary and "compute" in summary
    assert "Overview Summary" in summary and "Operator Summary" in summary
    # Two recorded steps: the profiler's step table counts exactly those.
    assert "ProfileStep                3" not in summary and "ProfileStep                2" in summary
    trace = json.loads(callback.trace_path.read_text())
    names = {event.get("name", "") for event in trace["traceEvents"]}
    assert any(name.startswith("ProfileStep#2") for name in names)
    assert not any(name.startswith("ProfileStep#4") for name in names)
    assert callback.done


def test_run_ending_inside_the_recorded_window_writes_what_was_recorded(tmp_path):
    callback = ProfilerCallback(tmp_path, wait=0, warmup=1, active=10)
    _fit(callback, batches=3)
    assert "Profiled batches 1..2" in callback.summary_path.read_text()
    assert callback.trace_path.exists()


def test_run_ending_before_the_window_writes_nothing_and_says_so(tmp_path, caplog):
    callback = ProfilerCallback(tmp_path / "p", wait=5, warmup=1, active=2)
    with caplog.at_level(logging.WARNING, logger="paddletrain"):
        _fit(callback, batches=2)
    assert not (tmp_path / "p").exists()
    assert "before the recorded window" in caplog.text


def test_profiles_once_across_fit_calls(tmp_path):
    callback = ProfilerCallback(tmp_path, wait=0, warmup=0, active=1)
    trainer = _fit(callback, batches=2)
    first = callback.trace_path.stat().st_mtime_ns
    trainer.limits = replace(trainer.limits, max_epochs=2)
    trainer.fit(synthetic_batches(2, 4, 8, 10))
    assert callback.trace_path.stat().st_mtime_ns == first


@pytest.mark.parametrize("kwargs", [dict(active=0), dict(wait=-1), dict(warmup=1.5)])
def test_rejects_bad_window(tmp_path, kwargs):
    name = next(iter(kwargs))
    with pytest.raises(ValueError, match=name):
        ProfilerCallback(tmp_path, **kwargs)


def test_fit_config_wires_profile_into_the_run_dir(tmp_path, tiny_overrides):
    from .conftest import compose_fit

    cfg = compose_fit(tiny_overrides + ["+callbacks.profiler.wait=3", "+callbacks.profiler.active=4"])
    callbacks = build_callbacks(cfg)
    (profiler,) = [c for c in callbacks if isinstance(c, ProfilerCallback)]
    assert profiler.out_dir is None  # the run directory's, known when the fit starts
    assert (profiler.wait, profiler.warmup, profiler.active) == (3, 1, 4)
    off = build_callbacks(compose_fit(tiny_overrides))
    assert not any(isinstance(c, ProfilerCallback) for c in off)
