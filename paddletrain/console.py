"""What a person sees in the terminal: Paddle's noise filtered, warnings as one log line, and log output that
goes above a progress bar instead of through it.

Three pieces, used by ``python -m paddletrain.fit`` (the first two) and by :class:`~paddletrain.callbacks.ProgressBar`
(the third, so a bar drawn from the Python API stays one line too):

- :func:`install_warning_filters` drops the warnings Paddle prints on every run that tell a user nothing
  (:data:`KNOWN_WARNINGS`, each with the reason), and shows every other warning once per process.
- :func:`route_warnings_to_log` turns each warning into one ``WARNING`` line of the ``py.warnings`` logger, so it
  lands in the run's log file too and in the same format as the rest.
- :func:`above_bar` is active while a bar is on screen: console log lines and warnings are written above the bar
  (``tqdm.write``) and lines marked :data:`FILE_ONLY` skip the console, which already shows the bar.

Nothing here imports Paddle: the filters must be in place before ``import paddle`` warns.
"""
from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

WARNINGS_LOGGER = "py.warnings"  # the logger logging.captureWarnings uses: configurations already know it
# ``log.info(..., extra=FILE_ONLY)``: a line for the log file that the console shows differently (a bar).
FILE_ONLY = {"paddletrain_console": False}
_DEFAULT_SHOWWARNING = warnings.showwarning


@dataclass(frozen=True)
class KnownWarning:
    """A warning Paddle raises on ordinary runs: ``message`` is a regex matched at the start of its text."""

    message: str
    category: type[Warning]
    why: str


# Dropped: each appears on every run and carries no information a paddletrain user can act on.
KNOWN_WARNINGS: tuple[KnownWarning, ...] = (
    KnownWarning(r"No ccache found", UserWarning,
                 "printed by `import paddle` (its C++ extension builder); paddletrain compiles no C++ extension"),
    KnownWarning(r"When training, we now always track global mean and variance", UserWarning,
                 "Paddle's BatchNorm announces its normal behaviour on the first training step of every run"),
)


def format_duration(seconds: float) -> str:
    """``0:02:05`` (hours:minutes:seconds), the way tqdm and timm show durations."""
    seconds = max(0, int(round(seconds)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def install_warning_filters() -> None:
    """Drop :data:`KNOWN_WARNINGS`; show every other warning once per process (per message text).

    The user's own ``-W``/``PYTHONWARNINGS`` choices come first in the filter list and still win; Python's
    default ignores (``DeprecationWarning`` outside ``__main__``...) stay in place.
    """
    for known in KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=known.message, category=known.category)
    # Appended: it only catches what no earlier filter (user's or Python's) decided.
    warnings.simplefilter("once", append=True)


def warning_line(message: Warning | str, category: type[Warning], filename: str, lineno: int) -> str:
    """``UserWarning: <text> (norm.py:885)``: the warning in one line, its source file by name only."""
    text = " ".join(str(message).split())
    return f"{category.__name__}: {text} ({Path(filename).name}:{lineno})"


def _log_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                 file: TextIO | None = None, line: str | None = None) -> None:
    if file is not None:  # an explicit stream (warnings.showwarning's contract): write there, as Python does
        file.write(warnings.formatwarning(message, category, filename, lineno, line))
        return
    logging.getLogger(WARNINGS_LOGGER).warning("%s", warning_line(message, category, filename, lineno))


def route_warnings_to_log() -> None:
    """Show each warning as one ``WARNING`` record of the ``py.warnings`` logger (console and log file)."""
    warnings.showwarning = _log_warning


def _is_console(handler: logging.Handler) -> bool:
    # FileHandler is a StreamHandler too; only the terminal's streams are redirected.
    return (isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
            and getattr(handler, "stream", None) in (sys.stdout, sys.stderr))


def _shown_on_console(record: logging.LogRecord) -> bool:
    return getattr(record, "paddletrain_console", True)


class _AboveBarHandler(logging.Handler):
    """Stands in for a console handler while a bar is drawn: same level, filters and format, written with
    ``tqdm.write`` (which clears the bar, writes the line and redraws the bar)."""

    def __init__(self, original: logging.StreamHandler) -> None:
        super().__init__(original.level)
        self.original = original
        self.setFormatter(original.formatter)
        self.filters = [*original.filters, _shown_on_console]

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.original.stream)
        except Exception:  # a logging handler never raises into the code that logged
            self.handleError(record)


def _write_warning_above_bar(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                             file: TextIO | None = None, line: str | None = None) -> None:
    tqdm.write(warnings.formatwarning(message, category, filename, lineno, line).rstrip("\n"),
               file=file if file is not None else sys.stderr)


@contextlib.contextmanager
def above_bar(loggers: tuple[logging.Logger, ...] | None = None) -> Iterator[None]:
    """While a tqdm bar is on the terminal: console log lines of ``loggers`` (default: the root logger's, which
    paddletrain's loggers propagate to) and warnings printed by Python's default hook go above the bar; records
    logged with ``extra=FILE_ONLY`` reach only the non-console handlers (the log file)."""
    targets = loggers or (logging.getLogger(),)
    for logger in targets:
        # In place, so the handlers keep their order (console before file, as configured).
        logger.handlers = [_AboveBarHandler(h) if _is_console(h) else h for h in logger.handlers]  # type: ignore
    # Warnings already routed to the log (route_warnings_to_log) follow the log handlers; Python's default hook
    # would print through the bar.
    previous_hook: Any = warnings.showwarning
    replace_hook = previous_hook is _DEFAULT_SHOWWARNING
    if replace_hook:
        warnings.showwarning = _write_warning_above_bar
    try:
        yield
    finally:
        if replace_hook and warnings.showwarning is _write_warning_above_bar:
            warnings.showwarning = previous_hook
        for logger in targets:
            logger.handlers = [h.original if isinstance(h, _AboveBarHandler) else h for h in logger.handlers]
