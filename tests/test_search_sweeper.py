"""The paddletrain_optuna sweeper end to end on the embedded data: a study, its reports, pruning, failures, and a sweep
that is killed and run again with the same command."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

optuna = pytest.importorskip("optuna", reason="the search extra (pip install paddletrain[search]) is not installed")

from visualdl import LogReader  # noqa: E402

from paddletrain.devices import usable_cores  # noqa: E402
from tests.conftest import TINY, run_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SWEEP = ["hydra/sweeper=paddletrain_optuna", "hydra.sweeper.seed=0", "trainer.limit_train_batches=4",
         "trainer.max_epochs=3", "trainer.limit_val_batches=2"]


def _sweep(tmp_path: Path, *extra: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return run_module("paddletrain.fit", ["-m", *TINY, *SWEEP, *extra, f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                      cwd=tmp_path, timeout=timeout)


def _other_seed(seed: int) -> list[str]:
    """SWEEP with the sampler's seed ``seed`` (Hydra refuses a key given twice)."""
    return [f"hydra.sweeper.seed={seed}" if arg.startswith("hydra.sweeper.seed=") else arg for arg in SWEEP]


def _study(tmp_path: Path) -> dict:
    return json.loads((tmp_path / "sweep" / "study.json").read_text())


def _hparams(run_dir: Path) -> dict[str, float | str]:
    [name] = [f for f in os.listdir(run_dir / "visualdl") if "vdlrecords" in f]
    [record] = LogReader(file_path=str(run_dir / "visualdl" / name)).get_data("hyper_parameters", "hparam")
    return {info.name: info.float_value or info.string_value for info in record.hparam.hparamInfos}


def test_a_study_runs_its_trials_and_writes_its_reports(tmp_path):
    result = _sweep(tmp_path, "optim.lr=tag(log,interval(1e-3,0.3))", "loss.label_smoothing=interval(0,0.2)",
                    "hydra.sweeper.n_trials=3", "hydra.sweeper.pruner=none")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    sweep = tmp_path / "sweep"
    study = _study(tmp_path)
    assert [t["state"] for t in study["trials"]] == ["COMPLETE"] * 3
    assert len({t["params"]["optim.lr"] for t in study["trials"]}) == 3
    assert all(0.001 <= t["params"]["optim.lr"] <= 0.3 for t in study["trials"])
    for trial in study["trials"]:
        run_dir = Path(trial["run_dir"])
        summary = json.loads((run_dir / "summary.json").read_text())
        assert trial["value"] == pytest.approx(summary["best"]["value"])  # the objective: the best val/top1
        # VisualDL's hyper-parameter view compares the trials by what they sampled, not by the sweep's plumbing
        hparams = _hparams(run_dir)
        assert hparams["lr"] == pytest.approx(trial["params"]["optim.lr"], rel=1e-6)
        assert hparams["label_smoothing"] == pytest.approx(trial["params"]["loss.label_smoothing"], rel=1e-6)
        assert not any("optuna" in name for name in hparams)
    best = min(study["trials"], key=lambda t: -t["value"])
    best_yaml = (sweep / "best.yaml").read_text()
    assert f"number {best['number']}" in best_yaml and "lr:" in best_yaml and "label_smoothing:" in best_yaml
    assert (sweep / "optimization_history.png").stat().st_size > 1000
    table = (sweep / "study.md").read_text()
    assert "| trial | state |" in table and table.count("| COMPLETE |") == 3


@pytest.mark.slow  # a study, then the rerun of its best trial (16-26 s); the study's own test stays by default
def test_best_yaml_reruns_the_best_trial_as_it_is(tmp_path):
    # a group choice and a value searched, beside fixed values and a fixed group choice
    result = _sweep(tmp_path, "optim.lr=choice(0.05,0.2)", "model=choice(resnet20,resnet32)", "optim=sgd",
                    "hydra.sweeper.sampler=grid", "hydra.sweeper.n_trials=4", "hydra.sweeper.pruner=none")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    trials = _study(tmp_path)["trials"]
    assert sorted((t["params"]["model"], t["params"]["optim.lr"]) for t in trials) == [  # the grid, each point once
        ("resnet20", 0.05), ("resnet20", 0.2), ("resnet32", 0.05), ("resnet32", 0.2)]
    best = max(trials, key=lambda t: t["value"])
    rerun = run_module("paddletrain.fit", ["--config-dir", str(tmp_path / "sweep"), "--config-name", "best",
                                           f"hydra.run.dir={tmp_path / 'rerun'}"], cwd=tmp_path)
    assert rerun.returncode == 0, (rerun.stdout + rerun.stderr)[-3000:]
    config = (tmp_path / "rerun" / ".hydra" / "config.yaml").read_text()
    assert f"name: {best['params']['model']}" in config and "name: sgd" in config
    summary = json.loads((tmp_path / "rerun" / "summary.json").read_text())
    first = json.loads((Path(best["run_dir"]) / "summary.json").read_text())
    assert summary["best"]["value"] == first["best"]["value"] and summary["train/loss"] == first["train/loss"]


def test_pruned_trials_end_cleanly_keep_their_checkpoint_and_count_as_pruned(tmp_path):
    # A pruner whose verdict does not depend on the values: every trial below 1.01 after its first epoch.
    result = _sweep(tmp_path, "optim.lr=interval(0.01,0.1)", "hydra.sweeper.n_trials=2",
                    "hydra.sweeper.pruner={name:threshold,lower:1.01,n_warmup_steps:0}")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    trials = _study(tmp_path)["trials"]
    assert [t["state"] for t in trials] == ["PRUNED", "PRUNED"]
    for trial in trials:
        run_dir = Path(trial["run_dir"])
        pruned = json.loads((run_dir / "pruned.json").read_text())
        assert pruned["pruned"] is True and pruned["epochs"] == trial["pruned_step"] == 1
        assert pruned["global_step"] == 4 and pruned["value"] < 1.01  # 4 batches of its first epoch
        assert [p.name for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("epoch")]
        assert json.loads((run_dir / "summary.json").read_text())["epochs"] == 1  # stopped after epoch 1 of 3
        # one progress line per trial: its number, values, outcome, the best so far
        assert f"Trial {trial['number']} (optim.lr=" in output and "pruned after epoch 1" in output
    assert "best so far: none yet | 2 of 2 trials done" in output
    assert not (tmp_path / "sweep" / "best.yaml").exists()  # no trial completed: no best to run


def test_a_failing_trial_counts_as_failed_and_the_study_goes_on(tmp_path):
    # A NaN loss from the first step (lr far too large for plain SGD without clipping) ends a trial with an error.
    result = _sweep(tmp_path, "optim.lr=choice(0.05,1e30)", "hydra.sweeper.sampler=grid", "hydra.sweeper.n_trials=2",
                    "hydra.sweeper.pruner=none", "trainer.max_consecutive_nonfinite=1")
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    states = {t["params"]["optim.lr"]: t["state"] for t in _study(tmp_path)["trials"]}
    assert states == {0.05: "COMPLETE", 1e30: "FAIL"}
    logs = list((tmp_path / "sweep" / "logs").iterdir())
    assert len(logs) == 2 and any("ERROR" in log.read_text() for log in logs)


def test_parallel_trials_run_at_once_each_with_its_share_of_the_cores(tmp_path):
    tiny = [o for o in TINY if not o.startswith("trainer.cpu_threads=")]
    result = run_module("paddletrain.fit", ["-m", *tiny, *SWEEP, "optim.lr=interval(0.01,0.1)",
                                            "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=2",
                                            "hydra.sweeper.pruner=none", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
                        cwd=tmp_path, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    first, second = _study(tmp_path)["trials"]
    assert first["state"] == second["state"] == "COMPLETE"
    assert first["started"] < second["finished"] and second["started"] < first["finished"]  # they overlapped
    share = f"trainer.cpu_threads={max(1, usable_cores() // 2)}"
    for trial in (first, second):
        assert share in (Path(trial["run_dir"]) / ".hydra" / "overrides.yaml").read_text()


@pytest.mark.parametrize(("extra", "message"), [
    (["optim.lr=interval(-1,0.3)"], "optim.lr must be > 0"),
    (["optim.lr=interval(0.01,0.1)", "hydra.sweeper.sampler=annealing"], "annealing"),
    (["optim.lr=interval(0.01,0.1)", "hydra.sweeper.sampler=grid"], "an interval has no grid"),
    (["optim.lr=interval(0.01,0.1)", "hydra.sweeper.pruner=wait"], "hydra.sweeper.pruner"),
    (["optim.lr=interval(0.01,0.1)", "hydra.sweeper.n_trails=3"], "n_trails"),
    (["optim.lr=interval(0.01,0.1)", "optim.lrr=0.1"], "optim.lrr"),
    (["optim.lrr=interval(0.01,0.1)"], "the search reaches optim.lrr=0.01, which fit refuses: unknown config key"),
    (["trainer.max_epochs=interval(1,3)"], "the search reaches trainer.max_epochs=1.0"),  # not tag(int, ...)
])
def test_a_mistake_is_refused_in_one_line_before_any_trial(tmp_path, extra, message):
    result = _sweep(tmp_path, *extra)
    output = result.stdout + result.stderr
    assert result.returncode == 2 and message in output and "Traceback" not in output, output[-2000:]
    assert not list((tmp_path / "sweep").glob("trial_*"))


def _kill(sweep: subprocess.Popen, what: str) -> None:
    """SIGKILL the search and its trial at once ("both": a lost node), the search alone (its trial stops, saving,
    when its parent dies) or the trial alone (the OOM killer)."""
    if what == "both":
        os.killpg(sweep.pid, signal.SIGKILL)
        return
    trial = next(p for p in psutil.Process(sweep.pid).children() if "paddletrain" in " ".join(p.cmdline()))
    os.kill(sweep.pid if what == "search" else trial.pid, signal.SIGKILL)
    if what == "search":
        trial.wait(timeout=120)  # it saves a checkpoint at its step's end, then stops


@pytest.mark.slow
@pytest.mark.parametrize("killed", ["both", "search", "trial"])
def test_a_killed_trial_continues_exactly_with_the_same_command(tmp_path, killed):
    """SIGKILL in the second trial; that trial is handed on to a new one that continues its run directory from the
    checkpoint (in the same search when only the trial was killed, else when the same command runs again), and its
    final weights equal those of an undisturbed run."""
    args = ["-m", *TINY, *SWEEP, "optim.lr=interval(0.01,0.1)", "hydra.sweeper.n_trials=2",
            "hydra.sweeper.pruner=none", "trainer.max_epochs=4", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    command = [sys.executable, "-m", "paddletrain.fit", *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    sweep = subprocess.Popen(command, cwd=tmp_path, env=env, start_new_session=True)
    second = tmp_path / "sweep" / "trial_0001" / "checkpoints"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not (second.is_dir() and any(p.name.startswith("epoch")
                                                                       for p in second.iterdir())):
        time.sleep(0.1)
    _kill(sweep, killed)
    sweep.wait(timeout=600)
    assert subprocess.run(command, cwd=tmp_path, env=env, timeout=600).returncode == 0  # the same command again
    trials = _study(tmp_path)["trials"]
    assert [(t["state"], t["continues"]) for t in trials] == [("COMPLETE", None), ("FAIL", None), ("COMPLETE", 1)]
    stopped, continued = trials[1], trials[2]
    assert continued["params"] == stopped["params"] and continued["run_dir"] == stopped["run_dir"]
    summary = json.loads((Path(continued["run_dir"]) / "summary.json").read_text())
    assert summary.get("resumed_from") and summary["epochs"] == 4  # continued from a checkpoint, not started again
    # the undisturbed twin: the same overrides, one fit
    twin = tmp_path / "twin"
    result = run_module("paddletrain.fit", [*TINY, *SWEEP[2:], "trainer.max_epochs=4",
                                            f"optim.lr={continued['params']['optim.lr']!r}", f"hydra.run.dir={twin}"],
                        cwd=tmp_path)
    assert result.returncode == 0
    from paddletrain.checkpoint import load_checkpoint

    def weights(run_dir: Path) -> dict:
        last = sorted(p for p in (run_dir / "checkpoints").iterdir() if p.name.startswith("epoch"))[-1]
        return load_checkpoint(last).state["model"]

    mine, theirs = weights(Path(continued["run_dir"])), weights(twin)
    assert mine.keys() == theirs.keys()
    assert all(np.array_equal(np.asarray(mine[k]), np.asarray(theirs[k])) for k in mine)


@pytest.mark.slow  # three short trials, a kill, the command again (about a minute)
def test_a_seeded_search_killed_and_run_again_trains_no_finished_trials_parameters(tmp_path):
    """The issue's case: `n_trials=3`, `seed=3`, killed in trial 1 and run again; the new trial after the handed-on
    one was trial 0's twin, bit for bit."""
    args = ["-m", *TINY, *_other_seed(3), "optim.lr=tag(log,interval(1e-4,3e-2))",
            "hydra.sweeper.n_trials=3", "hydra.sweeper.pruner=none", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    command = [sys.executable, "-m", "paddletrain.fit", *args]
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    sweep = subprocess.Popen(command, cwd=tmp_path, env=env, start_new_session=True)
    second = tmp_path / "sweep" / "trial_0001"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not second.is_dir():
        time.sleep(0.1)
    _kill(sweep, "both")
    sweep.wait(timeout=600)
    assert subprocess.run(command, cwd=tmp_path, env=env, timeout=600).returncode == 0
    trained = [t["params"]["optim.lr"] for t in _study(tmp_path)["trials"]
               if t["state"] == "COMPLETE" and not t.get("duplicate_of")]
    assert len(trained) == 3 and len(set(trained)) == 3, _study(tmp_path)["trials"]


def test_a_trial_another_sweep_finishes_during_the_count_is_counted_once():
    from types import SimpleNamespace

    from paddletrain.search.sweeper import running, spent, taken

    RUNNING, COMPLETE = optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.COMPLETE

    class FinishedAfterTheFirstRead:
        """A study whose one trial another sweep finishes right after the first read of it."""

        def __init__(self):
            self.reads = 0

        def get_trials(self, deepcopy=False, states=None):
            state = RUNNING if self.reads == 0 else COMPLETE
            self.reads += 1
            trials = [SimpleNamespace(number=0, state=state, system_attrs={}, user_attrs={})]
            return [t for t in trials if states is None or t.state in states]

    # Counted in two reads, the trial is in neither (spent saw it running, running saw it finished): the sweeps
    # would ask for one trial too many between them. One read counts it once.
    study = FinishedAfterTheFirstRead()
    assert spent(study) + running(study) == 0
    assert taken(FinishedAfterTheFirstRead()) == 1


def _journal_study(path: Path, seed: int, space, sampler: str = "tpe"):
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend

    from paddletrain.search.sweeper import make_sampler

    return optuna.create_study(study_name="s", storage=JournalStorage(JournalFileBackend(str(path))),
                               sampler=make_sampler({"name": sampler}, seed, space), load_if_exists=True)


def test_a_seeded_study_continued_or_extended_never_proposes_a_finished_trials_parameters(tmp_path):
    """Each new study object stands for a sweep run again (after a kill, or with a larger n_trials) or a second
    sweep on the same storage: with the seed alone, its sampler replayed the seed's stream from the start."""
    from paddletrain.search.space import parse_space
    from paddletrain.search.sweeper import ask_unseen

    space = parse_space(["optim.lr=tag(log,interval(1e-4,3e-2))"])
    journal = tmp_path / "journal.log"
    proposed = []
    for _sweep_run in range(3):  # three runs of the same command, one trial each
        study = _journal_study(journal, seed=3, space=space)
        handle = ask_unseen(study, space, {"name": "tpe"}, seed=3)
        proposed.append(handle.params["optim.lr"])
        study.tell(handle, 0.5)
    assert len(set(proposed)) == 3, proposed
    # Without the trial count in the seed, the runs replay: every run's first proposal is the same.
    replayed = [_journal_study(tmp_path / f"r{i}.log", 3, space).ask(space.distributions).params for i in range(2)]
    assert replayed[0] == replayed[1]


def test_two_seeded_sweeps_on_one_database_propose_different_parameters(tmp_path):
    """Two machines running the same seeded command against one database, their trials interleaved: with the seed
    alone, both drew the same stream and trained the same values side by side."""
    from paddletrain.search.space import parse_space
    from paddletrain.search.sweeper import ask_unseen, make_sampler

    space = parse_space(["optim.lr=tag(log,interval(1e-4,3e-2))"])
    url = f"sqlite:///{tmp_path / 'study.db'}"
    sweeps = [optuna.create_study(study_name="s", storage=url, sampler=make_sampler({"name": "tpe"}, 3, space),
                                  load_if_exists=True) for _machine in range(2)]
    proposed = []
    for _round in range(3):
        handles = [(study, ask_unseen(study, space, {"name": "tpe"}, seed=3)) for study in sweeps]  # both running
        for study, handle in handles:
            proposed.append(handle.params["optim.lr"])
            study.tell(handle, 0.5)
    assert len(set(proposed)) == 6, proposed


def test_a_proposal_equal_to_a_finished_trial_reuses_its_outcome_and_is_not_counted(tmp_path):
    from paddletrain.search.space import parse_space
    from paddletrain.search.sweeper import DUPLICATE_ATTR, ask_unseen, spent

    space = parse_space(["data.batch_size=choice(8,16)"])
    study = _journal_study(tmp_path / "j.log", seed=4, space=space)  # seed 4: three proposals repeat trial 0's
    first = study.ask(space.distributions)
    study.tell(first, 0.7)
    handle = ask_unseen(study, space, {"name": "random"}, seed=4)
    assert handle.params["data.batch_size"] != first.params["data.batch_size"]
    duplicates = [t for t in study.get_trials() if DUPLICATE_ATTR in t.user_attrs]
    assert duplicates and all(t.params == first.params and t.value == 0.7 and t.user_attrs[DUPLICATE_ATTR] == 0
                              for t in duplicates)
    assert spent(study) == 1  # the duplicates trained nothing and do not count against n_trials


@pytest.mark.slow  # three short trials in two sweeps (about a minute)
def test_an_extended_seeded_search_trains_new_parameters_as_the_issue_ran_it(tmp_path):
    """`n_trials=2`, then the same command with `n_trials=3`: the third trial was the first's twin, bit for bit."""
    space = ["optim.lr=tag(log,interval(1e-4,3e-2))", "hydra.sweeper.pruner=none"]
    for n_trials in (2, 3):
        result = run_module("paddletrain.fit", ["-m", *TINY, *_other_seed(3), *space,
                                                f"hydra.sweeper.n_trials={n_trials}",
                                                f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path, timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
    trials = _study(tmp_path)["trials"]
    trained = [t["params"]["optim.lr"] for t in trials if t["state"] == "COMPLETE" and not t.get("duplicate_of")]
    assert len(trained) == 3 and len(set(trained)) == 3, trials


def test_a_seeded_grid_search_continued_visits_each_point_once(tmp_path):
    """The grid sampler maps trial numbers to the points of a grid it shuffled with its seed: it is not reseeded
    (reseeded, a continued grid search proposed visited points again)."""
    from paddletrain.search.space import parse_space
    from paddletrain.search.sweeper import _tell, ask_unseen

    space = parse_space(["optim.lr=choice(0.05,0.2)", "data.batch_size=choice(8,16)"])
    points = []
    for _sweep_run in range(4):  # the same command run four times, one trial each
        study = _journal_study(tmp_path / "journal.log", seed=0, space=space, sampler="grid")
        handle = ask_unseen(study, space, {"name": "grid"}, seed=0)
        points.append((handle.params["optim.lr"], handle.params["data.batch_size"]))
        _tell(study, handle, 0.5)  # the last asks the study to stop, as the sweep's own tell allows
    assert sorted(points) == [(0.05, 8), (0.05, 16), (0.2, 8), (0.2, 16)]
    # and no proposal repeated a visited point (each would be a trial told its twin's result)
    assert len(study.get_trials()) == 4
