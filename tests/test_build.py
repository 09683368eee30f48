"""paddletrain.build: the config a checkpoint's run saved, read back by the commands that rebuild it."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

import paddletrain
from paddletrain.errors import UserError
from paddletrain.rebuild import checkpoint_config, checkpoint_weights
from tests.conftest import compose_fit


def saved_config(*overrides: str) -> dict:
    """What fit saves in a checkpoint: its composed config, resolved."""
    return OmegaConf.to_container(compose_fit(list(overrides)), resolve=True)


def test_the_saved_callbacks_are_taken_whole_whatever_presets_composed_them():
    saved = saved_config("callbacks=[default,ema,early_stopping]", "callbacks.visualdl=null")
    del saved["callbacks"]["history"]  # a run without one of the defaults
    base = compose_fit(["callbacks=[default]"], name="evaluate")
    cfg = checkpoint_config(saved, ["callbacks.ema.decay=0.5"], base=base)
    assert set(cfg.callbacks) == set(saved["callbacks"]) and "history" not in cfg.callbacks
    assert cfg.callbacks.ema.decay == 0.5 and cfg.callbacks.visualdl is None
    assert cfg.callbacks.early_stopping.patience == saved["callbacks"]["early_stopping"]["patience"]


def test_a_saved_key_this_version_does_not_know_is_one_line_naming_it_and_the_version():
    saved = saved_config()
    saved["trainer"]["overlap_steps"] = 2  # as a newer version might write
    with pytest.raises(UserError) as refused:
        checkpoint_config(saved, source="checkpoint=run", written_by="9.9.0")
    message = str(refused.value)
    assert "\n" not in message and "trainer.overlap_steps" in message and "checkpoint=run" in message
    assert f"paddletrain 9.9.0, this is {paddletrain.__version__}" in message and "full_key" not in message


def test_a_saved_value_the_schema_refuses_is_named_and_the_command_line_can_replace_it():
    saved = saved_config()
    saved["data"]["batch_size"] = "many"
    with pytest.raises(UserError) as refused:
        checkpoint_config(saved, source="checkpoint=run")
    message = str(refused.value)
    assert "\n" not in message and "data.batch_size='many'" in message and "pass data.batch_size=<value>" in message
    assert checkpoint_config(saved, ["data.batch_size=8"]).data.batch_size == 8


def test_weights_auto_takes_the_average_a_run_validated_with_and_raw_the_trained_ones():
    trained = {"w": [1.0, 2.0], "step": 7}
    state = {"model": trained, "callbacks": {"ModelEMA": {"decay": 0.9, "shadow": {"w": [0.5, 1.5]},
                                                          "validate_with_ema": True}}}
    auto = checkpoint_weights(state)
    assert auto.state == {"w": [0.5, 1.5], "step": 7} and auto.record == {"weights": "averaged", "average": "ema",
                                                                         "decay": 0.9}
    assert checkpoint_weights(state, "raw").state == trained
    state["callbacks"]["ModelEMA"]["validate_with_ema"] = False  # the run validated (and chose best) on its weights
    assert checkpoint_weights(state).record == {"weights": "raw"}
    with pytest.raises(UserError, match="weights=averaged: cp holds no averaged weights"):
        checkpoint_weights(state, "averaged", source="cp")


def test_the_hparams_leave_out_every_key_that_only_says_where_or_how_the_run_executes():
    from paddletrain.build import run_hparams

    cfg = compose_fit(["trainer.devices=2", "trainer.num_nodes=1", "data.eval_batch_size=64", "optim.lr=0.05",
                       "data.num_workers=1", "trainer.cpu_threads=1"])
    picked = run_hparams(cfg, ["trainer.devices=2", "trainer.num_nodes=1", "data.eval_batch_size=64",
                               "optim.lr=0.05", "data.num_workers=1", "trainer.cpu_threads=1"])
    assert list(picked)[0] == "optim.lr"  # the first key the command line set that is a hyper-parameter
    assert not {"trainer.devices", "trainer.num_nodes", "data.eval_batch_size", "data.num_workers",
                "trainer.cpu_threads"} & set(picked)
