"""The one way out of every command line, and the command that continues a run.

:func:`run_command` runs a command's Hydra ``main`` and :func:`command_task` wraps its task function (the model is
lightning-hydra-template's ``task_wrapper``): whatever ends the command, a command line Hydra rejects (misspelt key,
wrong type, missing preset), a :class:`~paddletrain.errors.UserError`, SIGINT/SIGTERM or an unexpected exception,
ends it with one :class:`~paddletrain.errors.ExitCode` and one line (:func:`ending_of`). ``fit``, ``evaluate``,
``export`` and ``predict`` run in it; ``python -m paddletrain.data`` and ``bench``, which do not use Hydra, run in
:func:`run_script`, with the same mapping.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
import logging
import os
import shlex
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

from paddletrain.config import check_values
from paddletrain.devices import mkl_note, use_fast_mkl
from paddletrain.errors import ExitCode, StartRefused, UserError, ending_of, exit_with
from paddletrain.job.processes import join_pools, own_stop_signals, stop_request

log = logging.getLogger(__name__)

# Keys a continuing command sets itself; the run's own values of them are dropped.
_CONTINUE_KEYS = ("trainer.resume", "hydra.run.dir")
# Hydra's options that pick the config (not overrides, so not in overrides.yaml): repeated as given.
_CONFIG_FLAGS = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn")
MAX_OVERRIDES_BYTES = 1 << 20
# A rank is started from fit.py's file path, not with -m.
FIT_MODULE_FILE = Path(__file__).resolve().with_name("fit.py")


def checked_output_command(cfg: DictConfig, schema: type, command: str) -> str:
    """The checks every command that turns ``checkpoint`` into files in ``out_dir`` (export, ship) starts with,
    cheapest first: every value given, a checkpoint named; returns the output directory (``out_dir``, else
    ``outputs/<command>/<time>``), where the command's log goes too (:func:`log_beside`)."""
    check_values(cfg, schema)
    if OmegaConf.is_missing(cfg, "checkpoint"):
        raise UserError("missing required value for checkpoint (e.g. checkpoint=outputs/<name>/<time>:best)")
    out_dir = str(cfg.out_dir or Path("outputs", command, time.strftime("%Y-%m-%d_%H-%M-%S")))
    log_beside(Path(out_dir), command)
    return out_dir


class _LogBeside(logging.FileHandler):
    """A log file in an output directory, opened once the command has created that directory: a command refused
    before any work leaves no directory behind (its lines are on the console either way)."""

    def emit(self, record: logging.LogRecord) -> None:
        if self.stream is None and not Path(self.baseFilename).parent.is_dir():
            return
        super().emit(record)


def log_beside(out_dir: Path, command: str) -> Path:
    """Log this command into ``<out_dir>/<command>.log`` too, beside what it writes (the commands that read a run
    back write nothing of their own into the working directory: conf/hydra/job_logging/console.yaml)."""
    path = out_dir / f"{command}.log"
    handler = _LogBeside(path, encoding="utf-8", delay=True)
    console = next((h for h in logging.getLogger().handlers if h.formatter is not None), None)
    handler.setFormatter(console.formatter if console is not None else logging.Formatter("%(message)s"))
    logging.getLogger().addHandler(handler)
    return path


def continue_command(run_dir: Path, argv: list[str] | None = None) -> str:
    """The shell command that continues the run in ``run_dir`` with the same config.

    It is this program with its config options, the run's overrides as Hydra recorded them in
    ``<run dir>/.hydra/overrides.yaml`` (this process's own when that file is missing), without any
    ``trainer.resume``/``hydra.run.dir``, plus ``trainer.resume=auto hydra.run.dir=<run dir>``; every word
    shell-quoted.
    """
    argv = list(sys.argv if argv is None else argv)
    overrides = [o for o in run_overrides(run_dir) if override_key(o) not in _CONTINUE_KEYS]
    words = [*_program(argv), *_config_flags(argv[1:]), *overrides, "trainer.resume=auto",
             f"hydra.run.dir={run_dir}"]
    return " ".join(shlex.quote(word) for word in words)


def override_key(override: str) -> str:
    """``optim.lr`` of ``optim.lr=0.1``, ``+x.y=1``, ``++x.y=1`` or ``~x.y``."""
    return override.lstrip("+~").split("=", 1)[0].strip()


def run_overrides(run_dir: Path) -> list[str]:
    """The overrides of the run in ``run_dir``: ``.hydra/overrides.yaml`` (a list of strings, read within a size
    bound), else this process's Hydra overrides, else none."""
    path = Path(run_dir) / ".hydra" / "overrides.yaml"
    try:
        if path.is_file() and path.stat().st_size <= MAX_OVERRIDES_BYTES:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
            if isinstance(loaded, list) and all(isinstance(o, str) for o in loaded):
                return loaded
            log.debug("%s is not a list of overrides; using this process's", path)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        log.debug("cannot read %s: %s", path, error)
    if HydraConfig.initialized():
        return list(HydraConfig.get().overrides.task)
    return []


def _program(argv: list[str]) -> list[str]:
    """``python -m <module>`` for a module run with ``-m`` or a rank started from this file, else the script."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        return ["python", "-m", spec.name[: -len(".__main__")] if spec.name.endswith(".__main__") else spec.name]
    if not argv or Path(argv[0]).resolve() == FIT_MODULE_FILE:
        return ["python", "-m", "paddletrain.fit"]
    return ["python", argv[0]]


def this_command(argv: list[str] | None = None) -> list[str]:
    """This process's program and config options (``--config-dir`` ...) as words that start it again with this
    interpreter, without its overrides: e.g. ``[sys.executable, "-m", "paddletrain.fit", "--config-dir", "c"]``."""
    argv = list(sys.argv if argv is None else argv)
    return [sys.executable, *_program(argv)[1:], *_config_flags(argv[1:])]


def _config_flags(args: list[str]) -> list[str]:
    """Hydra's config-selecting options among ``args``, with their values (``-cd dir`` or ``--config-dir=dir``)."""
    flags: list[str] = []
    for i, arg in enumerate(args):
        name = arg.split("=", 1)[0]
        if name in _CONFIG_FLAGS:
            flags.append(arg)
            if "=" not in arg and i + 1 < len(args):
                flags.append(args[i + 1])
    return flags


def hydra_error_line(exc: BaseException) -> str:
    """One line for a command line Hydra rejected: the key or preset, what is wrong and, when a name is close,
    what was probably meant (Hydra's own report spans 6-7 lines)."""
    cause = exc.__cause__
    if isinstance(exc, OverrideParseException) and "=" in exc.override and "{" in exc.override.split("=", 1)[1]:
        key, value = exc.override.split("=", 1)
        return (f"{exc.override}: Hydra reads '{{' as the start of a mapping; quote a value with braces (a brace "
                f"pattern of shards, say) inside the override: \"{key}='{value}'\"")
    if isinstance(exc, MissingConfigException) and exc.options:
        wanted = (exc.missing_cfg_file or "").rsplit("/", 1)[-1]
        presets = [o for o in exc.options if not o.endswith("_schema")]  # schemas are not presets to pick
        close = difflib.get_close_matches(wanted, presets, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"available: {', '.join(presets)}"
        return f"{str(exc).splitlines()[0]}; {hint}"
    if isinstance(cause, OmegaConfBaseException) and cause.full_key:
        key = cause.full_key
        if isinstance(cause, (ConfigKeyError, ConfigAttributeError)):
            parent, _, name = key.rpartition(".")
            schema = cause.object_type
            if schema is dict:  # an open mapping (e.g. trainer.distill.teacher_options): any key, but only with +
                return f"{parent} takes any key, but a new one needs a leading +: +{key}=<value>"
            fields = [f.name for f in dataclasses.fields(schema)] if dataclasses.is_dataclass(schema) else []
            close = [f"{parent}.{c}" if parent else c for c in difflib.get_close_matches(name, fields, n=3)]
            close = close or _close_keys_anywhere(name, cause)
            hint = f"did you mean {', '.join(close)}?" if close else "check the spelling"
            return f"unknown config key {key} (not in the schema; {hint})"
        return f"{key}: {str(cause.msg).splitlines()[0]}"
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())


def _close_keys_anywhere(name: str, cause: OmegaConfBaseException) -> list[str]:
    """Keys anywhere in the rejected config whose last part is close to ``name`` (``batch_sise`` given at the top
    of evaluate's config means ``data.batch_size``)."""
    parent = getattr(cause, "parent_node", None)
    if not isinstance(parent, DictConfig):
        return []
    by_leaf: dict[str, list[str]] = {}
    for key in _dotted_keys(parent._get_root()):
        if key.startswith("hydra."):  # Hydra's own settings are not what a misspelt task key meant
            continue
        by_leaf.setdefault(key.rpartition(".")[2], []).append(key)
    return [key for leaf in difflib.get_close_matches(name, list(by_leaf), n=3) for key in by_leaf[leaf]][:3]


def _dotted_keys(node: DictConfig, prefix: str = "") -> list[str]:
    keys = []
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            keys.extend(_dotted_keys(child, f"{prefix}{key}."))
        else:
            keys.append(f"{prefix}{key}")
    return keys


# ------------------------------------------------------------------------------------- one way out of a command
# The one line of a command that ends before Hydra set up logging looks like the log's.
_LINE_PREFIX = "[paddletrain][ERROR] - "
# Commands log under "paddletrain", the logger their Hydra job logging configures.
command_log = logging.getLogger("paddletrain")


@dataclasses.dataclass
class _CommandState:
    # Whether Hydra got as far as calling the task function: an exit status 1 before that is Hydra rejecting the
    # command line (it printed why).
    task_started: bool = False
    # Whether this process set HYDRA_FULL_ERROR to get Hydra's rejection as an exception (the task unsets it, so
    # that processes the task starts, e.g. the ranks of fit, do not inherit it).
    set_full_error: bool = False


_state = _CommandState()


def end_command(exc: BaseException, cfg: DictConfig | None = None) -> NoReturn:
    """The default ending of a command's task: :func:`ending_of`, with the traceback logged when unexpected."""
    code, message = ending_of(exc)
    if code == ExitCode.UNEXPECTED:
        command_log.error("Unexpected error", exc_info=exc)
    exit_with(code, message)


Ending = Callable[[BaseException, DictConfig], NoReturn]


def command_task(end: Ending = end_command) -> Callable[[Callable[[DictConfig], Any]], Callable[[DictConfig], Any]]:
    """Decorate a Hydra task function (under ``@hydra.main``) so that every exception that ends it is mapped by
    ``end`` to one line and an exit code; a stop request interrupts it at once unless the task says otherwise
    (``fit`` defers it while training)."""

    def decorate(task: Callable[[DictConfig], Any]) -> Callable[[DictConfig], Any]:
        @functools.wraps(task)
        def wrapped(cfg: DictConfig) -> Any:
            _state.task_started = True
            if _state.set_full_error:
                os.environ.pop("HYDRA_FULL_ERROR", None)
            note = mkl_note()  # the log is set up now: say once what run_command set before Paddle's kernels
            if note:
                log.info("%s", note)
            try:
                with stop_request.interruptible():
                    return task(cfg)
            except (Exception, KeyboardInterrupt) as exc:
                end(exc, cfg)
            finally:
                join_pools()  # decode workers left to exit on their own: before the interpreter shuts down

        return wrapped

    return decorate


def run_command(main: Callable[[], Any]) -> NoReturn:
    """Run a command line's Hydra ``main`` (its task decorated with :func:`command_task`) and exit.

    A command line Hydra rejects (unknown key, wrong type, missing preset, bad syntax) and a refusal before the
    run directory exists (:class:`~paddletrain.errors.StartRefused`) are one line and
    :attr:`ExitCode.USER_ERROR`; ``HYDRA_FULL_ERROR=1`` in the environment keeps Hydra's own report.
    SIGTERM/SIGINT are handled from here on (:data:`paddletrain.job.processes.stop_request`).
    """
    use_fast_mkl()  # before any Paddle kernel runs (paddletrain.devices)
    if os.environ.get("HYDRA_FULL_ERROR") != "1":
        # Hydra then raises its rejection instead of printing it over several lines.
        os.environ["HYDRA_FULL_ERROR"] = "1"
        _state.set_full_error = True
    own_stop_signals()
    try:
        main()
    except SystemExit as exc:
        # Hydra exits 1 after printing why it rejected an override; everything a task ends with has its own code.
        if exc.code == 1 and not _state.task_started:
            sys.exit(ExitCode.USER_ERROR)
        raise
    except StartRefused as exc:  # a Hydra callback refused to start: logging is not set up yet
        _say(str(exc.error))
        sys.exit(ExitCode.USER_ERROR)
    except (HydraException, OmegaConfBaseException) as exc:
        if _state.task_started or not _state.set_full_error:
            raise
        _say(hydra_error_line(exc))
        sys.exit(ExitCode.USER_ERROR)
    except (Exception, KeyboardInterrupt) as exc:  # outside the task: while Hydra starts, or between sweep jobs
        _end_unlogged(exc)
    sys.exit(ExitCode.OK)


def run_script(main: Callable[[], int | None]) -> NoReturn:
    """The way out of a command line without Hydra (``python -m paddletrain.data``, ``bench``): ``main()`` returns
    its exit code (or exits itself); whatever it raises ends the command as a Hydra command's would
    (:func:`ending_of`: one line on stderr, after the traceback when unexpected). SIGTERM/SIGINT interrupt it at
    once. MKL's code path is set first (:func:`paddletrain.devices.use_fast_mkl`), and said on stderr."""
    use_fast_mkl()
    note = mkl_note()
    if note:
        print(note, file=sys.stderr, flush=True)
    own_stop_signals()
    try:
        with stop_request.interruptible():
            code = main()
    except (Exception, KeyboardInterrupt) as exc:
        _end_unlogged(exc)
    finally:
        join_pools()
    sys.exit(ExitCode.OK if code is None else code)


def _end_unlogged(exc: BaseException) -> NoReturn:
    """:func:`ending_of` where no log is set up: the traceback (when unexpected), then the line, on stderr."""
    code, message = ending_of(exc)
    if code == ExitCode.UNEXPECTED:
        traceback.print_exception(exc)
    _say(message)
    sys.exit(code)


def _say(line: str) -> None:
    print(f"{_LINE_PREFIX}{line}", file=sys.stderr, flush=True)
