"""comparisons/search.py: one study with its pruner and without, and the config's own values, run through the fit
command line and read back: steps, best values, goals."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest.importorskip("optuna", reason="the search extra (pip install paddletrain[search]) is not installed")

from comparisons.search import SearchCompareConfig, run_search, study_row  # noqa: E402
from paddletrain.bench.report import to_markdown  # noqa: E402
from tests.conftest import TINY  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_a_studys_row_counts_the_steps_of_every_trial_that_trained(tmp_path):
    runs = []
    for number, (state, steps) in enumerate([("COMPLETE", 40), ("PRUNED", 10), ("FAIL", 0), ("COMPLETE", 40)]):
        run_dir = tmp_path / f"trial_{number}"
        run_dir.mkdir()
        if state != "FAIL":
            (run_dir / "summary.json").write_text(json.dumps({"global_step": steps}))
        runs.append({"number": number, "state": state, "params": {"optim.lr": 0.01 * (number + 1)},
                     "value": {0: 0.5, 3: 0.75}.get(number), "duration_seconds": 30.0, "run_dir": str(run_dir)})
    (tmp_path / "pruned").mkdir()
    (tmp_path / "pruned" / "study.json").write_text(json.dumps({"trials": runs}))
    row = study_row("pruned", tmp_path)
    assert row["training steps"] == 90 and (row["pruned"], row["failed"]) == (1, 1)
    assert (row["best"], row["best trial"], row["best values"]) == (0.75, 3, "optim.lr=0.04")
    assert row["minutes"] == 2.0


def test_the_goals_hold_at_their_bounds_and_fail_past_them():
    from comparisons.search import goals_of

    at_bounds = goals_of({"steps pruned / unpruned": 0.5, "best unpruned - best pruned": round(0.7537 - 0.7487, 4),
                          "best pruned - defaults": 0.0001})
    assert [goal["met"] for goal in at_bounds] == [True, True, True]
    past = goals_of({"steps pruned / unpruned": 0.501, "best unpruned - best pruned": 0.0051,
                     "best pruned - defaults": 0.0})
    assert [goal["met"] for goal in past] == [False, False, False]


@pytest.mark.slow
def test_the_comparison_runs_both_studies_and_the_baseline_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")
    cfg = SearchCompareConfig(
        study=["--config-dir", str(ROOT / "configs"), "+hparams_search=shapes_optuna"],
        overrides=[*TINY, "hydra.sweeper.n_trials=3", "trainer.max_epochs=2", "trainer.limit_train_batches=3",
                   "trainer.limit_val_batches=2", "hydra.sweeper.pruner={name:threshold,lower:1.01,n_warmup_steps:0}"],
        out_dir=str(tmp_path / "compare"))
    result = run_search(cfg)
    pruned, unpruned, defaults = result["rows"]
    assert [row["run"] for row in result["rows"]] == ["pruned", "unpruned", "defaults"]
    # every pruned trial stops after its first epoch (the threshold pruner): half the steps of the whole study
    assert (pruned["trials"], pruned["pruned"], unpruned["trials"], unpruned["pruned"]) == (3, 3, 3, 0)
    assert (pruned["training steps"], unpruned["training steps"], defaults["training steps"]) == (9, 18, 6)
    assert result["summary"]["steps pruned / unpruned"] == 0.5 and pruned["best"] is None
    assert unpruned["best"] is not None and defaults["best"] is not None
    assert "hydra.sweeper.pruner=none" in unpruned["command"] and "hydra.mode=RUN" in defaults["command"]
    markdown = to_markdown(result)
    assert "- goal the pruned study takes <= 50% of the unpruned one's training steps: measured" in markdown
    # finished runs are read, not run again
    study = tmp_path / "compare" / "pruned" / "study.json"
    before = os.stat(study).st_mtime_ns
    again = run_search(cfg)
    assert os.stat(study).st_mtime_ns == before and again["rows"] == result["rows"]
