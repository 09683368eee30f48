"""What Paddle's and paddle2onnx's C++ code prints straight to file descriptors 1 and 2, kept in its place.

Python's ``sys.stdout``/``sys.stderr`` and logging do not see it, so it is handled at the file-descriptor level:
:func:`stdout_to_stderr` keeps a command's machine-readable stdout clean, :func:`quiet_pass_statistics` drops
the statistics Paddle Inference's oneDNN int8/bf16 passes print while a predictor is created (about 30 lines
such as ``---    squashed 28 dequantize-quantize pairs``) and passes everything else through.
"""
from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout

log = logging.getLogger("paddletrain")

# Paddle's PrettyLogDetail lines: optional colour escape, "---", spaces, the statistic.
_PASS_STATISTIC = re.compile(r"^\s*(?:\x1b\[[0-9;]*m)?---\s")


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send file descriptor 1 to stderr for a while: paddle2onnx and Paddle's quantization print progress from C++
    and Python to stdout, which carries a command's JSON summary."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no stdout at all (a daemon): nothing to protect
        yield
        return
    try:
        os.dup2(2, 1)
        with redirect_stdout(sys.stderr):  # Python's prints too, where sys.stdout is not fd 1 (a captured stdout)
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@contextmanager
def quiet_pass_statistics() -> Iterator[None]:
    """Hold file descriptor 2 while the block runs, then write back every line but Paddle's pass statistics
    (logged at debug level instead), so warnings and errors printed meanwhile still reach the user."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr at all: nothing to keep quiet
        yield
        return
    with tempfile.TemporaryFile() as held:
        try:
            os.dup2(held.fileno(), 2)
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            _write_back(held.read().decode("utf-8", errors="replace"))


def _write_back(text: str) -> None:
    statistics = [line for line in text.splitlines() if _PASS_STATISTIC.match(line)]
    others = [line for line in text.splitlines(keepends=True) if not _PASS_STATISTIC.match(line)]
    if statistics:
        log.debug("Paddle Inference passes: %s", "; ".join(re.sub(r"\x1b\[[0-9;]*m|---\s*", "", line).strip()
                                                           for line in statistics))
    if others:
        sys.stderr.write("".join(others))
        sys.stderr.flush()
