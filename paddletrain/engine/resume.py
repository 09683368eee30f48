"""What a run resumes from: a paddletrain checkpoint (checked against this run) or a legacy pickle."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import paddle

from paddletrain.checkpoint import find_latest, load_checkpoint, load_legacy
from paddletrain.checkpoint.discovery import find_checkpoints
from paddletrain.checkpoint.legacy import LEGACY_SUFFIXES
from paddletrain.checkpoint.untrusted import StateValueError, check_inside, show
from paddletrain.engine.state_checks import check_optimizer_state, check_state_matches
from paddletrain.errors import UserError

log = logging.getLogger("paddletrain")


# Keys a resumed run may change without changing what it trains, so a difference in them is not reported: how
# to resume and what to trust, where and how fast the process runs, how it restarts and times out, where the
# data lives, the pretrained weights (the checkpoint's replace them), what is shown and logged, and the batch and
# world size (the run record's own warning names those).
RESUME_IGNORED = (
    "trainer.resume", "trainer.trust_pickle", "model.trust_pickle",
    "trainer.device", "trainer.cpu_threads", "trainer.node_rank", "trainer.master",
    "data.num_workers", "data.use_shared_memory", "data.persistent_workers",
    "data.root", "data.download", "model.pretrained",
    "callbacks.progress_bar", "callbacks.visualdl", "callbacks.lr_monitor", "callbacks.profiler", "name", "tags",
    "data.batch_size", "trainer.devices", "trainer.num_nodes",
    "trainer.max_restarts", "trainer.collective_timeout",
)
# A resumed run's warning names at most this many keys (then "and N more").
MAX_KEYS_SHOWN = 8


def config_differences(saved: Any, current: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """``(key, checkpoint's value, this run's value)`` for every dotted key outside :data:`RESUME_IGNORED` whose
    value differs between the config saved in a checkpoint and this run's resolved config (a key only one of
    them has counts, with ``None`` for the other)."""
    if not isinstance(saved, dict):
        return []
    old, new = _flatten(saved), _flatten(current)
    return [(key, old.get(key), new.get(key)) for key in sorted(set(old) | set(new))
            if old.get(key) != new.get(key) and not _ignored(key)]


def _ignored(key: str) -> bool:
    return any(key == prefix or key.startswith(prefix + ".") for prefix in RESUME_IGNORED)


def _flatten(node: Any, prefix: str = "", depth: int = 0) -> dict[str, Any]:
    # Bounded depth: the saved config comes from a file someone may have crafted.
    if isinstance(node, dict) and node and depth < 16:
        flat: dict[str, Any] = {}
        for key, value in node.items():
            flat.update(_flatten(value, f"{prefix}{key}.", depth + 1))
        return flat
    return {prefix[:-1]: node} if prefix else {}


def warn_config_differences(path: Path, saved: Any, current: dict[str, Any]) -> None:
    """One warning line naming the keys whose values differ from the checkpoint's (see :func:`config_differences`)."""
    differences = config_differences(saved, current)
    if not differences:
        return
    shown = [f"{key}={show(new)} (checkpoint: {show(old)})" for key, old, new in differences[:MAX_KEYS_SHOWN]]
    more = len(differences) - MAX_KEYS_SHOWN
    log.warning("Resuming from %s with a config that differs from the one it was trained with: %s%s", path,
                ", ".join(shown), f" and {more} more" if more > 0 else "")


def load_resume_checkpoint(resume: str | None, run_dir: Path, run_info: dict[str, Any],
                           config: dict[str, Any] | None = None) -> Any | None:
    """The checkpoint to resume from: ``None``, ``auto`` (newest complete one in the run dir) or a directory.

    ``auto`` finds the newest checkpoint that fully verifies, whatever state a crash left (see
    :func:`~paddletrain.checkpoint.find_latest`). A different model or number of classes is an error; a
    different batch or world size is a warning, and so is any other key of ``config`` (this run's resolved
    config) that differs from the checkpoint's saved one (:func:`config_differences`).
    """
    path = _resume_path(resume, run_dir)
    if path is None:
        return None
    checkpoint = load_checkpoint(path)
    saved = checkpoint.state.get("run", {}) if isinstance(checkpoint.state, dict) else None
    if not isinstance(saved, dict):
        raise UserError(f"cannot resume from {path}: its state has no run record ('run' is {show(saved)})")
    _check_run_record(path, saved, run_info)
    if config is not None:
        warn_config_differences(path, checkpoint.state.get("config"), config)
    return checkpoint


def refuse_replacing_a_run(resume: str | None, run_dir: Path) -> None:
    """A run directory that already holds a run (a checkpoint or ``summary.json``) is continued
    (``trainer.resume=auto``) or left alone: training from scratch into it would replace its checkpoints,
    ``best.json`` and ``history.json``. Raises a :class:`UserError` naming both ways on."""
    if resume is not None:
        return
    held = find_checkpoints(run_dir / "checkpoints") if (run_dir / "checkpoints").is_dir() else []
    if held or (run_dir / "summary.json").is_file():
        what = (f"{len(held)} checkpoint(s), the newest {held[-1].path.name}" if held
                else "a finished run's summary.json")
        raise UserError(f"{run_dir} already holds a run ({what}): continue it with trainer.resume=auto, or train "
                        f"into a new directory (hydra.run.dir=<new dir>)")


def _resume_path(resume: str | None, run_dir: Path) -> Path | None:
    """The checkpoint directory ``trainer.resume`` names, or None to start fresh."""
    if resume is None:
        return None
    if resume != "auto":
        if not Path(resume).is_dir():
            raise UserError(f"trainer.resume={resume}: no such checkpoint directory")
        return Path(resume)
    checkpoints = run_dir / "checkpoints"
    try:
        check_inside(checkpoints, run_dir, "checkpoint directory")
    except StateValueError as error:
        raise UserError(f"trainer.resume=auto: {error}") from error
    path = find_latest(checkpoints, log=log)
    if path is None:
        log.info("trainer.resume=auto: no complete checkpoint in %s, starting fresh", checkpoints)
    return path


def _check_run_record(path: Path, saved: dict[str, Any], run_info: dict[str, Any]) -> None:
    """Refuse a checkpoint of another model or number of classes; warn on another batch or world size."""
    def shown(value: Any) -> str:  # the checkpoint's own value, as the user wrote it, within reason
        return str(value) if isinstance(value, (str, int)) and len(str(value)) <= 60 else show(value)

    for key in ("model", "num_classes"):
        if key in saved and saved[key] != run_info[key]:
            raise UserError(f"cannot resume from {path}: it was trained with {key}={shown(saved[key])}, "
                            f"this run has {key}={run_info[key]}")
    for key in ("batch_size", "world_size"):
        if key in saved and saved[key] != run_info[key]:
            log.warning("Resuming from %s with %s=%s; the checkpoint was written with %s=%s", path, key,
                        run_info[key], key, shown(saved[key]))


def is_legacy_checkpoint(path: Path) -> bool:
    """A pickled PaddleClas-style checkpoint (``.pdparams``/``.pdopt``) rather than a paddletrain one."""
    if path.is_file():
        return path.suffix in LEGACY_SUFFIXES
    return (path.is_dir() and not (path / "manifest.json").exists()
            and any(p.suffix in LEGACY_SUFFIXES for p in path.iterdir()))


def warm_start_from_legacy(path: Path, model: paddle.nn.Layer, optimizer: Any, trust_pickle: bool) -> None:
    """Start from a legacy pickled checkpoint's weights (and optimizer state from a ``.pdopt``).

    Unpickling runs code from the file, so this needs ``trainer.trust_pickle=true``. A legacy file
    records no epoch, RNG or sampler state: training starts at epoch 0 with these weights.
    """
    loaded = load_legacy(path, trust_pickle=trust_pickle)
    files = loaded if path.is_dir() else {path.name: loaded}
    weights = next((v for k, v in files.items() if k.endswith(".pdparams")), None)
    if weights is None:
        raise UserError(f"trainer.resume={path}: no .pdparams weights in the legacy checkpoint")
    check_state_matches(model, weights)
    model.set_state_dict(weights)
    opt_file = next((k for k in files if k.endswith(".pdopt")), None)
    opt_state = files[opt_file] if opt_file is not None else None
    if opt_state is not None:
        try:
            check_optimizer_state(optimizer, model, opt_state)
        except StateValueError as error:
            raise error.in_file(path / opt_file if path.is_dir() else path) from error
        optimizer.set_state_dict(opt_state)
    log.warning("Started from the legacy checkpoint %s (weights%s); it holds no epoch, RNG or data position, so "
                "training starts at epoch 0", path, " and optimizer state" if opt_state is not None else "")
