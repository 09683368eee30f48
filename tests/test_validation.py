"""paddletrain.validation: one validation per process, at the entry point, cheapest first; the rules that compare
keys fire before any data is read, naming their keys."""
from __future__ import annotations

import collections
import copy
import os

import pytest
from hydra import compose, initialize_config_module
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict, read_write

from paddletrain import validation
from paddletrain.build import train
from paddletrain.job.rundir import release_run_dir
from paddletrain.registry import CALLBACKS
from paddletrain.validation import (
    VALIDATED_ENV,
    RunDirGuard,
    validate_config,
    validate_once,
    validated_marker,
)
from tests.conftest import TINY, compose_fit, run_module

# A shrunk run with every default callback on (progress bar, LR monitor, VisualDL, checkpoint).
RUN = [*TINY, "data.shapes.num_train=32", "data.shapes.num_val=16", "trainer.limit_val_batches=1"]


@pytest.fixture
def counts(monkeypatch):
    """How often validate_config ran and each registered callback class was constructed."""
    calls: collections.Counter = collections.Counter()
    real_validate = validation.validate_config

    def counting_validate(cfg, use="fit"):
        calls["validate_config"] += 1
        return real_validate(cfg, use)

    monkeypatch.setattr(validation, "validate_config", counting_validate)
    for name in CALLBACKS.names():
        cls = CALLBACKS.get(name)

        def counting_init(self, *args, __init=cls.__init__, __name=name, **kwargs):
            calls[__name] += 1 if type(self) is CALLBACKS.get(__name) else 0
            __init(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", counting_init)
    monkeypatch.delenv(VALIDATED_ENV, raising=False)
    validation._last = None
    yield calls
    validation._last = None


@pytest.fixture
def no_hydra_state():
    """RunDirGuard sets Hydra's global config and takes the run directory's lock: undo both afterwards."""
    yield
    HydraConfig.instance().cfg = None
    release_run_dir()


def _guarded_task(overrides: list[str], run_dir) -> object:
    """What `python -m paddletrain.fit <overrides>` does before its task: RunDirGuard on the composed config,
    then the task's own copy without the hydra node."""
    with initialize_config_module("paddletrain.conf", version_base="1.3"):
        config = compose("fit", overrides=[*overrides, f"hydra.run.dir={run_dir}"], return_hydra_config=True)
    with open_dict(config):
        config.hydra.runtime.output_dir = str(run_dir)
    RunDirGuard().on_run_start(config)
    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        del task["hydra"]
    return task


CONFIGURED = ("progress_bar", "lr_monitor", "history", "visualdl", "checkpoint")


@pytest.mark.parametrize("entry", ["command line", "python api"])
def test_a_run_validates_once_and_builds_each_callback_once(entry, counts, no_hydra_state, tmp_path):
    run_dir = tmp_path / "run"
    cfg = _guarded_task(RUN, run_dir) if entry == "command line" else compose_fit(RUN)
    metrics = train(cfg, run_dir)
    assert "val/top1" in metrics  # it trained
    assert counts["validate_config"] == 1
    assert {name: counts[name] for name in CONFIGURED} == dict.fromkeys(CONFIGURED, 1)  # before: 4 each


def test_validation_builds_nothing_and_remembers_its_verdict(counts):
    cfg = compose_fit(RUN)
    validation.validate_config(cfg)
    assert {name: counts[name] for name in CONFIGURED} == dict.fromkeys(CONFIGURED, 0)  # checked, not built
    validate_once(cfg)
    assert counts["validate_config"] == 1  # the config stays validated


def test_ranks_inherit_their_launchers_verdict_for_the_same_config_only(counts, monkeypatch):
    parent = compose_fit(RUN)
    monkeypatch.setenv(VALIDATED_ENV, validated_marker(parent))
    # A rank composes the launcher's overrides plus its own hydra keys (fit.launch_workers).
    rank = compose_fit([*RUN, "hydra.run.dir=/elsewhere", "hydra.output_subdir=null"])
    validate_once(rank)
    assert counts["validate_config"] == 0
    validate_once(compose_fit([*RUN, "optim.lr=0.5"]))  # not the config the launcher validated
    assert counts["validate_config"] == 1
    validate_once(parent, use="evaluate")  # validated for another use
    assert counts["validate_config"] == 2


# Loaded at start-up by every process of the job below (sitecustomize): says when a process validates.
_COUNTING_SITE = """
import os, sys
import paddletrain.validation
_validate = paddletrain.validation.validate_config
def _counting(cfg, use="fit"):
    print(f"VALIDATE rank={os.environ.get('PADDLE_TRAINER_ID', 'launcher')}", file=sys.stderr, flush=True)
    return _validate(cfg, use)
paddletrain.validation.validate_config = _counting
"""


@pytest.mark.slow
def test_a_two_rank_job_validates_once_in_its_launcher(tmp_path):
    """The real job (about 40 s on 2 busy cores); the default suite checks the same hand-over in
    test_ranks_inherit_their_launchers_verdict_for_the_same_config_only."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_COUNTING_SITE)
    run_dir = tmp_path / "run"
    pythonpath = os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])
    result = run_module("paddletrain.fit", [*RUN, "data.batch_size=8", "trainer.devices=2",
                                            f"hydra.run.dir={run_dir}"], cwd=tmp_path, timeout=300,
                        env={"PYTHONPATH": pythonpath})
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    logs = result.stderr + "".join(p.read_text() for p in (run_dir / "launch").glob("workerlog.*"))
    assert [line for line in logs.splitlines() if line.startswith("VALIDATE")] == ["VALIDATE rank=launcher"]


# Rules that compare keys (they used to fire in the builders, after the data and the model were built).
KEY_RULES = [
    (["optim=adamw", "optim.nesterov=true"], "optim.nesterov applies to optim.name=sgd only, not 'adamw'"),
    (["optim=sgd", "optim.momentum=0", "optim.nesterov=true"], "optim.nesterov needs optim.momentum > 0"),
    (["loss.target_threshold=0.2"], "loss.target_threshold applies to loss.name=binary_cross_entropy only, not "
                                    "'cross_entropy'"),
    (["loss.name=focal", "loss.bce_sum=true"], "loss.bce_sum applies to loss.name=binary_cross_entropy only, not "
                                               "'focal'"),
    (["sched=cosine", "optim.lr=0.01", "sched.min_lr=0.1"], "sched.min_lr=0.1 must be <= optim.lr=0.01"),
    (["sched=cosine", "optim.lr=0.1", "optim.base_batch_size=256", "sched.min_lr=0.05", "optim.scale_lr=true"],
     "sched.min_lr=0.05 must be <= optim.lr=0.00625 (optim.lr=0.1 scaled to the global batch)"),
    (["sched.name=multistep", "sched.milestones=[5,3]"], "sched.milestones must be strictly increasing epochs, "
                                                         "got [5, 3]"),
]


@pytest.mark.parametrize("overrides, line", KEY_RULES, ids=[" ".join(o) for o, _ in KEY_RULES])
def test_rules_that_compare_keys_fire_before_the_data_is_read(overrides, line, monkeypatch, tmp_path):
    def no_data(*args, **kwargs):
        raise AssertionError("the data was opened before the config was refused")

    monkeypatch.setattr("paddletrain.build.build_datasets", no_data)
    monkeypatch.delenv(VALIDATED_ENV, raising=False)
    with pytest.raises(validation.ConfigError) as info:
        train(compose_fit([*TINY, *overrides]), tmp_path / "run")
    assert str(info.value) == line
    assert not (tmp_path / "run").exists()
    validate_config(compose_fit([*TINY, *overrides[:-1]]))  # the last key is what the rule refuses
