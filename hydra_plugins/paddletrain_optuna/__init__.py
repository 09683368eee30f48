"""Hydra finds the ``paddletrain_optuna`` sweeper here (Hydra takes plugins from the ``hydra_plugins`` namespace
package only): ``hydra/sweeper=paddletrain_optuna`` with the options below (``hydra.sweeper.<option>``).
The work is :class:`paddletrain.search.sweeper.OptunaSweep`'s, imported only when a search starts, so that every
other Hydra application that scans its plugins stays light."""
# No `from __future__ import annotations` (and typing's Optional/Dict, which OmegaConf reads in every version):
# Hydra's plugin scan runs this module before it is in sys.modules, where dataclasses cannot resolve string
# annotations.
# ruff: noqa: I002, UP006, UP035, UP045
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


@dataclass
class OptunaSweeperConf:
    _target_: str = "hydra_plugins.paddletrain_optuna.PaddletrainOptunaSweeper"
    # tpe (default), random, grid, cmaes, qmc; a mapping adds the sampler's own options:
    # {name: tpe, n_startup_trials: 5}
    sampler: Any = "tpe"
    # median (default), hyperband, successive_halving, percentile, threshold, none; a mapping adds the pruner's
    # options: {name: median, n_warmup_steps: 2}
    pruner: Any = "median"
    # Makes a study repeatable: the sampler's seed.
    seed: Optional[int] = None
    n_trials: int = 20
    # Trials at once on this machine, each a process of its own with its share of the cores.
    n_jobs: int = 1
    # null: a journal file in the sweep directory; or a database URL (sqlite:///..., postgresql://...).
    storage: Optional[str] = None
    # null: the run's `name`; processes that share a storage and a study name share the study.
    study_name: Optional[str] = None
    # A search space in the config (key: sweep), e.g. {optim.lr: "tag(log,interval(1e-3,0.3))"}; the command line
    # wins where both set a key.
    params: Dict[str, str] = field(default_factory=dict)
    # A database storage: seconds between the heartbeats of a running trial, and without one after which another
    # sweep takes the trial for abandoned and continues it.
    heartbeat_interval: int = 30
    grace_period: int = 120


class PaddletrainOptunaSweeper(Sweeper):
    """Hydra's sweeper interface, handed to :class:`paddletrain.search.sweeper.OptunaSweep`."""

    def __init__(self, **options: Any) -> None:
        self.options = options  # checked in setup, where a mistake ends the command in one line

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        from paddletrain.search.sweeper import OptunaSweep

        self.sweep_impl = OptunaSweep(**self.options)
        self.sweep_impl.setup(config)

    def sweep(self, arguments: List[str]) -> Any:
        return self.sweep_impl.sweep(arguments)


ConfigStore.instance().store(group="hydra/sweeper", name="paddletrain_optuna", node=OptunaSweeperConf,
                             provider="paddletrain")
