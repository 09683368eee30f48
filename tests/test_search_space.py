"""paddletrain.search.space: Hydra's sweep grammar becomes Optuna distributions, checked against the schema."""
from __future__ import annotations

import pytest

optuna = pytest.importorskip("optuna", reason="the search extra (pip install paddletrain[search]) is not installed")

from paddletrain.errors import ConfigError  # noqa: E402
from paddletrain.search.space import check_against_schema, parse_space  # noqa: E402


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
