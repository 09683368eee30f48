"""Every command and snippet of README.md and docs/*.md runs, so a document cannot drift from the code.

How a document is run (one test per document, in a fresh workspace holding copies of ``configs/`` and ``examples/``,
an image folder, a few photos, tiny Fashion-MNIST files and one small trained run of the default job):

1. Python blocks that start with ``# <name>.py`` are written to that file (later blocks and commands import them).
2. Shell blocks (``bash``, ``sh``) run as bash scripts in document order, ``set -e``: ``cd``, variables and
   ``&`` behave as for a reader pasting them. ``console`` blocks are transcripts: each ``$ command`` runs on its own
   and its output must match the lines shown (``...`` matches anything).
3. The document's other Python blocks run in order in one interpreter, sharing their names, like a reader's session;
   what a block takes as given (a model, a batch) is in :data:`GIVEN`.

Fast runs shrink the work (the default suite has those of :data:`FAST_DOCS`; CI's slow pass,
``pytest -m "slow and not hours"``, those of the other documents): ``python -m paddletrain.fit`` (and a Hydra
app's ``app.py``) gets :data:`SMALL_RUN` appended, ``Limits(max_epochs=N)`` in Python becomes one epoch of two
batches. Placeholders such as ``<time>``, ``<checkpoint>`` or ``<run dir>`` become what earlier commands
created (:func:`resolve_placeholders`). Commands and snippets in :data:`RULES` are instead run only by the slow
suite, as written (``pytest -m slow tests/test_docs.py``), or never, with the reason. A `fit` command the default
suite does not run is still composed and validated there. A block in a language that is neither run nor shown
(``text``, ``json``, ...) fails, and so does a rule that no longer matches anything.
"""
from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from tests.docs_blocks import (
    ROOT,
    RUN_LANGS,
    SHELL_LANGS,
    SHOWN_LANGS,
    Block,
    Command,
    all_blocks,
    commands,
    doc_files,
    read_blocks,
)

# Appended to every `python -m paddletrain.fit` / `python app.py` of a fast run: seconds instead of minutes.
SMALL_RUN = [
    "data.shapes.num_train=64", "data.shapes.num_val=32", "data.image_size=16", "data.batch_size=16",
    "data.num_workers=0", "trainer.max_epochs=1", "trainer.limit_train_batches=2", "trainer.limit_val_batches=2",
    "sched.warmup_epochs=0", "callbacks.progress_bar.enabled=false",
]
# Appended to every `python -m paddletrain.ship` of a fast run: the report's every target and column, timed and
# calibrated on a few images instead of hundreds.
SMALL_SHIP = ["timing_runs=2", "calibration_images=16", "divergence_images=2"]
# The same for Python snippets: `Limits(max_epochs=N)` trains one epoch of two batches.
SMALL_PYTHON = [(re.compile(r"\bmax_epochs=\d+"), "max_epochs=1, limit_train_batches=2, limit_val_batches=2")]


@dataclass(frozen=True)
class Rule:
    """How a command or Python block that ``pattern`` matches (``re.search`` on its text) in ``doc`` is run, and
    why: ``slow`` (only by the slow suite, as written), ``both`` (shrunk in the default suite, and as written by
    the slow suite) or ``skip`` (never). Anything no rule matches runs shrunk in the default suite only."""

    doc: str
    pattern: str
    kind: str
    reason: str
    # Whether a `python -m paddletrain.fit` it keeps from the default suite can still be composed and validated
    # there (test_fit_commands_not_run_here_still_compose); False when it needs what the test lacks (a plugin).
    composes: bool = True

    def matches(self, doc: str, text: str) -> bool:
        return doc == self.doc and re.search(self.pattern, text) is not None


SLOW, BOTH, SKIP = "slow", "both", "skip"
NEEDS_WEIGHTS = "downloads published ImageNet weights (no network in the test suite)"
# Reviewed list: everything not matched here runs in the default suite. A rule that matches nothing fails
# test_every_rule_is_used.
RULES = [
    # installing and the suite itself
    Rule("README.md", r"^pip install -e", SKIP, "installs into the environment the suite runs in (the command after "
                                                "it, the default job, runs)"),
    Rule("README.md", r"^pytest -q$", SKIP, "the test suite itself"),
    Rule("docs/testing.md", r"^pytest ", SKIP, "the test suite itself (its slow pass)"),
    Rule("docs/quickstart.md", r"^pip install -e", SKIP, "installs into the environment the suite runs in"),
    Rule("docs/quickstart.md", r"^apt-get install", SKIP, "installs a system package (the fast run makes its own "
                                                          "Fashion-MNIST files)"),
    Rule("docs/recipes.md", r"^apt-get install", SKIP, "installs a system package (the runs use the suite's own tiny "
                                                       "Fashion-MNIST files)"),
    Rule("docs/search.md", r"^pip install -e", SKIP, "installs into the environment the suite runs in"),
    Rule("docs/search.md", r"^python -m comparisons search", SLOW,
         "both 24-trial studies and the baseline, as measured: about 50 minutes"),
    Rule("docs/search.md", r"--config-name best", None, "composes the config the search before it writes "
         "(sweeps/lr/best.yaml); the document's run composes it", composes=False),
    Rule("docs/search.md", r"postgresql://paddletrain@db-host", SKIP,
         "needs a PostgreSQL server and a second machine; tests/test_search_storage.py runs two searches against a "
         "server of its own", composes=False),
    Rule("docs/extending.md", r"^pip install \./examples/downstream_app", SKIP,
         "installs into the environment; tests/test_plugins.py installs it into a fresh virtual environment and "
         "runs the commands after it"),
    Rule("docs/extending.md", r"model\.name=tiny_resnet data\.name=bars data\.image_size=16", SKIP,
         "needs the plugin installed (above); tests/test_plugins.py runs it", composes=False),
    Rule("docs/extending.md", r"tiny_resnet-bars/<time>", SKIP, "needs the plugin installed; tests/test_plugins.py"),
    Rule("docs/extending.md", r"list_models\('tiny\*'\)", SKIP, "needs the plugin installed; tests/test_plugins.py"),
    Rule("docs/configuration.md", r"_target_=my_package\.MyLogger", SKIP,
         "names the reader's own class; extending.md runs the same form with its my_callbacks.BestTop1",
         composes=False),
    Rule("docs/extending.md", r"^# app\.py \(abridged\)", SKIP,
         "an excerpt of examples/downstream_app/app.py, which the commands after it run"),
    # long-running servers, other machines, GPUs, downloads
    Rule("docs/monitoring.md", r"^visualdl --logdir", SKIP, "starts a server that runs until stopped"),
    Rule("docs/quickstart.md", r"^visualdl --logdir", SKIP, "starts a server that runs until stopped"),
    Rule("docs/distributed.md", r"trainer\.master=10\.0\.0\.1", SKIP, "needs two machines and a shared filesystem"),
    Rule("docs/finetuning.md", r"finetune_shufflenet_imagefolder(?!.*model\.pretrained=null)", SKIP, NEEDS_WEIGHTS),
    Rule("docs/finetuning.md", r"finetune_resnet50_vd_imagefolder", SKIP, NEEDS_WEIGHTS),
    Rule("docs/finetuning.md", r'pretrained="paddleclas:', SKIP, NEEDS_WEIGHTS),
    Rule("README.md", r"finetune_shufflenet_imagefolder", SKIP, NEEDS_WEIGHTS),
    Rule("README.md", r"precision=bf16", SKIP, "needs a CPU with AVX512-BF16 or AMX for bf16 inference"),
    # long: run by the slow suite as written
    Rule("README.md", r"^python -m paddletrain\.fit$", BOTH,
         "the default job, 2 minutes (the slow suite also checks its accuracy: tests/test_fit.py)"),
    Rule("README.md", r"^python -m (paddletrain\.bench|comparisons)", SLOW, "a benchmark: minutes"),
    Rule("README.md", r"Limits\(max_epochs=5\), num_classes", BOTH, "5 epochs of the default job: 2 minutes"),
    Rule("docs/performance.md", r"\$[BM] |^[BM]=", SLOW, "a benchmark: minutes"),
    Rule("docs/performance.md", r"^MKL_DEBUG_CPU_TYPE= python -m paddletrain\.fit", SLOW,
         "a measurement on the real Fashion-MNIST files, as written (the fast runs have none of this size)"),
    Rule("docs/recipes.md", r"^python -m comparisons recipes", SLOW,
         "every run of the measured table: about an hour (finished runs under runs_dir are read, not redone)"),
    Rule("docs/recipes.md", r"hydra\.run\.dir=/tmp/measure/runs/", SKIP,
         "one row of the measured table, on the real datasets; the `bench recipes` command above runs every row "
         "as written (tests/test_comparisons_recipes.py checks that its commands are these)"),
    Rule("docs/monitoring.md", r"^python -m paddletrain\.fit|visualdl_screenshots", SLOW,
         "two full default runs and a headless browser, as the screenshots were made"),
]



@dataclass(frozen=True)
class Needs:
    """A command or Python block that ``pattern`` matches in ``doc`` needs ``modules`` from an optional extra: it
    runs where they are installed, and where they are not the document's test runs the rest, then reports as
    skipped naming what it left out and the extra."""

    doc: str
    pattern: str
    modules: tuple[str, ...]
    extra: str

    def missing(self, doc: str, text: str) -> list[str]:
        if doc != self.doc or re.search(self.pattern, text) is None:
            return []
        return [module for module in self.modules if importlib.util.find_spec(module) is None]


# Reviewed list, like RULES; a Needs entry that matches nothing fails test_every_rule_is_used.
NEEDS = [
    Needs("docs/inference.md", r"format=onnx|OnnxPredictor", ("paddle2onnx", "onnxruntime"), "onnx"),
    Needs("docs/search.md", r".", ("optuna",), "search"),  # every command reads or makes a search
]


def missing_extra(doc: str, text: str) -> str | None:
    """Why ``text`` cannot run here (the modules it needs and their extra), or None when it can."""
    for needs in NEEDS:
        missing = needs.missing(doc, text)
        if missing:
            return f"needs {', '.join(missing)}: pip install -e '.[{needs.extra}]'"
    return None


@dataclass(frozen=True)
class Given:
    """What a reader of ``doc`` already has when a Python block that ``pattern`` matches runs (a model, a batch):
    ``code`` runs just before that block, in the same interpreter."""

    doc: str
    pattern: str
    code: str


_MODEL = "import paddle\nfrom paddletrain import create_model\nmodel = create_model('resnet20', num_classes=6)\n"
# Reviewed list: the names a document's Python block takes as given, and nothing else.
GIVEN = [
    Given("docs/checkpoints.md", r"^from paddletrain\.checkpoint import save_checkpoint",
          _MODEL + "opt = paddle.optimizer.AdamW(parameters=model.parameters())\n"),
    Given("docs/checkpoints.md", r"CheckpointManager\(root", "root = 'runs/a/retained'\n"),
    Given("docs/data.md", r"^from paddletrain\.data\.transforms\.mixup import Mixup",
          _MODEL.replace("num_classes=6", "num_classes=1000") + "seed, rank = 0, 0\n"
          "images = paddle.rand([4, 3, 32, 32])\n"
                   "labels = paddle.to_tensor([0, 1, 2, 3])\n"),
    Given("docs/models.md", r"pretrained=\"resnet50\.safetensors\"",
          "from paddletrain.models import create_model\n"
          "from paddletrain.models.pretrained import save_pretrained\n"
          "save_pretrained(create_model('resnet50'), 'resnet50.safetensors')\n"),
    Given("docs/inference.md", r"^from paddletrain\.deploy\.exporter import export_model",
          _MODEL + "from paddletrain.config import DataConfig\nfrom paddletrain.data import preprocessing_info\n"
                   "info = preprocessing_info(DataConfig(image_size=224))\n"
                   "class_names = ['circle', 'ring', 'square', 'triangle', 'star', 'cross']\n"),
]
# Paths a Python block names with "..." for the reader's own run: the newest match in the workspace.
PYTHON_PATHS = {"outputs/.../checkpoints/best": "outputs/*/*/checkpoints/epoch*",
                "outputs/<name>/<time>": "outputs/resnet20-shapes/*"}


def given_for(doc: str, text: str) -> str:
    return "".join(g.code for g in GIVEN if g.doc == doc and re.search(g.pattern, text, re.MULTILINE))


def rule_for(doc: str, text: str) -> Rule | None:
    return next((rule for rule in RULES if rule.matches(doc, text)), None)


# ---------------------------------------------------------------------------------------------------------------
# The workspace a document runs in


def _write_image(path: Path, seed: int, size: int = 24) -> None:
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8)).save(path)


def make_workspace(path: Path) -> Path:
    """A directory laid out like the repository root for a reader: ``configs/`` and ``examples/`` (copies, so
    nothing is written into the checkout), image data and a few photos."""
    path.mkdir(parents=True, exist_ok=True)
    for name in ("configs", "examples"):
        shutil.copytree(ROOT / name, path / name, ignore=shutil.ignore_patterns("outputs", "__pycache__"))
    for split, count in (("train", 12), ("val", 4)):
        for c, cls in enumerate(("ants", "bees")):  # by index: "ants" and "bees" have the same length
            for i in range(count):
                _write_image(path / "images" / split / cls / f"{i}.png", len(split) * 1000 + c * 100 + i)
    for i in range(3):
        _write_image(path / "photos" / f"{i}.jpg", 100 + i)
    _write_image(path / "cat.jpg", 200)
    from tests.test_data_mnist import write_idx_split

    rng = np.random.default_rng(0)
    for split, count in (("train", 64), ("val", 32)):
        write_idx_split(path / "fashion", split, rng.integers(0, 256, (count, 28, 28)), np.arange(count) % 10)
    return path


def run_env() -> dict[str, str]:
    """The environment of a reader's shell, with this checkout importable (and the workspace, for snippets'
    modules such as my_model.py)."""
    paths = [str(ROOT), *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(["."] + paths),
                PADDLETRAIN_OFFLINE="1")


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """One small run of the default job (workspace-relative ``outputs/resnet20-shapes/<time>``), copied into each
    document's workspace so that export, predict, evaluate and resume commands have something to read."""
    ws = tmp_path_factory.mktemp("trained")
    run_dir = ws / "outputs" / "resnet20-shapes" / "2026-01-01_00-00-00"
    result = subprocess.run([sys.executable, "-m", "paddletrain.fit", *SMALL_RUN, f"hydra.run.dir={run_dir}"],
                            cwd=ws, env=run_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return ws / "outputs"


# ---------------------------------------------------------------------------------------------------------------
# Turning a documented command into the one that runs

# Paths of the reader's machine, standing for data the workspace has.
DATA_PATHS = re.compile(r"(?<![\w/.])/data/\w+")
# A checkpoint directory's name as the docs show it (the small run's differ).
CHECKPOINT_NAME = re.compile(r"epoch\d{4}-step\d{7}")
# Named placeholders: a glob in the workspace (newest match wins), or a fixed text.
NAMED = {
    "<run dir>": "outputs/*/*",
    "<ckpt dir>": "outputs/*/*/checkpoints/epoch*",
    "<images>": "images",
    "<folder>": "photos",
    "<hymenoptera_data>": "images",
    "<overrides of the run>": "",
}
# Placeholders inside a path that stand for more than one directory level.
IN_PATH = {"<run>": "*/*"}


# Defined in every script a shell block runs as: the newest directory matching the first pattern that matches.
NEWEST = textwrap.dedent("""
    newest() {
        local pattern match
        for pattern in "$@"; do
            match=$(ls -1dt -- $pattern/ 2>/dev/null | head -n 1)
            if [ -n "$match" ]; then echo "${match%/}"; return 0; fi
        done
        echo "placeholder pattern '$1' matches nothing: an earlier block should have created it" >&2
        return 1
    }
""")


def resolve_placeholders(text: str) -> str:
    """``text`` with every ``<...>`` placeholder and reader's path replaced by a real one of the workspace.

    A path holding placeholders (``outputs/resnet20-shapes/<time>/checkpoints/<checkpoint>``) becomes the newest
    directory matching it with each placeholder read as ``*``, found when the command runs (by :data:`NEWEST`,
    so it may be what the previous command of the same block made); a placeholder standing alone comes from
    :data:`NAMED`. A checkpoint name such as ``epoch0004-step0000155`` that does not exist matches any
    checkpoint of that run."""
    for name, value in NAMED.items():
        if name in text and "*" not in value:
            text = text.replace(name, value)
    text = DATA_PATHS.sub("images", text)

    def path(match: re.Match) -> str:
        token = match.group(0)
        prefix, _, value = token.rpartition("=") if "=" in token else ("", "", token)
        value, choice = re.fullmatch(r"(.*?)((?::best|:last)?)", value).groups()  # checkpoint=<run>:best
        pattern = NAMED.get(value) or re.sub(r"<[^<>]+>", lambda m: IN_PATH.get(m.group(0), "*"), value).rstrip("/")
        patterns = [pattern]
        if CHECKPOINT_NAME.search(pattern):
            patterns.append(CHECKPOINT_NAME.sub("epoch*-step*", pattern))
        newest = '"$(newest ' + " ".join(shlex.quote(p) for p in patterns) + ')"'
        return (prefix + "=" if prefix else "") + newest + choice

    return re.sub(r"[^\s'\"]*(?:<[^<>\s]+(?: [^<>\s]+)?>|epoch\d{4}-step\d{7})[^\s'\"]*", path, text)


_SHRUNK = re.compile(r"^(?P<cmd>(?:python -m paddletrain\.fit|python app\.py)\b[^&|;>]*?)"
                     r"(?P<rest>\s*(?:&&?|;|\||>).*)?$")


_SHIP = re.compile(r"^(?P<cmd>python -m paddletrain\.ship\b[^&|;>]*?)(?P<rest>\s*(?:&&?|;|\||>).*)?$")


def shrink(command: str) -> str:
    """``command`` with :data:`SMALL_RUN` after each training invocation and :data:`SMALL_SHIP` after each ship
    report (before any ``&``, ``&&``, ``|`` or redirection), unless it only prints the config (``--cfg``)."""
    parts = re.split(r"(\s&&\s)", command)
    out = []
    for part in parts:
        match = _SHRUNK.match(part.strip())
        ship = _SHIP.match(part.strip())
        if match and "--cfg" not in match["cmd"]:
            part = f"{match['cmd']} {' '.join(SMALL_RUN)}{match['rest'] or ''}"
            if "fashion_mnist" in command:
                part = part.replace(" ".join(SMALL_RUN), " ".join([*SMALL_RUN, "data.root=" + "$WS/fashion"]), 1)
            if "+experiment=fashion_mnist_fast" in command:  # one-cycle wants two steps a phase: four on one rank
                four_steps = {"trainer.limit_train_batches=2": "trainer.limit_train_batches=4",
                              "data.batch_size=16": "data.batch_size=8"}
                part = part.replace(" ".join(SMALL_RUN), " ".join(
                    [*(four_steps.get(arg, arg) for arg in SMALL_RUN), "trainer.devices=1", "sched.pct_start=0.5"]), 1)
        elif ship and "--help" not in ship["cmd"]:
            part = f"{ship['cmd']} {' '.join(SMALL_SHIP)}{ship['rest'] or ''}"
        out.append(part)
    return "".join(out)


def runnable(command: Command, slow: bool) -> str | None:
    """The text to run for ``command`` in this suite (placeholders resolved; shrunk in the default suite), or None
    when :data:`RULES` give it to the other suite or skip it."""
    if not runs_in(rule_for(command.block.doc, command.text), slow) or missing_extra(command.block.doc, command.text):
        # Setting a variable is needed by the commands after it in either suite.
        return command.text if re.fullmatch(r"\w+=\S*", command.text) else None
    text = resolve_placeholders(command.text)
    return text if slow else shrink(text)


def runs_in(rule: Rule | None, slow: bool) -> bool:
    """Whether what ``rule`` governs runs in the slow suite (``slow``) or the default one."""
    kind = rule.kind if rule is not None else None
    return kind in (SLOW, BOTH) if slow else kind in (None, BOTH)


# ---------------------------------------------------------------------------------------------------------------
# Running a document

SNIPPET_DRIVER = textwrap.dedent("""
    import json, sys, traceback
    snippets = json.load(open(sys.argv[1]))
    namespace = {"__name__": "__main__"}
    for where, code in snippets:
        print(f"### {where}", flush=True)
        try:
            exec(compile(code, where, "exec"), namespace)
        except BaseException:
            traceback.print_exc()
            print(f"### FAILED: {where}", flush=True)
            sys.exit(1)
""")


def file_block_name(block: Block) -> str | None:
    """``my_model.py`` for a Python block that starts with ``# my_model.py``: its text is that file."""
    match = re.match(r"# (\w+\.py)\s*\n", block.text)
    return match.group(1) if block.lang == "python" and match else None


def output_matches(expected: tuple[str, ...], actual: str) -> bool:
    """Whether ``actual``'s lines are ``expected`` (a line ``...`` matches any lines, ``...`` within a line any
    text), ignoring blank lines."""
    pattern = []
    for line in expected:
        if not line.strip():
            continue
        if line.strip() == "...":
            pattern.append(r"(?:.*\n)*?")
        else:
            pattern.append(".*".join(map(re.escape, line.split("..."))) + r"\n")
    text = "".join(line + "\n" for line in actual.splitlines() if line.strip())
    return re.fullmatch("".join(pattern), text) is not None


def run_shell(script: str, ws: Path, where: str, timeout: float) -> subprocess.CompletedProcess:
    result = subprocess.run(["bash", "-c", script], cwd=ws, env=dict(run_env(), WS=str(ws)), capture_output=True,
                            text=True, timeout=timeout)
    return result


def left_out_here(doc: str) -> list[str]:
    """``where: why`` of each command and Python block of ``doc`` that needs an extra this environment lacks."""
    blocks = read_blocks(ROOT / doc)
    texts = [(c.where, c.text) for b in blocks if b.lang in SHELL_LANGS | {"console"} for c in commands(b)]
    texts += [(b.where, b.text) for b in blocks if b.lang == "python"]
    return [f"{where} ({why})" for where, text in texts if (why := missing_extra(doc, text))]


def run_document(doc: str, ws: Path, slow: bool) -> list[str]:
    """Run ``doc``'s blocks in ``ws``; returns what ran (``where`` of each command and snippet). What needs a
    missing extra (:data:`NEEDS`) is left out: :func:`left_out_here` lists it."""
    blocks = read_blocks(ROOT / doc)
    for block in blocks:
        name = file_block_name(block)
        if name:
            (ws / name).write_text(block.text)
    ran: list[str] = []
    done: set[str] = set()
    for block in blocks:
        if block.lang == "console":
            ran += run_transcript(block, ws, slow)
        elif block.lang in SHELL_LANGS:
            ran += run_shell_block(block, ws, slow, done)
    return ran + run_python_blocks(doc, blocks, ws, slow)


def run_transcript(block: Block, ws: Path, slow: bool) -> list[str]:
    """Each ``$ command`` of a console block on its own; its output must match the lines shown."""
    ran = []
    for command in commands(block):
        text = runnable(command, slow)
        if text is None:
            continue
        result = run_shell(NEWEST + text, ws, command.where, 600)
        output = result.stdout + result.stderr
        assert output_matches(command.expected, output), (
            f"{command.where}: `{command.text}` printed\n{output}\nbut the document shows\n"
            + "\n".join(command.expected))
        ran.append(command.where)
    return ran


def run_shell_block(block: Block, ws: Path, slow: bool, done: set[str]) -> list[str]:
    """A shell block as one bash script (``set -e``); ``done``: long commands this document already ran."""
    lines, ran = [NEWEST, "set -e -o pipefail"], []  # pipefail: `cmd | tail -1` fails when cmd does
    for command in commands(block):
        text = runnable(command, slow)
        if text is None or (slow and text in done):  # a long command repeated in one document runs once
            continue
        done.add(text)
        lines += [f"echo {shlex.quote(f'### {command.where}: {command.text}')} >&2", text]
        if not re.fullmatch(r"\w+=\S*", text):  # a variable alone runs nothing
            ran.append(command.where)
    if ran:
        result = run_shell("\n".join(lines + ["wait"]), ws, block.where, 4 * 3600 if slow else 1200)
        assert result.returncode == 0, (
            f"{block.where} failed (exit {result.returncode}); the last '###' line names the command:\n"
            + (result.stdout + result.stderr)[-4000:])
    return ran


def python_code(doc: str, block: Block, ws: Path, slow: bool) -> str:
    """What runs for a Python block: its text after what it takes as given, with the reader's paths made real."""
    name = file_block_name(block)
    code = f"import {name[:-3]}\n" if name else given_for(doc, block.text) + block.text
    for shown, pattern in PYTHON_PATHS.items():
        if shown in code:
            matches = sorted(ws.glob(pattern), key=lambda p: p.stat().st_mtime)
            assert matches, f"{block.where}: nothing in the workspace matches {shown}"
            code = code.replace(shown, str(matches[-1].relative_to(ws)))
    if not slow:
        for pattern, replacement in SMALL_PYTHON:
            code = pattern.sub(replacement, code)
    return code


def run_python_blocks(doc: str, blocks: list[Block], ws: Path, slow: bool) -> list[str]:
    """The document's Python blocks in order, in one interpreter, like a reader's session."""
    snippets = [(block.where, python_code(doc, block, ws, slow)) for block in blocks
                if block.lang == "python" and runs_in(rule_for(doc, block.text), slow)
                and not missing_extra(doc, block.text)]
    if snippets:
        (ws / ".snippets.json").write_text(json.dumps(snippets))
        (ws / ".snippet_driver.py").write_text(SNIPPET_DRIVER)
        result = subprocess.run([sys.executable, ".snippet_driver.py", ".snippets.json"], cwd=ws, env=run_env(),
                                capture_output=True, text=True, timeout=4 * 3600 if slow else 1200)
        assert result.returncode == 0, (f"{doc}: a Python block failed:\n" + (result.stdout + result.stderr)[-4000:])
    return [where for where, _ in snippets]


DOCS = [p.relative_to(ROOT).as_posix() for p in doc_files()]
# The documents whose shrunk run is in the default suite: the two a newcomer follows first. The others' shrunk runs
# are slow tests (CI's slow pass runs them): their commands repeat what the default suite's own tests cover, each
# costs a Python start-up of ~3 s, and together they took a third of the default suite. Their `fit` commands are
# still composed and validated in the default suite (test_fit_commands_not_run_here_still_compose).
FAST_DOCS = ("README.md", "docs/quickstart.md")


def _workspace(tmp_path: Path, trained_run: Path | None) -> Path:
    ws = make_workspace(tmp_path / "ws")
    if trained_run is not None:
        shutil.copytree(trained_run, ws / "outputs")
    return ws


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("doc", [doc if doc in FAST_DOCS else pytest.param(doc, marks=pytest.mark.slow)
                                 for doc in DOCS])
def test_document_runs(doc, tmp_path, trained_run):
    started = time.perf_counter()
    run_document(doc, _workspace(tmp_path, trained_run), slow=False)
    print(f"{doc}: {time.perf_counter() - started:.1f} s")
    _report_left_out(doc)


def _report_left_out(doc: str) -> None:
    """After the rest of ``doc`` passed: skipped, naming what needs an extra that is not installed here."""
    left_out = left_out_here(doc)
    if left_out:
        pytest.skip(f"{doc}: the rest ran; left out {'; '.join(left_out)}")


@pytest.mark.slow
@pytest.mark.hours
@pytest.mark.timeout(4 * 3600)  # performance.md's benchmarks, as written
@pytest.mark.parametrize("doc", DOCS)
def test_document_runs_as_written(doc, tmp_path):
    ran = run_document(doc, _workspace(tmp_path, None), slow=True)
    if not ran:
        pytest.skip(f"{doc} has nothing for the slow suite")
    _report_left_out(doc)


# ---------------------------------------------------------------------------------------------------------------
# Every block is accounted for


def test_every_block_is_run_or_shown():
    """A block is run (bash, sh, console, python) or shown (text, json, yaml, toml); an untagged block fails, so
    an author decides which it is."""
    untagged = [b.where for b in all_blocks() if b.lang not in RUN_LANGS | SHOWN_LANGS]
    assert not untagged, f"blocks without a known language (use ```text for output): {untagged}"


def test_every_rule_is_used():
    texts = [(b.block.doc, b.text) for block in all_blocks() if block.lang in SHELL_LANGS for b in commands(block)]
    texts += [(b.doc, b.text) for b in all_blocks() if b.lang == "python"]
    unused = [rule for rule in RULES if not any(rule.matches(doc, text) for doc, text in texts)]
    unused += [needs for needs in NEEDS
               if not any(doc == needs.doc and re.search(needs.pattern, text) for doc, text in texts)]
    assert not unused, f"rules that match no command or block any more (remove them): {unused}"
    blocks = [(b.doc, b.text) for b in all_blocks() if b.lang == "python"]
    unused_given = [g for g in GIVEN
                    if not any(d == g.doc and re.search(g.pattern, t, re.MULTILINE) for d, t in blocks)]
    assert not unused_given, f"Given entries that match no Python block any more (remove them): {unused_given}"


def test_shown_data_blocks_parse():
    """JSON, YAML and TOML shown to the reader are valid (a ``...`` line marks an abridged block)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    for block in all_blocks():
        if "..." in block.text:
            continue
        if block.lang == "json":
            json.loads(block.text)
        elif block.lang == "yaml":
            yaml.safe_load(block.text)
        elif block.lang == "toml":
            tomllib.loads(block.text)


def test_checkpoint_names_in_the_docs_are_the_ones_written():
    """Every checkpoint directory name a document shows is what paddletrain.checkpoint.checkpoint_name writes."""
    from paddletrain.checkpoint import checkpoint_name

    for path in doc_files():
        for match in re.finditer(r"\bepoch[\w=.-]*?step[=_-]?\d+", path.read_text(encoding="utf-8")):
            epoch, step = (int(n) for n in re.findall(r"\d+", match.group(0))[:2])
            assert match.group(0) == checkpoint_name(epoch, step), f"{path.name}: {match.group(0)}"


def test_fit_commands_not_run_here_still_compose(tmp_path, monkeypatch):
    """A `python -m paddletrain.fit` the default suite does not run (skipped, left to the slow suite, or in a
    document whose shrunk run is slow) is still parsed as Hydra parses it, composed and validated, so a renamed key
    or preset in it fails here. The documents' module files (``# my_callbacks.py``) are importable, as in a run."""
    module_names = set()
    for block in all_blocks():
        if file_block_name(block):
            (tmp_path / file_block_name(block)).write_text(block.text)
            module_names.add(file_block_name(block)[:-3])
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        _compose_every_fit_command_not_run_here()
    finally:  # the documents' modules (my_callbacks, ...) are not left imported for later tests
        for name in module_names:
            sys.modules.pop(name, None)


def _compose_every_fit_command_not_run_here() -> None:
    from hydra import compose, initialize_config_module
    from hydra._internal.utils import get_args_parser  # Hydra's own command-line parser (what fit.py runs)

    from paddletrain.validation import validate_config

    checked = 0
    for block in all_blocks():
        if block.lang not in SHELL_LANGS:
            continue
        for command in commands(block):
            rule = rule_for(block.doc, command.text)
            # the command alone, without what a shell adds after it (`&& ...`, `| ...`)
            text = re.sub(r"\$(\w+)", lambda m: SHELL_VALUES.get(m.group(1), m.group(0)), command.text)
            fit = _SHRUNK.match(re.sub(r"<[^<>]+>", "x", text))
            runs_here = runs_in(rule, slow=False) and block.doc in FAST_DOCS
            shows_an_error = any("[ERROR]" in line for line in command.expected)  # a transcript of a mistake
            if (fit is None or not fit["cmd"].startswith("python -m paddletrain.fit") or runs_here
                    or shows_an_error or (rule is not None and not rule.composes)):
                continue
            args = get_args_parser().parse_args(shlex.split(fit["cmd"])[3:])
            extra = [f"hydra.searchpath=[file://{ROOT / args.config_dir}]"] if args.config_dir else []
            for overrides in _sweep_runs(args.overrides, args.multirun):
                with initialize_config_module("paddletrain.conf", version_base="1.3"):
                    cfg = compose("fit", overrides=overrides + extra)
                validate_config(cfg)
                checked += 1
    assert checked >= 40


# Values of the shell variables documented `fit` commands use: a row's seed (0, 1, 2), a free port.
SHELL_VALUES = {"SEED": "0", "PORT": "29500"}


def _sweep_runs(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The overrides of each run a command starts: one run, or with ``--multirun`` one per combination of the
    swept values (``optim.lr=0.1,0.05``), as Hydra's basic sweeper expands them."""
    if not multirun:
        return [list(overrides)]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    choices = [_swept_values(o) for o in OverridesParser.create().parse_overrides(overrides)]
    return [list(run) for run in itertools.product(*choices)]


def _swept_values(override) -> list[str]:
    """An override's runs: itself, each value of a choice or range, or the two ends of an Optuna search's
    interval (``tag(log,interval(1e-4,3e-2))``; integers under ``tag(int, ...)``)."""
    from hydra.core.override_parser.types import IntervalSweep

    if not override.is_sweep_override():
        return [override.input_line]
    key, value = override.get_key_element(), override.value()
    if isinstance(value, IntervalSweep):
        ends = [int(v) if "int" in value.tags else v for v in (value.start, value.end)]
        return [f"{key}={end}" for end in ends]
    return [f"{key}={item}" for item in override.sweep_string_iterator()]


def test_a_ship_report_is_shrunk_in_the_fast_run_and_left_as_written_otherwise():
    command = "python -m paddletrain.ship checkpoint=run:best out_dir=ship"
    assert shrink(command) == f"{command} {' '.join(SMALL_SHIP)}"
    assert shrink("python -m paddletrain.ship --help") == "python -m paddletrain.ship --help"
