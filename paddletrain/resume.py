"""What a run resumes from: a paddletrain checkpoint (checked against this run) or a legacy pickle."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Dict, Optional

import paddle

from paddletrain.errors import UserError

log = logging.getLogger("paddletrain")


def load_resume_checkpoint(resume: Optional[str], run_dir: Path, run_info: Dict[str, Any]) -> Optional[Any]:
    """The checkpoint to resume from: ``None``, ``auto`` (newest complete one in the run dir) or a directory.

    ``auto`` finds the newest checkpoint that fully verifies, whatever state a crash left (see
    :func:`~paddletrain.checkpoint.find_latest`). A different model or number of classes is an error; a
    different batch or world size is a warning.
    """
    from paddletrain.checkpoint import find_latest, load_checkpoint
    from paddletrain.checkpoint.untrusted import StateValueError, check_inside, show

    if resume is None:
        return None
    path: Optional[Path] = Path(resume)
    if resume == "auto":
        checkpoints = run_dir / "checkpoints"
        try:
            check_inside(checkpoints, run_dir, "checkpoint directory")
        except StateValueError as error:
            raise UserError(f"trainer.resume=auto: {error}") from error
        path = find_latest(checkpoints, log=log)
        if path is None:
            log.info("trainer.resume=auto: no complete checkpoint in %s, starting fresh", checkpoints)
            return None
    elif not path.is_dir():
        raise UserError(f"trainer.resume={resume}: no such checkpoint directory")
    checkpoint = load_checkpoint(path)
    saved = checkpoint.state.get("run", {}) if isinstance(checkpoint.state, dict) else None
    if not isinstance(saved, dict):
        raise UserError(f"cannot resume from {path}: its state has no run record ('run' is {show(saved)})")
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
    return checkpoint


def is_legacy_checkpoint(path: Path) -> bool:
    """A pickled PaddleClas-style checkpoint (``.pdparams``/``.pdopt``) rather than a paddletrain one."""
    from paddletrain.checkpoint.legacy import LEGACY_SUFFIXES

    if path.is_file():
        return path.suffix in LEGACY_SUFFIXES
    return (path.is_dir() and not (path / "manifest.json").exists()
            and any(p.suffix in LEGACY_SUFFIXES for p in path.iterdir()))


def warm_start_from_legacy(path: Path, model: paddle.nn.Layer, optimizer: Any, trust_pickle: bool) -> None:
    """Start from a legacy pickled checkpoint's weights (and optimizer state from a ``.pdopt``).

    Unpickling runs code from the file, so this needs ``trainer.trust_pickle=true``. A legacy file
    records no epoch, RNG or sampler state: training starts at epoch 0 with these weights.
    """
    from paddletrain.checkpoint import load_legacy
    from paddletrain.checkpoint.untrusted import StateValueError
    from paddletrain.state_checks import check_optimizer_state, check_state_matches

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
