"""A saved training state's layout, checked in one pass before anything is put back
(paddletrain.engine.state_checks.training_state), and each part then held against its object."""
from __future__ import annotations

import copy

import numpy as np
import paddle
import pytest

from paddletrain.checkpoint.untrusted import StateValueError
from paddletrain.engine.limits import Limits
from paddletrain.engine.state_checks import check_state_matches, training_state
from paddletrain.engine.trainer import Trainer
from paddletrain.errors import UserError


def _trained() -> tuple[Trainer, dict]:
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(12, 3))
    scheduler = paddle.optimizer.lr.StepDecay(0.1, step_size=2)
    optimizer = paddle.optimizer.Momentum(learning_rate=scheduler, momentum=0.9, parameters=model.parameters())
    trainer = Trainer(model, optimizer, scheduler=scheduler, limits=Limits(max_epochs=1), num_classes=3)
    rng = np.random.RandomState(0)
    trainer.fit([(paddle.to_tensor(rng.randn(4, 3, 2, 2).astype("float32")),
                  paddle.to_tensor(rng.randint(0, 3, 4).astype("int64"))) for _ in range(3)])
    return trainer, trainer.state_dict()


def test_a_trainers_own_state_passes_whole_and_keeps_every_part():
    trainer, state = _trained()
    checked = training_state(trainer.optimizer, trainer.scheduler)(state, "")
    assert set(checked) == set(state)
    assert checked["progress"] == state["progress"] and checked["model"].keys() == state["model"].keys()
    assert checked["optimizer"]["by_parameter"].keys() == state["optimizer"]["by_parameter"].keys()
    assert checked["scheduler"] == state["scheduler"]
    # An evaluating trainer has no optimizer: the state's optimizer is not asked for.
    without = {k: v for k, v in state.items() if k not in ("optimizer", "scheduler", "metrics", "callbacks")}
    checked = training_state()(without, "")
    assert "optimizer" not in checked and checked["metrics"] == {} and checked["callbacks"] == {}


@pytest.mark.parametrize("change, says", [
    (lambda s: s.pop("rng"), r"^rng is missing$"),
    (lambda s: s.update(rng=[]), r"^rng is not a list of per-rank random states"),
    (lambda s: s["progress"].update(global_step=-1), r"^progress\.global_step is -1: expected an integer"),
    (lambda s: s["progress"].update(epoch_finished="yes"), r"^progress\.epoch_finished is 'yes'"),
    (lambda s: s["metrics"].update({"val/top1": "high"}), r"^metrics\.val/top1 is 'high': expected a number$"),
    (lambda s: s["model"].update({"1.weight": [[0.0]]}), r"^model\.1\.weight is \[\[0\.0\]\]: expected a tensor$"),
    (lambda s: s["optimizer"]["by_parameter"]["1.weight"].update(velocity="v"),
     r"^optimizer\.by_parameter\.1\.weight\.velocity is 'v': expected a tensor$"),
    (lambda s: s["scheduler"].update(last_epoch="8"), r"^scheduler\.last_epoch is '8'"),
    (lambda s: s["optimizer"]["LR_Scheduler"].update(last_epoch=1.5), r"^optimizer\.LR_Scheduler\.last_epoch is 1\.5"),
    (lambda s: s.update(callbacks=[]), r"^callbacks is \[\]: expected a mapping"),
])
def test_a_value_that_does_not_fit_is_named_by_its_key(change, says):
    trainer, state = _trained()
    broken = copy.deepcopy(state)
    change(broken)
    with pytest.raises(StateValueError, match=says):
        training_state(trainer.optimizer, trainer.scheduler)(broken, "")
    with pytest.raises(StateValueError, match=says):  # and load_state_dict, before anything changes
        before = {k: v.numpy().copy() for k, v in trainer.model.state_dict().items()}
        trainer.load_state_dict(broken)
    assert all(np.array_equal(v.numpy(), before[k]) for k, v in trainer.model.state_dict().items())


def test_the_weights_are_then_held_against_the_models_shapes():
    trainer, state = _trained()
    other = paddle.nn.Sequential(paddle.nn.Flatten(), paddle.nn.Linear(12, 4))
    with pytest.raises(UserError, match=r"shape mismatch \(2\): 1\.bias: checkpoint \[3\] vs model \[4\]"):
        check_state_matches(other, state["model"])
