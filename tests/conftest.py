"""Shared fixtures: compose paddletrain's configs the way the CLI does, shrunk to run in seconds on a CPU."""
from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import paddle
import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf
from PIL import Image

import paddletrain.fit  # noqa: F401  (registers the schemas)
from paddletrain.config import DataConfig, factory_options
from paddletrain.data import build_datasets, preprocessing_info
from paddletrain.deploy.exporter import export_model
from paddletrain.devices import mkl_note, use_fast_mkl
from paddletrain.models import create_model
from tests import forked

# paddletrain's cache (folder scans, shards, the exports `predict checkpoint=` makes) in a folder of this session,
# never the user's ~/.cache; commands started by the tests inherit it.
os.environ.setdefault("PADDLETRAIN_CACHE_DIR", tempfile.mkdtemp(prefix="paddletrain-tests-cache-"))

# The suite runs as the commands do: MKL's fast path on an AMD CPU is set here, before any Paddle kernel, so every
# test and every process a test starts inherits it; those processes then find it set and do not say it again.
use_fast_mkl()
mkl_note()  # said by nobody: a test of the note itself sees only its own

# A run that exercises the whole pipeline in a few seconds: tiny shapes split, 16px images, one epoch.
TINY = [
    "data.shapes.num_train=64",
    "data.shapes.num_val=32",
    "data.image_size=16",
    "data.batch_size=16",
    "trainer.max_epochs=1",
    "callbacks.progress_bar.enabled=false",
    "trainer.cpu_threads=1",
]


def compose_fit(overrides: list[str] = (), name: str = "fit"):
    """The config `python -m paddletrain.fit <overrides>` would run with."""
    with initialize_config_module("paddletrain.conf", version_base="1.3"):
        return compose(name, overrides=list(overrides))


def datasets_of(cfg):
    """The datasets of a composed config, with the data builder's own options (data.urls, ...), as build_data
    hands them over."""
    return build_datasets(cfg.data, options=factory_options(cfg)["data"])


@pytest.fixture
def tiny_overrides() -> list[str]:
    return list(TINY)


def run_module(module: str, args: list[str], cwd, timeout: float = 300,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m module args`` in a process of its own, as a user would (``env``: extra variables); forked
    from a warm interpreter where that behaves as a fresh one would (tests/forked.py), which saves ~2 s a run."""
    base = {**os.environ, "PYTHONWARNINGS": "ignore", "HYDRA_FULL_ERROR": "0"}
    return forked.run_module(module, args, cwd, {**base, **(env or {})}, timeout, server_env=base)


def fit_tiny(tmp_path: Path, *overrides: str) -> tuple[Path, dict]:
    """A :data:`TINY` run with ``overrides`` in ``tmp_path / "run"``: its directory and its ``summary.json``."""
    run_dir = tmp_path / "run"
    result = run_module("paddletrain.fit", [*TINY, *overrides, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-2000:]
    return run_dir, json.loads((run_dir / "summary.json").read_text())


def evaluated(checkpoint: str | Path, *overrides: str, cwd: Path) -> dict:
    """The JSON line of ``python -m paddletrain.evaluate checkpoint=<checkpoint> <overrides>``, which must succeed."""
    result = run_module("paddletrain.evaluate", [f"checkpoint={checkpoint}", *overrides], cwd=cwd)
    assert result.returncode == 0, (result.stdout + result.stderr)[-2000:]
    return json.loads(result.stdout.splitlines()[-1])


def write_image_folder(root: Path, bad_val_index: int | None = None) -> None:
    """A 2-class image folder of 12x12 PNGs (8 train and 4 val images per class); the validation image at
    ``bad_val_index`` (in sorted order) is not an image. Validation is not shuffled and rank r of 2 reads
    samples r, r+2, ...: index 0 is rank 0's, index 1 rank 1's."""
    rng = np.random.RandomState(0)
    for split, n in (("train", 8), ("val", 4)):
        for cls in ("a", "b"):
            folder = root / split / cls
            folder.mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.randint(0, 255, (12, 12, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    if bad_val_index is not None:
        sorted((root / "val").glob("*/*.png"))[bad_val_index].write_bytes(b"not a png")


# The exported model of the predict tests: a seeded resnet20 for 16px RGB inputs with three labels.
EXPORT_LABELS = ["a", "b", "c"]
EXPORT_SIZE = 16


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory) -> Path:
    """An export (``model.pdmodel`` and friends) of an untrained resnet20 over ``EXPORT_LABELS``, one per module."""
    paddle.seed(0)
    model = create_model("resnet20", num_classes=len(EXPORT_LABELS))
    info = preprocessing_info(OmegaConf.structured(DataConfig(image_size=EXPORT_SIZE)))
    return export_model(model, tmp_path_factory.mktemp("export"), input_size=(3, EXPORT_SIZE, EXPORT_SIZE),
                        preprocessing=info, labels=EXPORT_LABELS)


# Four colours, one per quadrant of a 16x16 image: the multi-label data of tests/test_multilabel.py and test_ship.py.
SQUARE_COLOURS = [(230, 40, 40), (40, 230, 40), (40, 40, 230), (230, 230, 40)]


def write_multilabel_squares(root: Path) -> Path:
    """16x16 images holding 2 of 4 coloured squares (one per quadrant), listed in PaddleClas multi-label lists
    ``train_list.txt``/``val_list.txt`` (``<path>\t<0/1,...>``) under ``root``."""
    import itertools

    pairs = list(itertools.combinations(range(4), 2))
    for split, count in (("train", 48), ("val", 12)):
        lines = []
        for i in range(count):
            pixels = np.full((16, 16, 3), 20, np.uint8)
            hot = [0] * 4
            for c in pairs[i % len(pairs)]:
                hot[c] = 1
                pixels[(c // 2) * 8:(c // 2) * 8 + 8, (c % 2) * 8:(c % 2) * 8 + 8] = SQUARE_COLOURS[c]
            (root / split).mkdir(parents=True, exist_ok=True)
            Image.fromarray(pixels).save(root / split / f"{i}.png")
            lines.append(f"{split}/{i}.png\t{','.join(map(str, hot))}\n")
        (root / f"{split}_list.txt").write_text("".join(lines))
    return root


def data_command(argv: list[str], monkeypatch) -> int:
    """The exit code of ``python -m paddletrain.data <argv>``, run in this process through the commands' one
    ending (:func:`paddletrain.cli.run_script`)."""
    from paddletrain.cli import run_script
    from paddletrain.data.__main__ import main

    monkeypatch.setattr("paddletrain.cli.own_stop_signals", lambda: None)  # the test process keeps its handlers
    with pytest.raises(SystemExit) as exit_:
        run_script(lambda: main(argv))
    return exit_.value.code


def command_code(task, *args, **kwargs) -> int:
    """The exit code a command's task function ends with: what it returns, or, for what it raises, the code its
    command's one ending gives (:func:`paddletrain.cli.end_command`, which also logs the one line)."""
    from paddletrain.cli import end_command

    try:
        return task(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001  (mapped exactly as the command maps it)
        with pytest.raises(SystemExit) as exit_:
            end_command(exc)
        return exit_.value.code
