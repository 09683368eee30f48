"""ProfilerCallback: ``paddle.profiler`` over a window of training steps, written into the run directory."""
from __future__ import annotations

import contextlib
import io
import logging
import statistics
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import paddle

from paddletrain.config import check_option
from paddletrain.engine.callback import Callback, StepOutput
from paddletrain.errors import ConfigError
from paddletrain.registry import CALLBACKS

if TYPE_CHECKING:  # pragma: no cover
    from paddletrain.engine.trainer import Trainer

log = logging.getLogger("paddletrain")

SUMMARY_FILE = "summary.txt"
TRACE_FILE = "trace.json"


@CALLBACKS.register("profiler")
class ProfilerCallback(Callback):
    """Profile training steps ``[wait, wait + warmup + active)`` and write what they spent time on.

    After ``wait`` steps the profiler starts (``warmup`` steps, not recorded, so one-off start-up costs stay
    out), records ``active`` steps and then stops. Into ``out_dir`` it writes:

    - ``summary.txt``: the step's split into data wait and compute as the Trainer measured it, then
      ``paddle.profiler``'s summary tables (overview, model, operators) sorted by CPU total time.
    - ``trace.json``: a Chrome trace (open in chrome://tracing or https://ui.perfetto.dev).

    If training ends inside the window, whatever was recorded is written. Only the main process profiles.

    Args:
        out_dir: directory for the two files (created).
        wait / warmup / active: steps to skip, to run the profiler without recording, and to record.
        record_shapes: also record operator input shapes (larger trace).
    """

    main_process_only = True

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        for name, minimum in (("wait", 0), ("warmup", 0), ("active", 1)):
            if name not in options:
                continue
            value = options[name]
            if int(value) != value:
                raise ConfigError(f"{name}={value!r} must be an integer")
            check_option(name, value, ge=minimum)

    def __init__(self, out_dir: str | Path | None = None, wait: int = 2, warmup: int = 1, active: int = 5,
                 record_shapes: bool = False) -> None:
        self.check_options({"wait": wait, "warmup": warmup, "active": active})
        # None: <run dir>/profiler, known when the fit starts.
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.wait, self.warmup, self.active = int(wait), int(warmup), int(active)
        self.record_shapes = record_shapes
        self._profiler: paddle.profiler.Profiler | None = None
        self._steps = 0
        self._recorded: list[StepOutput] = []
        self.done = False

    @property
    def summary_path(self) -> Path:
        return self.out_dir / SUMMARY_FILE

    @property
    def trace_path(self) -> Path:
        return self.out_dir / TRACE_FILE

    def on_fit_start(self, trainer: Trainer) -> None:
        if self.done or self._profiler is not None:
            return
        if self.out_dir is None:
            if trainer.run_dir is None:
                raise ConfigError("ProfilerCallback needs out_dir when the trainer has no run_dir")
            self.out_dir = Path(trainer.run_dir) / "profiler"
        targets = [paddle.profiler.ProfilerTarget.CPU]
        if paddle.device.get_device().startswith("gpu"):
            targets.append(paddle.profiler.ProfilerTarget.GPU)
        self._profiler = paddle.profiler.Profiler(
            targets=targets,
            scheduler=paddle.profiler.make_scheduler(closed=self.wait, ready=self.warmup, record=self.active,
                                                     repeat=1),
            on_trace_ready=self._write,
            record_shapes=self.record_shapes,
        )
        self._profiler.start()

    def on_train_batch_end(self, trainer: Trainer, output: StepOutput, batch: Any, batch_idx: int) -> None:
        if self._profiler is None:
            return
        if self.wait + self.warmup <= self._steps:
            self._recorded.append(output)
        self._steps += 1
        self._profiler.step(num_samples=output.batch_size)
        if self._steps >= self.wait + self.warmup + self.active:
            self._stop()

    def on_fit_end(self, trainer: Trainer) -> None:
        self._stop()

    def on_exception(self, trainer: Trainer, exception: BaseException) -> None:
        self._stop()

    def _stop(self) -> None:
        if self._profiler is None:
            return
        profiler, self._profiler = self._profiler, None
        if not self._recorded:
            log.warning("ProfilerCallback: training ended after %d step(s), before the recorded window "
                        "(wait=%d, warmup=%d); nothing was written", self._steps, self.wait, self.warmup)
        with warnings_silenced():
            profiler.stop()
        self.done = True

    def _write(self, profiler: Any) -> None:
        """``on_trace_ready``: the recorded window is complete (or training ended inside it)."""
        self.out_dir.mkdir(parents=True, exist_ok=True)
        profiler.export(str(self.trace_path), format="json")
        tables = io.StringIO()
        with contextlib.redirect_stdout(tables):
            profiler.summary(sorted_by=paddle.profiler.SortedKeys.CPUTotal, op_detail=True, time_unit="ms")
        self.summary_path.write_text(self._step_split() + "\n" + tables.getvalue())
        log.info("Profile of %d step(s) written to %s and %s", len(self._recorded), self.summary_path,
                 self.trace_path)

    def _step_split(self) -> str:
        """Where a recorded step's time went by the Trainer's own clock: data wait vs compute."""
        steps = self._recorded
        if not steps:
            return "No step completed inside the recorded window.\n"
        data = statistics.median(s.data_time for s in steps) * 1e3
        compute = statistics.median(s.compute_time for s in steps) * 1e3
        share = data / max(data + compute, 1e-9)
        first = self.wait + self.warmup
        return (f"Profiled batches {first}..{first + len(steps) - 1} of the run (0-based) "
                f"(wait={self.wait}, warmup={self.warmup}, active={self.active})\n"
                f"Median per step: data wait {data:.2f} ms, compute {compute:.2f} ms "
                f"(data share {share:.0%}; high means data-bound, see data.num_workers)\n")


@contextlib.contextmanager
def warnings_silenced():
    """Paddle warns on stopping a profiler that is not recording (READY -> CLOSED); that is expected here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield
