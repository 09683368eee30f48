"""paddletrain.search.space: Hydra's sweep grammar becomes Optuna distributions, checked against the schema."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

optuna = pytest.importorskip("optuna", reason="the search extra (pip install paddletrain[search]) is not installed")

from paddletrain.errors import ConfigError  # noqa: E402
from paddletrain.search.space import check_against_schema, grid_of, parse_space  # noqa: E402


def test_each_sweep_form_becomes_its_distribution_and_the_rest_stays_fixed():
    space = parse_space(["optim.lr=tag(log,interval(1e-3,0.3))", "loss.label_smoothing=interval(0,0.2)",
                         "trainer.max_epochs=tag(int,interval(2,8))", "data.batch_size=range(32,129,32)",
                         "model=choice(resnet20,resnet32)", "trainer.seed=3"])
    d = space.distributions
    assert d["optim.lr"] == optuna.distributions.FloatDistribution(1e-3, 0.3, log=True)
    assert d["loss.label_smoothing"] == optuna.distributions.FloatDistribution(0.0, 0.2)
    assert d["trainer.max_epochs"] == optuna.distributions.IntDistribution(2, 8)
    assert d["data.batch_size"] == optuna.distributions.IntDistribution(32, 128, step=32)
    assert d["model"] == optuna.distributions.CategoricalDistribution(["resnet20", "resnet32"])
    assert space.fixed == ["trainer.seed=3"]
    assert space.overrides({"optim.lr": 0.01, "model": "resnet32"}) == ["optim.lr=0.01", "model=resnet32",
                                                                        "trainer.seed=3"]


def test_the_command_line_wins_over_the_configs_search_space():
    space = parse_space(["optim.lr=interval(0.01,0.1)"], {"optim.lr": "interval(0.001,1)",
                                                          "optim.weight_decay": "interval(0,1e-3)"})
    assert space.distributions["optim.lr"].low == 0.01 and "optim.weight_decay" in space.distributions


@pytest.mark.parametrize(("override", "message"), [
    ("optim.lr=interval(-1,0.3)", "the search reaches optim.lr=-1.0, but optim.lr must be > 0"),
    ("loss.label_smoothing=interval(0,1.5)", "loss.label_smoothing=1.5"),
    ("data.sampler=choice(random,weighted)", "data.sampler=weighted"),
])
def test_a_range_outside_a_keys_schema_is_refused_before_any_trial(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        check_against_schema(parse_space([override]))


def test_a_range_ends_at_its_last_step_below_its_stop():
    space = parse_space(["data.batch_size=range(32,130,32)", "loss.label_smoothing=range(0.0,0.25,0.1)"])
    assert space.distributions["data.batch_size"] == optuna.distributions.IntDistribution(32, 128, step=32)
    smoothing = space.distributions["loss.label_smoothing"]
    assert (smoothing.low, smoothing.step) == (0.0, 0.1) and smoothing.high == pytest.approx(0.2)
    with pytest.raises(ConfigError, match="holds no value"):
        parse_space(["data.batch_size=range(64,32,8)"])


def test_the_grid_sampler_walks_choices_and_ranges_but_not_intervals():
    space = parse_space(["model=choice(resnet20,resnet32)", "data.batch_size=range(32,97,32)"])
    assert grid_of(space) == {"model": ["resnet20", "resnet32"], "data.batch_size": [32, 64, 96]}
    with pytest.raises(ConfigError, match="optim.lr: hydra.sweeper.sampler=grid walks choice"):
        grid_of(parse_space(["optim.lr=interval(0.01,0.1)"]))


@pytest.mark.parametrize("config", sorted((Path(__file__).resolve().parents[1] / "configs" / "hparams_search")
                                          .glob("*.yaml")), ids=lambda p: p.stem)
def test_the_search_spaces_in_configs_parse_and_stay_inside_their_keys_schema(config):
    params = yaml.safe_load(config.read_text())["hydra"]["sweeper"]["params"]
    space = parse_space([], params)
    assert set(space.distributions) == set(params) and not space.fixed
    check_against_schema(space)


def test_the_sweeper_without_optuna_names_the_extra_to_install(monkeypatch):
    import sys

    from paddletrain.errors import ConfigError
    from paddletrain.search.sweeper import OptunaSweep

    monkeypatch.setitem(sys.modules, "optuna", None)  # as in a venv made by the README's install alone
    with pytest.raises(ConfigError, match=r"needs Optuna.*pip install -e \"\.\[search\]\""):
        OptunaSweep()
