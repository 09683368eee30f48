"""A search space from Hydra's override grammar, as hydra-optuna-sweeper reads it.

``optim.lr=tag(log,interval(1e-3,0.3))`` is a log-uniform float, ``trainer.max_epochs=tag(int,interval(2,8))`` an
integer, ``data.batch_size=range(32,129,32)`` a stepped integer, ``model=choice(resnet20,resnet32)`` a category;
any other override is fixed for every trial. The same strings may live in a config under
``hydra.sweeper.params`` (an experiment's search space), where the command line wins.

Each bound and each choice is checked against the key's declared range before any trial runs
(:func:`check_against_schema`), so ``optim.lr=interval(-1,0.3)`` is refused in one line naming the key.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep, Transformer

from paddletrain.config import ALLOWED, SCHEMAS, FitConfig
from paddletrain.errors import ConfigError


@dataclass
class SearchSpace:
    """What a study searches (``distributions``, Optuna's, by key) and what every trial sets (``fixed``)."""

    distributions: dict[str, Any] = field(default_factory=dict)
    fixed: list[str] = field(default_factory=list)

    def overrides(self, params: Mapping[str, Any]) -> list[str]:
        """The command-line overrides of a trial whose sampled values are ``params``, those first (loggers such as
        VisualDL's hyper-parameter view take the first keys of the command line as the most important)."""
        return [*(f"{key}={_override_value(value)}" for key, value in params.items()), *self.fixed]


def _override_value(value: Any) -> str:
    """A sampled value as Hydra's grammar reads it back (floats in full precision, strings quoted when needed)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str) and any(c in value for c in " ,()[]{}'\"=:"):
        return "'" + value.replace("'", "\\'") + "'"
    return str(value)


def parse_space(arguments: Iterable[str], params: Mapping[str, str] | None = None) -> SearchSpace:
    """The search space of ``params`` (a config's ``hydra.sweeper.params``: key -> override value) and the command
    line ``arguments`` (which win over ``params``)."""
    lines = [f"{key}={value}" for key, value in (params or {}).items()]
    parsed = OverridesParser.create().parse_overrides([*lines, *arguments])
    by_key: dict[str, Override] = {}
    for override in parsed:  # the last word on a key wins: the command line over the config
        by_key[override.get_key_element()] = override
    space = SearchSpace()
    for key, override in by_key.items():
        if override.is_sweep_override():
            space.distributions[key] = distribution_of(override)
        else:
            space.fixed.append(override.input_line)
    return space


def distribution_of(override: Override) -> Any:
    """The Optuna distribution an override's sweep describes."""
    import optuna.distributions as d

    key = override.get_key_element()
    value = override.value()
    if override.is_choice_sweep():
        assert isinstance(value, ChoiceSweep)
        choices = [x for x in override.sweep_iterator(transformer=Transformer.encode)]
        if not choices:
            raise ConfigError(f"{key}=choice() offers nothing to choose")
        return d.CategoricalDistribution(choices)
    if override.is_range_sweep():
        assert isinstance(value, RangeSweep)
        if value.shuffle:
            raise ConfigError(f"{key}: shuffle(range(...)) means nothing to a sampler; give range(...)")
        if value.step <= 0 or value.stop <= value.start:
            raise ConfigError(f"{key}: {override.input_line} holds no value (a range counts up from its start)")
        # range() excludes its stop: its last value is the last step below it
        last = value.start + (math.ceil((value.stop - value.start) / value.step) - 1) * value.step
        if all(isinstance(x, int) for x in (value.start, value.stop, value.step)):
            return d.IntDistribution(int(value.start), int(last), step=int(value.step))
        return d.FloatDistribution(float(value.start), float(last), step=float(value.step))
    if override.is_interval_sweep():
        assert isinstance(value, IntervalSweep)
        log, as_int = "log" in value.tags, "int" in value.tags
        if as_int:
            return d.IntDistribution(int(value.start), int(value.end), log=log)
        return d.FloatDistribution(float(value.start), float(value.end), log=log)
    raise ConfigError(f"{key}: {override.input_line} is not a sweep the search understands (choice, range or "
                      "interval, optionally tag(log, ...) or tag(int, ...))")


def grid_of(space: SearchSpace) -> dict[str, list[Any]]:
    """The values ``hydra.sweeper.sampler=grid`` walks: each choice, each step of a range; an interval has no grid."""
    import optuna.distributions as d

    grid: dict[str, list[Any]] = {}
    for key, dist in space.distributions.items():
        if isinstance(dist, d.CategoricalDistribution):
            grid[key] = list(dist.choices)
        elif dist.step is not None and not dist.log:
            count = int(round((dist.high - dist.low) / dist.step)) + 1
            grid[key] = [type(dist.low)(dist.low + i * dist.step) for i in range(count)]
        else:
            raise ConfigError(f"{key}: hydra.sweeper.sampler=grid walks choice() and range() sweeps; an interval "
                              "has no grid (give range(start,stop,step), or another sampler)")
    return grid


def _field_rule(key: str) -> Any | None:
    """The declared rule (``paddletrain.config.Allowed``) of a dotted fit key, None when it declares none."""
    schema: Any = FitConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        if i == 0 and part in SCHEMAS:
            schema = SCHEMAS[part]
            continue
        fields = {f.name: f for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else {}
        if part not in fields:
            return None
        if i == len(parts) - 1:
            return fields[part].metadata.get(ALLOWED)
        schema = typing.get_type_hints(schema).get(part)
    return None


def check_in_config(space: SearchSpace, config: Any) -> None:
    """Every value the search can reach, set in the sweep's ``config`` one key at a time, passes ``fit``'s whole
    validation (:func:`paddletrain.validation.validate_config`: unknown keys, the rules that compare keys, the
    components' own options); the choices of a config group are Hydra's to check when a trial composes them."""
    import optuna.distributions as d
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    from paddletrain.validation import validate_config

    base = copy.deepcopy(config)
    groups = set(base.hydra.runtime.choices) if "hydra" in base else set()
    with open_dict(base):
        base.pop("hydra", None)
    validate_config(base)  # the fixed part first, so that its mistake is not blamed on a searched value
    for key, dist in space.distributions.items():
        if key in groups:
            continue
        values = list(dist.choices) if isinstance(dist, d.CategoricalDistribution) else [dist.low, dist.high]
        for value in values:
            trial = copy.deepcopy(base)
            try:
                OmegaConf.update(trial, key, value, force_add=True)
                validate_config(trial)
            except (ConfigError, OmegaConfBaseException) as exc:
                reason = str(exc).splitlines()[0]
                raise ConfigError(f"the search reaches {key}={value}, which fit refuses: {reason}") from None


def check_against_schema(space: SearchSpace) -> None:
    """Every bound of every distribution, and every choice, is a value its key allows; else one line naming it."""
    import optuna.distributions as d

    for key, dist in space.distributions.items():
        rule = _field_rule(key)
        if rule is None:
            continue
        values = list(dist.choices) if isinstance(dist, d.CategoricalDistribution) else [dist.low, dist.high]
        for value in values:
            if not rule.admits(value):
                raise ConfigError(f"{key}: the search reaches {key}={value}, but {key} must be {rule.describe()}; "
                                  "narrow the search")
