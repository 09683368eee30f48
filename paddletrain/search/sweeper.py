"""``hydra/sweeper=paddletrain_optuna``: an Optuna study composed by Hydra, whose trials prune through the Trainer
and continue exactly after a kill.

    python -m paddletrain.fit -m hydra/sweeper=paddletrain_optuna 'optim.lr=tag(log,interval(1e-3,0.3))' \\
        'loss.label_smoothing=interval(0,0.2)' 'model=choice(resnet20,resnet32)' hydra.sweeper.n_trials=20

Each trial is one ``fit`` run in ``<sweep dir>/trial_<number>``: the sampled overrides, the fixed ones, the pruning
callback (:mod:`~paddletrain.search.pruning`) and ``trainer.resume=auto``. With ``n_jobs=1`` trials run through
Hydra's configured launcher (in this process by default); with ``n_jobs>1`` each trial is its own process of this
command, ``n_jobs`` at a time, each with its share of the CPU threads.

Killed and run again with the same command, the sweep opens the same study (its storage lives in the sweep
directory unless ``storage`` names a database): finished trials stay finished, and a trial that was running is
continued in its own run directory from its newest checkpoint (paddletrain's exact resume), so it ends with the
weights an undisturbed trial would have had. Across machines (a database ``storage``), a trial counts as abandoned
only once its heartbeat is stale, so a trial another machine is running is left alone.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from paddletrain.errors import ConfigError
from paddletrain.search.pruning import make_pruner, pruned_record
from paddletrain.search.report import write_reports
from paddletrain.search.space import SearchSpace, check_against_schema, parse_space
from paddletrain.search.storage import open_storage, storage_url

log = logging.getLogger("paddletrain")

SAMPLERS = ("tpe", "random", "grid", "cmaes", "qmc")
TRIAL_DIR = "trial_{number:04d}"
RUN_DIR_ATTR = "run_dir"


@dataclass
class Trial:
    """A trial to run: its Optuna handle, its overrides and its run directory."""

    handle: Any
    overrides: list[str]
    run_dir: Path


class PaddletrainOptunaSweeper(Sweeper):
    """Hydra's sweeper interface over an Optuna study (configured under ``hydra.sweeper``, see
    :class:`hydra_plugins.paddletrain_optuna.OptunaSweeperConf`)."""

    def __init__(self, sampler: dict[str, Any] | str = "tpe", pruner: dict[str, Any] | str = "median",
                 seed: int | None = None, n_trials: int = 20, n_jobs: int = 1, storage: str | None = None,
                 study_name: str | None = None, params: dict[str, str] | None = None) -> None:
        self.sampler_spec = {"name": sampler} if isinstance(sampler, str) else dict(sampler)
        self.pruner_spec = {"name": pruner} if isinstance(pruner, str) else dict(pruner)
        self.seed, self.n_trials, self.n_jobs = seed, int(n_trials), int(n_jobs)
        self.storage, self.study_name = storage, study_name
        self.params = dict(params or {})
        if self.n_trials < 1 or self.n_jobs < 1:
            raise ConfigError(f"hydra.sweeper.n_trials={n_trials} and hydra.sweeper.n_jobs={n_jobs} must be >= 1")
        if str(self.sampler_spec.get("name", "tpe")).lower() not in SAMPLERS:
            raise ConfigError(f"hydra.sweeper.sampler={self.sampler_spec.get('name')!r} is not one of "
                              f"{', '.join(SAMPLERS)}")
        make_pruner(self.pruner_spec)  # a bad pruner is refused before any trial
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.launcher: Any = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    # ---------------------------------------------------------------------------------------------- the study
    def _sampler(self) -> Any:
        import optuna

        spec = dict(self.sampler_spec)
        name = str(spec.pop("name", "tpe")).lower()
        if name == "tpe":
            return optuna.samplers.TPESampler(seed=self.seed, **spec)
        if name == "random":
            return optuna.samplers.RandomSampler(seed=self.seed)
        if name == "cmaes":
            return optuna.samplers.CmaEsSampler(seed=self.seed, **spec)
        if name == "qmc":
            return optuna.samplers.QMCSampler(seed=self.seed, **spec)
        return optuna.samplers.GridSampler(spec.pop("search_space", self._grid), seed=self.seed)

    def _direction(self) -> str:
        assert self.config is not None
        mode = OmegaConf.select(self.config, "monitor_mode", default="max")
        return "maximize" if mode == "max" else "minimize"

    def _open_study(self, sweep_dir: Path) -> Any:
        import optuna

        self.url = storage_url(self.storage, sweep_dir)
        name = self.study_name or OmegaConf.select(self.config, "name", default="paddletrain")
        return optuna.create_study(study_name=str(name), storage=open_storage(self.url), sampler=self._sampler(),
                                   pruner=make_pruner(self.pruner_spec), direction=self._direction(),
                                   load_if_exists=True)

    # ---------------------------------------------------------------------------------------------- the sweep
    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None
        space = parse_space(arguments, self.params)
        if not space.distributions:
            raise ConfigError("hydra/sweeper=paddletrain_optuna needs a search space: e.g. "
                              "'optim.lr=tag(log,interval(1e-3,0.3))' or hydra.sweeper.params")
        check_against_schema(space)
        self._grid = {k: list(getattr(d, "choices", [])) for k, d in space.distributions.items()}
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        study = self._open_study(sweep_dir)
        self._continue_abandoned(study, space, sweep_dir)
        while self._finished(study) < self.n_trials:
            room = min(self.n_jobs, self.n_trials - self._finished(study) - self._running(study))
            if room <= 0:
                break  # the rest are running elsewhere (another machine joined the study)
            batch = [self._new_trial(study, space, sweep_dir) for _ in range(room)]
            self._run(study, batch)
        write_reports(study, sweep_dir, space.fixed)
        return study

    @staticmethod
    def _finished(study: Any) -> int:
        import optuna

        done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
        return len(study.get_trials(deepcopy=False, states=done))

    @staticmethod
    def _running(study: Any) -> int:
        import optuna

        return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))

    def _new_trial(self, study: Any, space: SearchSpace, sweep_dir: Path) -> Trial:
        handle = study.ask(space.distributions)
        run_dir = sweep_dir / TRIAL_DIR.format(number=handle.number)
        handle.set_user_attr(RUN_DIR_ATTR, str(run_dir))
        return Trial(handle, self._overrides(space.overrides(handle.params), handle._trial_id, run_dir), run_dir)

    def _continue_abandoned(self, study: Any, space: SearchSpace, sweep_dir: Path) -> None:
        """Trials a killed sweep left running: each continues in its own run directory from its newest checkpoint."""
        import optuna

        if hasattr(study._storage, "fail_stale_trials") and not self.url.startswith("journal:"):
            stale = set(study._storage.fail_stale_trials(study._study_id))  # heartbeat missed: another machine died
        else:
            stale = None  # one machine: every trial still RUNNING belongs to the sweep that was killed
        abandoned = []
        for frozen in study.get_trials(deepcopy=False):
            running = frozen.state == optuna.trial.TrialState.RUNNING
            if not (running and stale is None) and not (stale and frozen._trial_id in stale):
                continue
            run_dir = Path(frozen.user_attrs.get(RUN_DIR_ATTR) or sweep_dir / TRIAL_DIR.format(number=frozen.number))
            handle = optuna.trial.Trial(study, frozen._trial_id)
            overrides = self._overrides(space.overrides(frozen.params), frozen._trial_id, run_dir)
            abandoned.append(Trial(handle, overrides, run_dir))
        if abandoned:
            log.info("Continuing %d trial(s) a previous sweep left running: %s", len(abandoned),
                     ", ".join(str(t.handle.number) for t in abandoned))
            for start in range(0, len(abandoned), self.n_jobs):
                self._run(study, abandoned[start:start + self.n_jobs])

    def _overrides(self, sampled: list[str], trial_id: int, run_dir: Path) -> list[str]:
        """A trial's command line: its values, its pruning callback, its own run directory, continued if begun."""
        monitor = OmegaConf.select(self.config, "monitor", default="val/top1")
        pruner = ",".join(f"{k}:{_plain(v)}" for k, v in self.pruner_spec.items())
        callback = (f"+callbacks.optuna_pruning={{storage:{_quoted(self.url)},study_name:"
                    f"{_quoted(self._study_name_of())},trial_id:{trial_id},monitor:{_quoted(monitor)},"
                    f"pruner:{{{pruner}}}}}")
        return [*sampled, callback, "trainer.resume=auto", f"hydra.run.dir={run_dir}",
                f"hydra.sweep.subdir={run_dir.name}"]

    def _study_name_of(self) -> str:
        return str(self.study_name or OmegaConf.select(self.config, "name", default="paddletrain"))

    # ---------------------------------------------------------------------------------------------- running
    def _run(self, study: Any, batch: list[Trial]) -> None:
        """Run ``batch`` (in Hydra's launcher one after another, or as ``n_jobs`` processes) and tell the study."""
        if self.n_jobs == 1:
            for trial in batch:
                (result,) = self.launcher.launch([trial.overrides], initial_job_idx=trial.handle.number)
                self._tell(study, trial, lambda r=result: r.return_value)
            return
        threads = max(1, (os.cpu_count() or 1) // len(batch))
        processes = [(trial, subprocess.Popen([sys.executable, *self._program(), *trial.overrides,
                                               f"trainer.cpu_threads={threads}"],
                                              env=dict(os.environ, HYDRA_FULL_ERROR="0")))
                     for trial in batch]
        for trial, process in processes:
            code = process.wait()
            self._tell(study, trial, lambda t=trial, c=code: _summary_value(t.run_dir, self.config, c))

    def _program(self) -> list[str]:
        """This command without its overrides: the script (``-m paddletrain.fit`` runs fit.py's file) and the
        config directories of this command line."""
        sources = HydraConfig.get().runtime.config_sources
        dirs = [f"--config-dir={Path(s.path).resolve()}" for s in sources
                if s.provider == "command-line" and s.schema == "file"]
        return [str(Path(sys.argv[0]).resolve()), *dirs]

    def _tell(self, study: Any, trial: Trial, value_of: Any) -> None:
        import optuna

        pruned = pruned_record(trial.run_dir)
        try:
            value = value_of()
        except Exception as exc:  # noqa: BLE001  (the trial failed: the study counts it, the sweep goes on)
            log.error("Trial %d failed: %s", trial.handle.number, exc)
            study.tell(trial.handle, state=optuna.trial.TrialState.FAIL)
            return
        if pruned is not None:
            study.tell(trial.handle, state=optuna.trial.TrialState.PRUNED)
        elif value is None:
            log.error("Trial %d ended without its monitored metric", trial.handle.number)
            study.tell(trial.handle, state=optuna.trial.TrialState.FAIL)
        else:
            study.tell(trial.handle, float(value))


def _summary_value(run_dir: Path, config: Any, code: int) -> float | None:
    """The monitored metric a trial process ended with, from its ``summary.json``."""
    import json

    if code != 0:
        raise RuntimeError(f"exit status {code} (see {run_dir})")
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary.get(OmegaConf.select(config, "monitor", default="val/top1"))


def _quoted(text: str) -> str:
    return "'" + str(text).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _plain(value: Any) -> str:
    return _quoted(value) if isinstance(value, str) else str(value)
