"""Every shipped recipe and every documented preset goes through every command that reads a run back.

Discovered, not listed: each experiment in ``configs/experiment/`` and each preset of each group under
``paddletrain/conf/`` (one at a time over ``fit``'s defaults). Each trains a shrunk run on generated data of the
kind its config names, then ``evaluate`` (and ``split=test`` where the run held a split out), ``export`` and
``predict`` on the export read it back; the slow pass also ``ship``s it to every target this machine runs. A
preset or recipe added later is walked without editing this file; one whose data kind has no generator here
fails, naming it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import paddle
import pytest
import yaml
from PIL import Image

import paddletrain
from paddletrain.data.shards.pack import pack
from paddletrain.models import create_model
from paddletrain.models.pretrained import save_pretrained
from tests.conftest import compose_fit, run_module
from tests.test_data_cifar import _batch, make_archive
from tests.test_data_mnist import write_idx_split

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CONF = Path(paddletrain.__file__).parent / "conf"
FIT_DEFAULTS = yaml.safe_load((CONF / "fit.yaml").read_text())["defaults"]
DEFAULT_PRESETS = {group: name for entry in FIT_DEFAULTS if isinstance(entry, dict) for group, name in entry.items()}

# A run of a few steps on tiny images: four training batches of 4, the whole (small) validation split.
SHRUNK = ["data.image_size=16", "data.eval_image_size=16", "data.eval_resize=18", "data.batch_size=4",
          "data.eval_batch_size=8", "data.num_workers=0", "data.persistent_workers=false", "trainer.max_epochs=1",
          "trainer.limit_train_batches=4", "trainer.devices=1", "trainer.cpu_threads=1", "sched.warmup_epochs=0",
          "callbacks.progress_bar.enabled=false", "data.shapes.num_train=16", "data.shapes.num_val=8"]


@dataclass(frozen=True)
class Case:
    """One combination a user is shown: ``overrides`` of ``fit`` (a recipe, or a group's preset)."""

    id: str
    overrides: tuple[str, ...]
    recipe: bool = False  # composed with configs/ on the search path (fit's --config-dir configs)

    def argv(self) -> list[str]:
        """The arguments of ``python -m paddletrain.fit`` for this case."""
        return [*(("--config-dir", str(CONFIGS)) if self.recipe else ()), *self.overrides]

    def compose(self):
        """The config ``fit`` composes for this case (before the shrinking overrides)."""
        search_path = [f"hydra.searchpath=[file://{CONFIGS}]"] if self.recipe else []
        return compose_fit([*self.overrides, *search_path])


def _cases() -> list[Case]:
    cases = [Case(f"experiment={path.stem}", (f"+experiment={path.stem}",), recipe=True)
             for path in sorted((CONFIGS / "experiment").glob("*.yaml"))]
    for group_dir in sorted(p for p in CONF.iterdir() if p.is_dir() and not p.name.startswith("_")):
        group = group_dir.name
        for path in sorted(group_dir.glob("*.yaml")):
            if path.stem == DEFAULT_PRESETS.get(group):
                continue  # the defaults themselves are every other case's base
            preset = f"[default,{path.stem}]" if group == "callbacks" else path.stem  # presets add to the default
            cases.append(Case(f"{group}={path.stem}", (f"{group}={preset}",)))
    return cases


CASES = _cases()
# The model group's presets build one ResNet family at other depths and widths through the same config path: the
# default suite trains and evaluates each (the read-back of its config), the slow pass also exports and predicts
# it (deep graphs take most of the walk's time there).
MODEL_PRESET = [case for case in CASES if case.id.startswith("model=")]
READ_BACK = [pytest.param(case, id=case.id, marks=[pytest.mark.slow] if case in MODEL_PRESET else [])
             for case in CASES]


# ---------------------------------------------------------------------------------------------------------------
# Generated data of each kind a config can name (by data.name)

def _picture(rng: np.random.Generator, label: int, size: int = 20, mode: str = "RGB") -> Image.Image:
    pixels = rng.integers(0, 256, (size, size + 4, 3), dtype=np.uint8)
    pixels[..., label % 3] = 255  # a colour cue per class
    return Image.fromarray(pixels).convert(mode)


def _image_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    for split, count in (("train", 8), ("val", 3)):
        for label, name in enumerate(("ants", "bees")):
            (root / split / name).mkdir(parents=True)
            for i in range(count):
                _picture(rng, label).save(root / split / name / f"{i}.jpg")
    return root


def _label_lists(root: Path) -> Path:
    _image_folder(root)
    for split in ("train", "val"):
        lines = [f"{path.relative_to(root)} {('ants', 'bees').index(path.parent.name)}\n"
                 for path in sorted((root / split).glob("*/*.jpg"))]
        (root / f"{split}_list.txt").write_text("".join(lines))
    return root


def _shards(root: Path) -> Path:
    _image_folder(root / "folder")
    pack(root / "folder", root, shard_size_mb=16 / 1024, seed=0)
    return root


def _cifar(root: Path, kind: str) -> Path:
    rng = np.random.default_rng(0)
    classes = 10 if kind == "cifar10" else 100
    names = [f"class{i}".encode() for i in range(classes)]
    if kind == "cifar10":
        members = {"data_batch_1": _batch(rng, 16, b"labels", classes),
                   "test_batch": _batch(rng, 6, b"labels", classes), "batches.meta": {b"label_names": names}}
    else:
        members = {"train": _batch(rng, 16, b"fine_labels", classes), "test": _batch(rng, 6, b"fine_labels", classes),
                   "meta": {b"fine_label_names": names, b"coarse_label_names": [b"c"] * 20}}
    make_archive(root, kind, members)
    return root


def _idx(root: Path) -> Path:
    rng = np.random.default_rng(0)
    write_idx_split(root, "train", rng.integers(0, 256, (100, 28, 28)), np.arange(100) % 10)
    write_idx_split(root, "val", rng.integers(0, 256, (6, 28, 28)), np.arange(6) % 10)
    return root


# data.name -> (writes the data under a directory, the overrides that point the run at it)
GENERATORS = {
    "shapes": (lambda root: root, lambda root: []),
    "imagefolder": (_image_folder, lambda root: [f"data.root={root}"]),
    "labellist": (_label_lists, lambda root: [f"data.root={root}", f"data.train_list={root}/train_list.txt",
                                              f"data.val_list={root}/val_list.txt"]),
    "shards": (_shards, lambda root: [f"data.urls='{root}/train-{{000000..000001}}.tar'",
                                      f"data.val_urls='{root}/val-000000.tar'", "data.shuffle_buffer=4"]),
    "cifar10": (lambda root: _cifar(root, "cifar10"), lambda root: [f"data.root={root}"]),
    "cifar100": (lambda root: _cifar(root, "cifar100"), lambda root: [f"data.root={root}"]),
    "mnist": (_idx, lambda root: [f"data.root={root}"]),
    "fashion_mnist": (_idx, lambda root: [f"data.root={root}"]),
}


@pytest.fixture(scope="module")
def data_roots(tmp_path_factory) -> dict[str, Path]:
    """Each kind of data written once for the module (``data.name`` -> its directory)."""
    return {name: write(tmp_path_factory.mktemp(f"data-{name}")) for name, (write, _) in GENERATORS.items()}


def _predict_inputs(tmp_path: Path) -> Path:
    folder = tmp_path / "photos"
    folder.mkdir()
    rng = np.random.default_rng(1)
    for i in range(3):
        _picture(rng, i).save(folder / f"{i}.png")
    return folder


def _weights_file(tmp_path: Path, model_name: str, arch: str | None, options: dict) -> Path:
    """Pretrained weights a recipe would download, made locally: the recipe's model, seeded, as safetensors."""
    paddle.seed(0)
    path = tmp_path / f"{arch or model_name}.safetensors"
    save_pretrained(create_model(model_name, num_classes=10, **({"arch": arch} if arch else {}), **options), str(path))
    return path


def _teacher(tmp_path: Path) -> Path:
    from paddletrain.checkpoint import save_checkpoint

    paddle.seed(0)
    return save_checkpoint(tmp_path / "teacher", {"model": create_model("resnet18_vd", num_classes=2).state_dict()})


def _run_overrides(case: Case, data_roots: dict[str, Path], tmp_path: Path) -> list[str]:
    """The case's overrides with its data, and local stand-ins for what a recipe would download or a GPU run."""
    composed = case.compose()
    kind = composed.data.name
    assert kind in GENERATORS, f"{case.id}: no generated data of kind data.name={kind}; add one to GENERATORS"
    overrides = [*case.argv(), *SHRUNK, *GENERATORS[kind][1](data_roots[kind])]
    if composed.sched.name == "onecycle":
        overrides.append("sched.pct_start=0.5")  # two phases of two steps in the shrunk run's four
    model = composed.model
    if model.name == "vision" and model.arch is None:
        overrides.append("model.arch=shufflenet_v2_x0_25")
    width = {}
    if model.name != "vision":  # paddle.vision's builders have no width; paddletrain's ImageNet ResNets at a quarter
        width = {"width": 0.25}
        overrides.append("model.width=0.25")
    if model.pretrained:  # a download: the same architecture's weights, from a local file
        overrides.append(f"model.pretrained={_weights_file(tmp_path, model.name, model.arch, width)}")
    distill = composed.trainer.get("distill") or {}
    if distill.get("teacher"):
        overrides += ["trainer.distill.teacher=resnet18_vd", f"trainer.distill.pretrained={_teacher(tmp_path)}"]
    if composed.trainer.amp.enabled and composed.trainer.amp.dtype == "float16":
        overrides.append("trainer.amp.dtype=bfloat16")  # float16 needs a GPU; the CPU runs the same path in bf16
    return overrides


def _ok(result, what: str) -> str:
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"{what} exited {result.returncode}:\n{output[-3000:]}"
    return output


def _last_json(stdout: str) -> dict:
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


def _fit(case: Case, data_roots: dict[str, Path], tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    _ok(run_module("paddletrain.fit", [*_run_overrides(case, data_roots, tmp_path), f"hydra.run.dir={run_dir}"],
                   cwd=tmp_path), f"{case.id}: fit")
    assert (run_dir / "summary.json").is_file()
    return run_dir


def _fit_and_evaluate(case: Case, data_roots: dict[str, Path], tmp_path: Path) -> tuple[Path, dict]:
    run_dir = _fit(case, data_roots, tmp_path)
    validated = json.loads((run_dir / "summary.json").read_text())  # the run's one validation, of this checkpoint
    scored = _last_json(_ok(run_module("paddletrain.evaluate", [f"checkpoint={run_dir}:best"], cwd=tmp_path),
                            f"{case.id}: evaluate"))
    assert scored["val/loss"] == pytest.approx(validated["val/loss"], rel=1e-4), "evaluate scores what fit validated"
    return run_dir, validated


@pytest.mark.parametrize("case", MODEL_PRESET, ids=lambda case: case.id)
def test_every_model_preset_trains_and_is_evaluated(case, data_roots, tmp_path):
    _fit_and_evaluate(case, data_roots, tmp_path)


@pytest.mark.parametrize("case", READ_BACK)
def test_every_preset_and_recipe_is_read_back_by_evaluate_export_and_predict(case, data_roots, tmp_path):
    run_dir, validated = _fit_and_evaluate(case, data_roots, tmp_path)
    if case.compose().data.holdout:
        tested = _last_json(_ok(run_module("paddletrain.evaluate", [f"checkpoint={run_dir}:best", "split=test"],
                                           cwd=tmp_path), f"{case.id}: evaluate split=test"))
        assert any(key.startswith("test/") for key in tested)
    exported = tmp_path / "export"
    # The export's parity with the checkpoint is the slow pass's (ship checks every target); here: it reads back.
    _ok(run_module("paddletrain.export", [f"checkpoint={run_dir}:best", f"out_dir={exported}", "check=false"],
                   cwd=tmp_path),
        f"{case.id}: export")
    predictions = tmp_path / "predictions.jsonl"
    _ok(run_module("paddletrain.predict", [f"model_dir={exported}", f"input={_predict_inputs(tmp_path)}",
                                           f"output={predictions}", "num_workers=0", "progress_bar=false"],
                   cwd=tmp_path), f"{case.id}: predict")
    lines = [json.loads(line) for line in predictions.read_text().splitlines()]
    assert len(lines) == 3 and all(set(line["labels"]) <= set(validated["val/classes"]) for line in lines)
    # Commands that read a run back leave nothing of their own in the working directory; export logs beside itself.
    assert not (tmp_path / "outputs").exists() and (exported / "export.log").is_file()


@pytest.mark.slow  # ship exports and times every target (about 10 s a run): CI's slow pass walks them all
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_every_preset_and_recipe_ships(case, data_roots, tmp_path):
    run_dir = _fit(case, data_roots, tmp_path)
    # A few steps from random weights: int8 may flip near-ties on a handful of images, so no accuracy gate here.
    _ok(run_module("paddletrain.ship", [f"checkpoint={run_dir}:best", f"out_dir={tmp_path / 'ship'}",
                                        "timing_runs=1", "tolerance=100", "min_agreement=0"], cwd=tmp_path),
        f"{case.id}: ship")
    report = json.loads((tmp_path / "ship" / "report.json").read_text())
    ran = {target["target"]: target for target in report["targets"] if target["status"] != "skipped"}
    assert ran["paddle-fp32"]["status"] == "ok" and ran["paddle-fp32"]["agreement"] == 1.0, ran["paddle-fp32"]


def test_evaluate_scores_the_whole_split_whatever_limit_the_run_validated_with(tmp_path):
    """A quick run made with trainer.limit_val_batches (as the quickstart suggests) is still evaluated on all of its
    validation images, and the record says how many; a limit given to evaluate itself is applied and recorded."""
    run_dir = tmp_path / "run"
    _ok(run_module("paddletrain.fit", [*SHRUNK, "data.eval_batch_size=4", "trainer.limit_val_batches=1",
                                       f"hydra.run.dir={run_dir}"], cwd=tmp_path), "fit")
    whole = _last_json(_ok(run_module("paddletrain.evaluate", [f"checkpoint={run_dir}"], cwd=tmp_path), "evaluate"))
    assert whole["images"] == 8 and "limit_val_batches" not in whole  # data.shapes.num_val=8: both batches of 4
    limited = _last_json(_ok(run_module("paddletrain.evaluate", [f"checkpoint={run_dir}",
                                                                 "trainer.limit_val_batches=1"], cwd=tmp_path),
                             "evaluate limited"))
    assert limited["images"] == 4 and limited["limit_val_batches"] == 1


def test_a_runs_relative_data_paths_name_the_same_files_from_any_directory(data_roots, tmp_path):
    """fit with data.root and label lists relative to where it runs; evaluate and export from elsewhere."""
    made_in = data_roots["labellist"].parent
    relative = data_roots["labellist"].name
    run_dir = tmp_path / "run"
    _ok(run_module("paddletrain.fit", [*SHRUNK, "data=labellist", f"data.root={relative}",
                                       f"data.train_list={relative}/train_list.txt", "data.val_list=val_list.txt",
                                       f"hydra.run.dir={run_dir}"], cwd=made_in), "fit")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    scored = _last_json(_ok(run_module("paddletrain.evaluate", [f"checkpoint={run_dir}"], cwd=elsewhere), "evaluate"))
    assert scored["images"] == 6
    _ok(run_module("paddletrain.export", [f"checkpoint={run_dir}", f"out_dir={elsewhere / 'export'}", "check=false"],
                   cwd=elsewhere), "export")


@pytest.mark.parametrize("kind", ["labellist", "shards"])
def test_evaluate_reads_only_the_split_it_scores_and_an_override_of_it_is_enough(kind, data_roots, tmp_path):
    """The training data gone, evaluate still scores the validation split, moved and named on the command line."""
    import shutil

    data = tmp_path / "data"
    shutil.copytree(data_roots[kind], data)
    run_dir = tmp_path / "run"
    _ok(run_module("paddletrain.fit", [*SHRUNK, f"data={kind}", *GENERATORS[kind][1](data), f"hydra.run.dir={run_dir}"],
                   cwd=tmp_path), "fit")
    validated = json.loads((run_dir / "summary.json").read_text())
    before = _last_json(_ok(run_module("paddletrain.evaluate", [f"checkpoint={run_dir}"], cwd=tmp_path), "evaluate"))
    moved = tmp_path / "moved"
    moved.mkdir()
    if kind == "labellist":
        shutil.copy(data / "val_list.txt", moved / "val_list.txt")
        (data / "train_list.txt").unlink()
        override = [f"data.val_list={moved / 'val_list.txt'}"]
    else:
        shutil.copy(data / "val-000000.tar", moved / "val-000000.tar")
        for shard in data.glob("*.tar"):
            shard.unlink()
        override = [f"data.val_urls={moved / 'val-000000.tar'}"]
    scored = _last_json(_ok(run_module("paddletrain.evaluate", [f"checkpoint={run_dir}", *override], cwd=tmp_path),
                            "evaluate"))
    assert scored["images"] == before["images"] > 0 and scored["val/classes"] == validated["val/classes"]
    assert scored["val/loss"] == pytest.approx(validated["val/loss"], rel=1e-4)
