"""paddletrain.cli: every command ends the same way for the same mistake (one line, the documented exit code)."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hydra import compose, initialize_config_module
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict
from PIL import Image

from paddletrain.cli import command_task, ending_of, run_command, run_script
from paddletrain.errors import ExitCode, NonFiniteLossError, RankLostError, StartRefused, TrainingInterrupted, UserError
from paddletrain.job.processes import stop_request
from paddletrain.validation import RunDirGuard
from tests.conftest import EXPORT_SIZE, run_module

# One mistake of each kind per command: (arguments, what the one line must say).
MISTAKES = {
    "fit": {
        "misspelt key": (["data.batch_sise=4"], "unknown config key data.batch_sise (neither a data key nor an "
                                                "option of data.name=shapes, which takes none; did you mean "
                                                "data.batch_size"),
        "wrong type": (["trainer.max_epochs=abc"], "trainer.max_epochs: Value 'abc' of type 'str' could not be "
                                                  "converted to Integer"),
        "bad choice": (["data.sampler=weighted"], "data.sampler='weighted' is not allowed; choose one of: random, "
                                                  "class_balanced"),
        "unquoted braces": (["data=shards", "data.urls=/d/train-{000000..000003}.tar"],
                            "quote a value with braces (a brace pattern of shards, say) inside the override: "
                            "\"data.urls='/d/train-{000000..000003}.tar'\""),
    },
    "evaluate": {
        "misspelt key": (["batch_sise=4"], "unknown config key batch_sise (not in the schema; did you mean "
                                           "data.batch_size"),
        "wrong type": (["data.batch_size=abc"], "data.batch_size: Value 'abc' of type 'str' could not be converted "
                                                "to Integer"),
        "bad choice": (["tta.crops=3"], "tta.crops=3 is not allowed; choose one of: 1, 5"),
    },
    "export": {
        "misspelt key": (["formt=onnx"], "unknown config key formt (not in the schema; did you mean format?)"),
        "wrong type": (["num_check_images=abc"], "num_check_images: Value 'abc' of type 'str' could not be "
                                                 "converted to Integer"),
        "bad choice": (["format=xyz"], "format='xyz' is not allowed; choose one of: paddle, onnx"),
    },
    "predict": {
        "misspelt key": (["top_k=3"], "unknown config key top_k (not in the schema; did you mean topk?)"),
        "wrong type": (["topk=abc"], "topk: Value 'abc' of type 'str' could not be converted to Integer"),
        "bad choice": (["backend=xyz"], "backend='xyz' is not allowed; choose one of: "),
    },
    "ship": {
        "misspelt key": (["tolerence=2"], "unknown config key tolerence (not in the schema; did you mean tolerance?)"),
        "wrong type": (["batch_size=abc"], "batch_size: Value 'abc' of type 'str' could not be converted to Integer"),
        "bad choice": (["device=tpu"], "device='tpu' is not allowed; choose one of: "),
    },
}
CASES = [(command, kind) for command, kinds in MISTAKES.items() for kind in kinds]


@pytest.mark.parametrize("command, kind", CASES, ids=[f"{c}-{k.replace(' ', '_')}" for c, k in CASES])
def test_every_command_ends_a_mistake_with_one_line_and_the_user_error_code(command, kind, tmp_path):
    args, expected = MISTAKES[command][kind]
    result = run_module(f"paddletrain.{command}", [*args, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                        timeout=120)
    output = (result.stdout + result.stderr).strip().splitlines()
    assert result.returncode == ExitCode.USER_ERROR, output
    assert len(output) == 1 and expected in output[0], output  # no Hydra dump, no traceback
    assert output[0].split(" - ", 1)[0].endswith("[paddletrain][ERROR]")


# A mistake each command finds only inside its task (a path that is not there), and the argparse commands' own.
TASK_MISTAKES = {
    "fit": (["data=imagefolder", "data.root=missing"], "missing"),
    "evaluate": (["checkpoint=missing"], "missing"),
    "export": (["checkpoint=missing"], "missing"),
    "predict": (["model_dir=missing", "input=photos"], "photos"),
    "ship": (["checkpoint=missing"], "missing"),
    "data": (["check", "missing"], "missing"),
    "bench": (["train", "batch_size=0"], "batch_size"),
}


@pytest.mark.parametrize("command", TASK_MISTAKES)
def test_every_commands_user_error_ends_with_the_same_line_format_and_code(command, tmp_path):
    """Hydra commands end through command_task, the argparse ones through run_script: one ending, one format."""
    args, named = TASK_MISTAKES[command]
    hydra = [f"hydra.run.dir={tmp_path / 'run'}"] if command not in ("data", "bench") else []
    result = run_module(f"paddletrain.{command}", [*args, *hydra], cwd=tmp_path, timeout=120)
    output = result.stdout + result.stderr
    last = output.strip().splitlines()[-1]
    assert result.returncode == ExitCode.USER_ERROR and "Traceback" not in output, output[-2000:]
    prefix, _, message = last.partition(" - ")
    assert prefix.endswith("[paddletrain][ERROR]") and named in message, last


@pytest.mark.parametrize("exc, code, line", [
    (UserError("data.root=/x does not exist"), ExitCode.USER_ERROR, "data.root=/x does not exist"),
    (StartRefused(UserError("run directory r is in use")), ExitCode.USER_ERROR, "run directory r is in use"),
    (KeyboardInterrupt(), ExitCode.INTERRUPTED_SIGINT, "Stopped by SIGINT"),
    (TrainingInterrupted(signal.SIGTERM), ExitCode.INTERRUPTED_SIGTERM, "Stopped by SIGTERM"),
    (NonFiniteLossError("loss is nan"), ExitCode.BAD_RESULT, "loss is nan"),
    (RankLostError([1], "gloo"), ExitCode.RANK_LOST, "lost contact with rank 1"),
    (RuntimeError("boom"), ExitCode.UNEXPECTED, "unexpected RuntimeError: boom"),
])
def test_each_ending_has_its_documented_code_and_one_line(exc, code, line):
    got_code, got_line = ending_of(exc)
    assert got_code == code and line in got_line and "\n" not in got_line


@pytest.mark.parametrize("exc, code", [(UserError("bad value"), ExitCode.USER_ERROR),
                                       (KeyboardInterrupt(), ExitCode.INTERRUPTED_SIGINT),
                                       (TrainingInterrupted(signal.SIGTERM), ExitCode.INTERRUPTED_SIGTERM),
                                       (ZeroDivisionError("x"), ExitCode.UNEXPECTED)])
def test_a_task_that_raises_exits_with_its_code_and_logs_one_line(exc, code, caplog):
    @command_task()
    def task(cfg):
        raise exc

    with caplog.at_level(logging.INFO, logger="paddletrain"), pytest.raises(SystemExit) as info:
        task(None)
    assert info.value.code == code
    lines = [r for r in caplog.records if r.name == "paddletrain"]
    # One line, except that an unexpected error also logs its traceback first.
    assert [r.exc_info is not None for r in lines] == ([True, False] if code == ExitCode.UNEXPECTED else [False])
    assert lines[-1].levelno == (logging.WARNING if code >= 128 else logging.ERROR)


@pytest.fixture
def in_process_command(monkeypatch, own_signals_restored):
    """run_command in this process: what it sets for a command's life (HYDRA_FULL_ERROR, its state, the stop
    signal handlers) is put back afterwards, so later tests of this worker (e.g. the documents' commands, which
    inherit the environment: seen as a one-line error printed as Hydra's traceback) see none of it."""
    from paddletrain import cli

    monkeypatch.setenv("HYDRA_FULL_ERROR", "0")  # recorded as unset, restored so
    monkeypatch.setattr(cli, "_state", cli._CommandState())


def test_a_task_that_finishes_ends_the_command_with_ok(in_process_command):
    with pytest.raises(SystemExit) as info:
        run_command(lambda: None)
    assert info.value.code == ExitCode.OK


def test_a_refused_start_is_mapped_by_the_wrapper(in_process_command, capsys):
    def refusing_main():
        raise StartRefused(UserError("trainer.devices=0 must be >= 1"))

    with pytest.raises(SystemExit) as info:
        run_command(refusing_main)
    assert info.value.code == ExitCode.USER_ERROR
    assert capsys.readouterr().err.splitlines() == ["[paddletrain][ERROR] - trainer.devices=0 must be >= 1"]


def test_the_run_dir_guard_raises_instead_of_exiting(tmp_path):
    """Hydra turns an Exception from a callback into a warning; the guard's refusal must get through it."""
    try:
        _guard_refuses(tmp_path)
    finally:  # the guard set Hydra's global config for the run it checked
        HydraConfig.instance().cfg = None


def _guard_refuses(tmp_path):
    with initialize_config_module("paddletrain.conf", version_base="1.3"):
        config = compose("fit", overrides=["trainer.devices=0", f"hydra.run.dir={tmp_path / 'run'}"],
                         return_hydra_config=True)
    with open_dict(config):
        config.hydra.runtime.output_dir = str(tmp_path / "run")
    with pytest.raises(StartRefused) as info:
        RunDirGuard().on_run_start(config)
    assert isinstance(info.value.error, UserError) and "trainer.devices=0 must be >= 1" in str(info.value)
    assert not (tmp_path / "run").exists()


@pytest.fixture
def own_signals_restored():
    """run_script installs paddletrain's SIGTERM/SIGINT handler in this process: give the signals back after."""
    yield
    stop_request.uninstall()
    stop_request.reset()


def _sigterm_then_wait() -> int:
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # interrupted long before
    return ExitCode.OK


@pytest.mark.parametrize("main, code, line", [
    (lambda: ExitCode.BAD_RESULT, ExitCode.BAD_RESULT, None),
    (lambda: None, ExitCode.OK, None),
    (lambda: (_ for _ in ()).throw(UserError("--min-size must not be negative")), ExitCode.USER_ERROR,
     "[paddletrain][ERROR] - --min-size must not be negative"),
    (_sigterm_then_wait, ExitCode.INTERRUPTED_SIGTERM, "[paddletrain][ERROR] - Stopped by SIGTERM"),
])
def test_commands_without_hydra_end_the_same_way(main, code, line, capsys, own_signals_restored):
    started = time.monotonic()
    with pytest.raises(SystemExit) as info:
        run_script(main)
    assert info.value.code == code and time.monotonic() - started < 4
    err = capsys.readouterr().err.splitlines()
    assert err == ([line] if line else [])


def test_an_unexpected_error_in_a_command_without_hydra_shows_its_traceback_then_one_line(capsys,
                                                                                           own_signals_restored):
    def broken():
        raise ZeroDivisionError("division by zero")

    with pytest.raises(SystemExit) as info:
        run_script(broken)
    err = capsys.readouterr().err.splitlines()
    assert info.value.code == ExitCode.UNEXPECTED and err[0].startswith("Traceback")
    assert err[-1] == "[paddletrain][ERROR] - unexpected ZeroDivisionError: division by zero (traceback above and in " \
                      "the log)"


def test_sigterm_stops_a_command_with_one_line_and_143(export_dir, tmp_path):
    """A real signal to `predict` while it predicts (Paddle loads late there and takes SIGTERM over)."""
    photos = tmp_path / "photos"
    photos.mkdir()
    pixels = np.random.RandomState(0).randint(0, 255, (EXPORT_SIZE, EXPORT_SIZE, 3), dtype=np.uint8)
    for i in range(3000):  # at one image a batch, seconds of work: the signal lands mid-prediction
        Image.fromarray(np.roll(pixels, i)).save(photos / f"{i}.png")
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "HYDRA_FULL_ERROR": "0"}
    proc = subprocess.Popen([sys.executable, "-m", "paddletrain.predict", f"model_dir={export_dir}",
                             f"input={photos}", "batch_size=1", "num_workers=0", "progress_bar=false",
                             f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    lines = []
    for line in proc.stderr:  # the predictor is loaded once this line is logged
        lines.append(line.rstrip())
        if "input files" in line:
            proc.send_signal(signal.SIGTERM)
            break
    lines.extend(line.rstrip() for line in proc.stderr)
    assert proc.wait(timeout=60) == ExitCode.INTERRUPTED_SIGTERM, lines
    assert lines[-1].endswith("[paddletrain][WARNING] - Stopped by SIGTERM"), lines
    assert not any("Traceback" in line or "Aborted" in line for line in lines), lines


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_inside_a_config_access_keeps_its_exit_code(signum, monkeypatch):
    """OmegaConf re-raises an exception from inside a key access as type(exc)(message): a signal handler's
    TrainingInterrupted that lands there (found by the SIGTERM test above, under load) must still end the command
    as that signal, not as a ValueError."""
    from omegaconf import DictConfig, OmegaConf

    cfg = OmegaConf.create({"batch_size": 4})
    get_node = DictConfig._get_node
    calls = []

    def signal_lands_in_the_first_lookup(self, *args, **kwargs):
        calls.append(args)
        if len(calls) == 1:
            raise TrainingInterrupted(signum)
        return get_node(self, *args, **kwargs)

    monkeypatch.setattr(DictConfig, "_get_node", signal_lands_in_the_first_lookup)
    with pytest.raises(TrainingInterrupted) as caught:
        cfg.batch_size  # noqa: B018  (the access is the point)
    assert caught.value.signum == signum and caught.value.exit_code == ExitCode.interrupted(signum)


def test_a_stop_request_that_lands_in_logging_ends_the_interruptible_block_not_the_log_call(capsys):
    """A signal that lands while a log record is written must not raise there (logging would print it as a
    logging error and carry on: seen as predict finishing with exit 0 after SIGTERM); the block's end raises."""
    import logging as std_logging
    import sys as std_sys

    from paddletrain.job.processes import StopRequest

    request = StopRequest()
    request.announce = False

    class SignalWhileWriting(std_logging.Handler):
        def emit(self, record):
            request._handle(signal.SIGTERM, std_sys._getframe())  # the frame a real signal would interrupt

    logger = std_logging.getLogger("paddletrain.test.signal_in_logging")
    logger.addHandler(SignalWhileWriting())
    logger.propagate = False
    reached_the_end_of_the_block = False
    with pytest.raises(TrainingInterrupted) as caught:
        with request.interruptible():
            logger.warning("a record")
            reached_the_end_of_the_block = True
    assert reached_the_end_of_the_block and caught.value.signum == signal.SIGTERM
    assert "Logging error" not in capsys.readouterr().err


def test_a_signal_that_lands_in_logging_is_announced_by_the_next_check_not_inside_the_record():
    """Announcing the signal from inside a record being written would re-enter the stream (CI saw predict print a
    'reentrant call' logging error with its traceback after SIGTERM): the handler stays silent there, and the next
    check of the request (the trainer's, every step) says it, once (CI saw a SIGTERM stop with no "received" line)."""
    import logging as std_logging
    import sys as std_sys

    from paddletrain.job.processes import StopRequest

    request = StopRequest()
    request.announce = True
    records = []

    class SignalWhileWriting(std_logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())
            if len(records) == 1:
                request._handle(signal.SIGTERM, std_sys._getframe())

    logger = std_logging.getLogger("paddletrain")  # where the handler would announce the signal
    handler = SignalWhileWriting()
    logger.addHandler(handler)
    try:
        with request.deferred("stopping at the next step"):
            std_logging.getLogger("paddletrain.test.signal_in_logging_2").warning("a record")
            assert request.signum == signal.SIGTERM and records == ["a record"]
            request.say_unsaid()  # the next check
            request.say_unsaid()
    finally:
        logger.removeHandler(handler)
    assert records == ["a record", "SIGTERM received: stopping at the next step (send it again to stop at once)"]
