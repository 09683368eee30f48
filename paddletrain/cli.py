"""Command-line facts shared by the entry points: the command that continues a run, and Hydra's rejection of a
command line in one line."""
from __future__ import annotations

import dataclasses
import difflib
import logging
import shlex
import sys
from pathlib import Path

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.errors import MissingConfigException
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException

log = logging.getLogger(__name__)

# Keys a continuing command sets itself; the run's own values of them are dropped.
_CONTINUE_KEYS = ("trainer.resume", "hydra.run.dir")
# Hydra's options that pick the config (not overrides, so not in overrides.yaml): repeated as given.
_CONFIG_FLAGS = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn")
MAX_OVERRIDES_BYTES = 1 << 20
# A rank is started from fit.py's file path, not with -m.
FIT_MODULE_FILE = Path(__file__).resolve().with_name("fit.py")


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
            hint = f"did you mean {', '.join(close)}?" if close else "check the spelling"
            return f"unknown config key {key} (not in the schema; {hint})"
        return f"{key}: {str(cause.msg).splitlines()[0]}"
    return " ".join(line.strip() for line in str(exc).splitlines() if line.strip())
