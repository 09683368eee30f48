"""paddletrain.deploy.native_output: what C++ code prints to file descriptors 1 and 2 goes where a command wants it."""
from __future__ import annotations

import logging
import os

import pytest

from paddletrain.deploy.native_output import quiet_pass_statistics, stdout_to_stderr


def test_pass_statistics_are_dropped_to_debug_and_everything_else_written_back(capfd, caplog):
    with caplog.at_level(logging.DEBUG, logger="paddletrain"), quiet_pass_statistics():
        os.write(2, b"\x1b[37m---    squashed 28 dequantize-quantize pairs\x1b[0m\n")  # as Paddle's C++ prints it
        os.write(2, b"W1126 warning from C++: keep me\n")
        os.write(2, b"---    quantized 11 fused_conv2d ops \n")
    err = capfd.readouterr().err
    assert err == "W1126 warning from C++: keep me\n"
    assert "squashed 28 dequantize-quantize pairs; quantized 11 fused_conv2d ops" in caplog.text


def test_an_error_inside_still_writes_back_what_was_held(capfd):
    with pytest.raises(RuntimeError, match="create_predictor failed"), quiet_pass_statistics():
        os.write(2, b"Error: the graph is broken\n")
        raise RuntimeError("create_predictor failed")
    assert capfd.readouterr().err == "Error: the graph is broken\n"


def test_stdout_to_stderr_keeps_stdout_for_the_summary(capfd):
    with stdout_to_stderr():
        os.write(1, b"progress from C++\n")
    print("summary")
    out, err = capfd.readouterr()
    assert out == "summary\n" and err == "progress from C++\n"


def test_stdout_to_stderr_also_moves_python_prints_where_sys_stdout_is_not_fd_1(capsys):
    # onnxruntime's calibration prints its progress with print(); under a captured sys.stdout (pytest, or a caller
    # that replaced it) moving fd 1 alone would leave those lines on stdout.
    with stdout_to_stderr():
        print("Collecting tensor data and making histogram ...")
    print("summary")
    out, err = capsys.readouterr()
    assert out == "summary\n" and err == "Collecting tensor data and making histogram ...\n"
