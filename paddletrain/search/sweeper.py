"""``hydra/sweeper=paddletrain_optuna``: an Optuna study composed by Hydra, whose trials prune through the Trainer
and continue exactly after a kill.

    python -m paddletrain.fit -m hydra/sweeper=paddletrain_optuna 'optim.lr=tag(log,interval(1e-3,0.3))' \\
        'loss.label_smoothing=interval(0,0.2)' 'model=choice(resnet20,resnet32)' hydra.sweeper.n_trials=20

Each trial is one ``fit`` command, a process of its own (``hydra.sweeper.n_jobs`` at a time, each with its share of
the cores), in ``<sweep dir>/trial_<number>``: the sampled overrides, the fixed ones, the pruning callback
(:mod:`~paddletrain.search.pruning`) and ``trainer.resume=auto``. A trial that fails (a bad value, a diverged loss)
counts as failed and the study goes on; the trial's console output is in ``<sweep dir>/logs/``.

Killed and run again with the same command, the sweep opens the same study: finished trials stay finished, and a
trial that was running is handed on to a new trial of the same parameters (Optuna's
``RetryHeartbeatStaleTrialCallback``, the reports it made so far included) that continues the same run directory
from its newest checkpoint, so that it ends with the weights an undisturbed trial would have had. On one machine
(the journal file) a trial counts as abandoned when no sweep holds the sweep directory; across machines (a
database) when its heartbeat, which the sweep that runs it records, is stale.
"""
from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import subprocess
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from paddletrain.cli import this_command
from paddletrain.devices import usable_cores
from paddletrain.errors import ConfigError, ExitCode
from paddletrain.job.processes import STOP_WITH_PARENT_ENV
from paddletrain.job.rundir import wait_until_free
from paddletrain.search.pruning import OptunaPruning, make_pruner, pruned_record
from paddletrain.search.report import DUPLICATE_ATTR, RUN_DIR_ATTR, RunConfig, write_reports
from paddletrain.search.space import SearchSpace, check_against_schema, check_in_config, grid_of, parse_space
from paddletrain.search.storage import Heartbeat, claiming, open_storage, retry_callback, storage_url

log = logging.getLogger("paddletrain")

TRIAL_DIR = "trial_{number:04d}"
LOCK_FILE = "sweep.lock"
SAMPLERS = ("tpe", "random", "grid", "cmaes", "qmc")
# How often a sweep with nothing left to start looks whether the trials running elsewhere have ended.
WAIT_SECONDS = 5
# How long a continued trial waits for the run it continues to let go of its run directory (a stopped run saves a
# checkpoint first).
CONTINUE_WAIT_SECONDS = 300


@dataclass
class Trial:
    """A trial to run: its Optuna handle, its command-line overrides, its run directory and console log."""

    handle: Any
    overrides: list[str]
    run_dir: Path
    log_file: Path


def sampler_name(spec: dict[str, Any]) -> str:
    """The sampler ``spec`` names, in lower case (``tpe`` when it names none)."""
    return str(spec.get("name", "tpe")).lower()


def make_sampler(spec: dict[str, Any], seed: int | None, space: SearchSpace) -> Any:
    """The Optuna sampler ``spec`` names (``{"name": "tpe", <its options>}``), seeded with ``seed``."""
    import optuna

    name = sampler_name(spec)
    spec = {key: value for key, value in spec.items() if key != "name"}
    samplers = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler,
                "cmaes": optuna.samplers.CmaEsSampler, "qmc": optuna.samplers.QMCSampler,
                "grid": optuna.samplers.GridSampler}
    if name == "grid":
        spec.setdefault("search_space", grid_of(space))
    try:
        return samplers[name](seed=seed, **spec)
    except TypeError as exc:  # an option the sampler does not take
        raise ConfigError(f"hydra.sweeper.sampler={name}: {exc}") from None


class OptunaSweep:
    """An Optuna study run as Hydra's sweeper (``hydra/sweeper=paddletrain_optuna``, which Hydra finds as
    :class:`hydra_plugins.paddletrain_optuna.PaddletrainOptunaSweeper`; its options are
    :class:`hydra_plugins.paddletrain_optuna.OptunaSweeperConf`)."""

    def __init__(self, sampler: dict[str, Any] | str = "tpe", pruner: dict[str, Any] | str = "median",
                 seed: int | None = None, n_trials: int = 20, n_jobs: int = 1, storage: str | None = None,
                 study_name: str | None = None, params: dict[str, str] | None = None, heartbeat_interval: int = 30,
                 grace_period: int = 120) -> None:
        try:
            import optuna  # noqa: F401  (the search extra)
        except ImportError:
            raise ConfigError("hydra/sweeper=paddletrain_optuna needs Optuna, which the README's install leaves "
                              "out: pip install -e \".[search]\" (or pip install paddletrain[search])") from None
        self.sampler_spec = {"name": sampler} if isinstance(sampler, str) else dict(sampler)
        self.pruner_spec = {"name": pruner} if isinstance(pruner, str) else dict(pruner)
        self.seed, self.n_trials, self.n_jobs = seed, int(n_trials), int(n_jobs)
        self.storage, self.study_name = storage, study_name
        self.params = dict(params or {})
        self.heartbeat = Heartbeat(int(heartbeat_interval), int(grace_period))
        if self.heartbeat.interval < 1 or self.heartbeat.grace <= self.heartbeat.interval:
            raise ConfigError(f"hydra.sweeper.heartbeat_interval={heartbeat_interval} must be >= 1 and "
                              f"hydra.sweeper.grace_period={grace_period} larger than it")
        if self.n_trials < 1 or self.n_jobs < 1:
            raise ConfigError(f"hydra.sweeper.n_trials={n_trials} and hydra.sweeper.n_jobs={n_jobs} must be >= 1")
        if sampler_name(self.sampler_spec) not in SAMPLERS:
            raise ConfigError(f"hydra.sweeper.sampler={self.sampler_spec.get('name')!r} is not one of "
                              f"{', '.join(SAMPLERS)}")
        try:
            make_pruner(self.pruner_spec)  # a bad pruner is refused before any trial
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"hydra.sweeper.pruner: {exc}") from None
        self.config: DictConfig | None = None

    def setup(self, config: DictConfig) -> None:
        """Hydra's composed config of the sweep (the fixed overrides applied, the search ones not)."""
        self.config = config

    # ---------------------------------------------------------------------------------------------- the study
    @property
    def monitor(self) -> str:
        """The trials' objective: the metric their runs monitor (``val/mAP`` for a multi-label run left at the
        default, as :func:`paddletrain.build.monitored_metric` says)."""
        from paddletrain.build import monitored_metric

        return monitored_metric(self.config)

    @property
    def name(self) -> str:
        return str(self.study_name or OmegaConf.select(self.config, "name", default="paddletrain"))

    def _run_config(self) -> RunConfig:
        """What ``best.yaml`` needs to know of how this command composed its config."""
        hydra_cfg = self.config.hydra
        groups = frozenset(key for key in hydra_cfg.runtime.choices if not key.startswith("hydra/"))
        search_path = tuple(f"file://{Path(source.path).resolve()}" for source in hydra_cfg.runtime.config_sources
                            if source.provider == "command-line" and source.schema == "file")
        return RunConfig(str(hydra_cfg.job.config_name), groups, search_path)

    def _open_study(self, space: SearchSpace, url: str) -> Any:
        import optuna

        direction = "maximize" if OmegaConf.select(self.config, "monitor_mode", default="max") == "max" \
            else "minimize"
        return optuna.create_study(study_name=self.name, storage=open_storage(url, self.heartbeat),
                                   sampler=make_sampler(self.sampler_spec, self.seed, space),
                                   pruner=make_pruner(self.pruner_spec), direction=direction, load_if_exists=True)

    # ---------------------------------------------------------------------------------------------- the sweep
    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None
        space = parse_space(arguments, self.params)
        if not space.distributions:
            raise ConfigError("hydra/sweeper=paddletrain_optuna needs a search space: e.g. "
                              "'optim.lr=tag(log,interval(1e-3,0.3))' or hydra.sweeper.params")
        check_against_schema(space)
        check_in_config(space, self.config)
        if sampler_name(self.sampler_spec) == "grid":
            points = math.prod(len(values) for values in grid_of(space).values())
            if self.n_trials > points:
                log.info("hydra.sweeper.n_trials=%d: the grid has %d points; the search runs %d trials",
                         self.n_trials, points, points)
                self.n_trials = points
        sweep_dir = Path(self.config.hydra.sweep.dir).resolve()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        url = storage_url(self.storage, sweep_dir)
        journal = url.startswith("journal:")
        with holding_sweep_dir(sweep_dir) as lock:
            study = self._open_study(space, url)
            # On one machine, a trial still RUNNING when no other sweep holds the directory was left by a killed one.
            requeue_abandoned(study, running_are_abandoned=journal and lock.held)
            while True:
                with claiming(url, self.name):  # sweeps sharing the study count and ask in turn
                    left = self.n_trials - taken(study)
                    batch = [self._next_trial(study, space, sweep_dir, url) for _ in range(min(self.n_jobs, left))]
                if batch:
                    self._run(study, batch)
                elif running(study):  # the last trials run in another sweep: wait for them to end, or be abandoned
                    time.sleep(min(self.heartbeat.interval, WAIT_SECONDS))
                else:
                    break
                # a database: trials of sweeps that died meanwhile; a journal: the other sweep here has gone
                requeue_abandoned(study, running_are_abandoned=journal and not lock.held and lock.take())
            write_reports(study, sweep_dir, space, self._run_config())
        return study

    def _next_trial(self, study: Any, space: SearchSpace, sweep_dir: Path, url: str) -> Trial:
        """The next trial to run: an abandoned one handed on (it continues its run directory), or a new sample."""
        handle = ask_unseen(study, space, self.sampler_spec, self.seed)
        if hasattr(study._storage, "record_heartbeat") and study._storage.get_heartbeat_interval():
            study._storage.record_heartbeat(handle._trial_id)  # alive from the start: a kill before its run is seen
        continued = handle.user_attrs.get(RUN_DIR_ATTR)
        run_dir = Path(continued) if continued else sweep_dir / TRIAL_DIR.format(number=handle.number)
        if continued:
            log.info("Trial %d continues the run in %s", handle.number, run_dir)
            if not wait_until_free(run_dir, CONTINUE_WAIT_SECONDS):  # the trial it continues may still be saving
                log.warning("Trial %d: %s is still in use after %d s; the trial will say by whom", handle.number,
                            run_dir, CONTINUE_WAIT_SECONDS)
        else:
            handle.set_user_attr(RUN_DIR_ATTR, str(run_dir))
        callback = (f"+callbacks.optuna_pruning={{_target_:{OptunaPruning.__module__}.{OptunaPruning.__name__},"
                    f"storage:{_quoted(url)},study_name:{_quoted(self.name)},"
                    f"trial_id:{handle._trial_id},monitor:{_quoted(self.monitor)},"
                    f"pruner:{{{','.join(f'{k}:{_plain(v)}' for k, v in self.pruner_spec.items())}}}}}")
        # hydra.mode=RUN: a search kept in a config sets MULTIRUN, which its trials must not inherit
        overrides = [*space.overrides(handle.params), callback, "trainer.resume=auto", f"hydra.run.dir={run_dir}",
                     "hydra.mode=RUN"]
        if self.n_jobs > 1 and not any(o.startswith("trainer.cpu_threads=") for o in space.fixed):
            overrides.append(f"trainer.cpu_threads={max(1, usable_cores() // self.n_jobs)}")
        return Trial(handle, overrides, run_dir, sweep_dir / "logs" / f"{run_dir.name}.log")

    # ---------------------------------------------------------------------------------------------- running
    def _run(self, study: Any, batch: list[Trial]) -> None:
        """Run ``batch`` at once, each trial a process of its own that stops (saving) if this one dies, and tell the
        study how each ended."""
        env = dict(os.environ, **{STOP_WITH_PARENT_ENV: str(os.getpid())})
        processes = []
        for trial in batch:
            trial.log_file.parent.mkdir(parents=True, exist_ok=True)
            log.info("Trial %d %s started (output: %s)", trial.handle.number, _params_text(trial), trial.log_file)
            with open(trial.log_file, "ab") as out:
                processes.append(subprocess.Popen([*this_command(), *trial.overrides], env=env, stdout=out,
                                                  stderr=subprocess.STDOUT))
        with recording_heartbeats(study, [trial.handle._trial_id for trial in batch]):
            codes = [process.wait() for process in processes]
        for trial, code in zip(batch, codes, strict=True):
            self._tell(study, trial, code)

    def _tell(self, study: Any, trial: Trial, code: int) -> None:
        """Tell the study how ``trial`` ended (its exit status ``code``), and say it in one line."""
        import optuna

        state = optuna.trial.TrialState
        pruned = pruned_record(trial.run_dir)
        value = objective_value(trial.run_dir, self.monitor) if code == 0 else None
        if pruned is not None:
            _tell(study, trial.handle, state=state.PRUNED)
            outcome = f"pruned after epoch {pruned['epochs']} ({self.monitor}={pruned['value']:.4f})"
        elif value is not None:
            _tell(study, trial.handle, value)
            outcome = f"{self.monitor}={value:.4f}"
        elif stopped_by_signal(code):
            # Killed or stopped from outside (the OOM killer, a preemption), not by its own fault: a new trial of the
            # same parameters continues it from its checkpoint, at most MAX_CONTINUATIONS times.
            _tell(study, trial.handle, state=state.FAIL)
            retry_callback()(study, study._storage.get_trial(trial.handle._trial_id))
            outcome = f"stopped by a signal (exit status {code}): a new trial continues it"
        else:
            _tell(study, trial.handle, state=state.FAIL)
            why = f"exit status {code}" if code else f"no finite {self.monitor} in its summary.json"
            outcome = f"failed ({why}); its output: {trial.log_file}"
        log.info("Trial %d %s: %s | best so far: %s | %d of %d trials done", trial.handle.number, _params_text(trial),
                 outcome, _best_text(study, self.monitor), spent(study), self.n_trials)


def _tell(study: Any, handle: Any, *args: Any, **kwargs: Any) -> None:
    """``study.tell``; the grid sampler asks the study to stop once its grid is done, which Optuna refuses outside
    ``optimize`` after it has recorded the trial: the sweep ends by its own count instead."""
    try:
        study.tell(handle, *args, **kwargs)
    except RuntimeError as exc:
        if "Study.stop" not in str(exc):
            raise


def stopped_by_signal(code: int) -> bool:
    """Whether a trial's exit status says a signal ended it: killed (negative), or stopped, saving, on SIGINT or
    SIGTERM (paddletrain's 128 + the signal)."""
    return code < 0 or code in (ExitCode.INTERRUPTED_SIGINT, ExitCode.INTERRUPTED_SIGTERM)


def _params_text(trial: Trial) -> str:
    return "(" + ", ".join(f"{key}={_short(value)}" for key, value in trial.handle.params.items()) + ")"


def _best_text(study: Any, monitor: str) -> str:
    try:
        best = study.best_trial
    except ValueError:  # no trial has completed yet
        return "none yet"
    return f"{monitor}={best.value:.4f} (trial {best.number})"


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def objective_value(run_dir: Path, monitor: str) -> float | None:
    """What a finished trial scores: the best ``monitor`` its run validated (the value of its best checkpoint),
    else its final one; None when ``summary.json`` has neither or it is not finite."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    best = summary.get("best") if isinstance(summary, dict) else None
    value = best.get("value") if isinstance(best, dict) and best.get("monitor") == monitor else summary.get(monitor)
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


# Proposals in a row that may repeat a finished trial's parameters before the last one is run anyway.
MAX_DUPLICATE_ASKS = 5


def continued_seed(seed: int, trials: int) -> int:
    """The sampler's seed once a study holds ``trials`` trials: a study continued, extended or shared by several
    sweeps draws on from where it is instead of replaying the seed's stream from its start."""
    import numpy as np

    return int(np.random.SeedSequence([int(seed), int(trials)]).generate_state(1)[0])


def ask_unseen(study: Any, space: SearchSpace, sampler_spec: dict[str, Any], seed: int | None) -> Any:
    """The study's next trial, never with the parameters of a finished one: a seeded sampler is seeded by the seed
    and the study's trial count (:func:`continued_seed`), and a proposal equal to a finished trial's is given that
    trial's outcome at once (``duplicate_of``; not trained, not counted against ``n_trials``) and asked again. A
    trial handed on to continue an abandoned one (same parameters, same run directory) is returned as it is."""
    import optuna

    finished = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED)
    # The grid sampler is left as the study made it: it maps trial numbers to points of a grid it shuffled with its
    # seed, and it already skips the points finished trials have visited.
    reseed = seed is not None and sampler_name(sampler_spec) != "grid"
    for _ in range(MAX_DUPLICATE_ASKS):
        trials = study.get_trials(deepcopy=False)
        if reseed:
            study.sampler = make_sampler(sampler_spec, continued_seed(seed, len(trials)), space)
        with warnings.catch_warnings():  # "heartbeat is supposed to be used with Study.optimize": the sweep beats
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            handle = study.ask(space.distributions)
        if handle.user_attrs.get(RUN_DIR_ATTR):  # a continuation of an abandoned trial
            return handle
        twin = next((t for t in trials if t.state in finished and t.params == handle.params), None)
        if twin is None:
            return handle
        handle.set_user_attr(DUPLICATE_ATTR, twin.number)
        if twin.state == optuna.trial.TrialState.COMPLETE:
            _tell(study, handle, twin.value)
        else:
            _tell(study, handle, state=optuna.trial.TrialState.PRUNED)
        log.info("Trial %d proposed trial %d's parameters again: its outcome is reused, nothing is trained",
                 handle.number, twin.number)
    return handle


def spent(study: Any) -> int:
    """Trials that count against ``n_trials``: finished ones, except the abandoned ones that a retry continues and
    the duplicates told a finished trial's outcome (:func:`ask_unseen`)."""
    return _spent(study.get_trials(deepcopy=False))


def _spent(trials: list[Any]) -> int:
    import optuna

    handed_on = {n for t in trials for n in t.system_attrs.get("retry_history", [])}
    done = (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED, optuna.trial.TrialState.FAIL)
    return sum(1 for t in trials
               if t.state in done and t.number not in handed_on and DUPLICATE_ATTR not in t.user_attrs)


def taken(study: Any) -> int:
    """Trials spent or running now, from one read of the study: counted in two reads, a trial another sweep finishes
    between them is in neither count, and one trial too many would be asked for."""
    import optuna

    trials = study.get_trials(deepcopy=False)
    return _spent(trials) + sum(1 for t in trials if t.state == optuna.trial.TrialState.RUNNING)


def running(study: Any) -> int:
    """Trials running now, here or in another sweep (a waiting one is started by the next ``ask``)."""
    import optuna

    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))


def requeue_abandoned(study: Any, running_are_abandoned: bool) -> None:
    """Hand each abandoned trial on to a waiting one of the same parameters, run directory and reports.

    A database storage finds abandoned trials by their stale heartbeat (Optuna's ``fail_stale_trials``, which calls
    the storage's retry callback, :func:`~paddletrain.search.storage.open_storage`); on one machine every trial
    still RUNNING is abandoned when ``running_are_abandoned``. Failing a trial is atomic in the storage, so two
    sweeps never both continue it.
    """
    import optuna

    with warnings.catch_warnings():  # fail_stale_trials is "experimental" since Optuna 2.9, and what we need
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    if not running_are_abandoned:
        return
    storage = study._storage
    for frozen in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        try:
            claimed = storage.set_trial_state_values(frozen._trial_id, state=optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            claimed = False
        if claimed:
            log.info("Trial %d was running when the sweep stopped: it continues as a new trial", frozen.number)
            retry_callback()(study, storage.get_trial(frozen._trial_id))


@contextmanager
def recording_heartbeats(study: Any, trial_ids: list[int]) -> Iterator[None]:
    """Record each trial's heartbeat in a database storage while the block runs (its trials' processes), so that
    other machines see they are alive; nothing for a storage without heartbeats."""
    storage = study._storage
    interval = storage.get_heartbeat_interval() if hasattr(storage, "get_heartbeat_interval") else None
    if not interval:
        yield
        return
    done = threading.Event()

    def beat() -> None:
        while True:
            for trial_id in trial_ids:
                storage.record_heartbeat(trial_id)
            if done.wait(interval):
                return

    thread = threading.Thread(target=beat, name="optuna-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


class SweepLock:
    """``<sweep dir>/sweep.lock``, held by the one sweep of this machine that owns the study's running trials (a
    second sweep of the same directory joins the study but leaves the first one's running trials alone)."""

    def __init__(self, sweep_dir: Path) -> None:
        self.handle = open(sweep_dir / LOCK_FILE, "a")  # noqa: SIM115  (held open until release)
        self.held = False

    def take(self) -> bool:
        """Whether this sweep holds the lock now (taking it if its holder has gone)."""
        if not self.held:
            try:
                fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.held = True
            except BlockingIOError:
                pass
        return self.held

    def release(self) -> None:
        self.handle.close()


@contextmanager
def holding_sweep_dir(sweep_dir: Path) -> Iterator[SweepLock]:
    """The :class:`SweepLock` of ``sweep_dir``, taken if free, released when the block ends."""
    lock = SweepLock(sweep_dir)
    lock.take()
    try:
        yield lock
    finally:
        lock.release()


def _quoted(text: str) -> str:
    return "'" + str(text).replace("\\", "\\\\").replace("'", "\\'") + "'"


def _plain(value: Any) -> str:
    return _quoted(value) if isinstance(value, str) else str(value)
