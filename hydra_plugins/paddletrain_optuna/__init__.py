"""Hydra finds this plugin by its namespace package: ``hydra/sweeper=paddletrain_optuna`` selects
:class:`paddletrain.search.sweeper.PaddletrainOptunaSweeper` with the options below (``hydra.sweeper.<option>``)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class OptunaSweeperConf:
    _target_: str = "paddletrain.search.sweeper.PaddletrainOptunaSweeper"
    # tpe (default), random, grid, cmaes, qmc; a mapping adds the sampler's own options:
    # {name: tpe, n_startup_trials: 5}
    sampler: Any = "tpe"
    # median (default), hyperband, successive_halving, percentile, none; a mapping adds the pruner's options
    pruner: Any = "median"
    # Makes a study repeatable: the sampler's seed.
    seed: Any = None
    n_trials: int = 20
    # Trials at once on this machine, each a process of its own with its share of the cores.
    n_jobs: int = 1
    # null: a journal file in the sweep directory; or a database URL (sqlite:///..., postgresql://...).
    storage: Any = None
    # null: the run's `name`; processes that share a storage and a study name share the study.
    study_name: Any = None
    # A search space in the config (key: sweep), e.g. {optim.lr: "tag(log,interval(1e-3,0.3))"}; the command line
    # wins where both set a key.
    params: dict[str, str] = field(default_factory=dict)
    # A database storage: seconds between the heartbeats of a running trial, and without one after which another
    # sweep takes the trial for abandoned and continues it.
    heartbeat_interval: int = 30
    grace_period: int = 120


ConfigStore.instance().store(group="hydra/sweeper", name="paddletrain_optuna", node=OptunaSweeperConf,
                             provider="paddletrain")
