"""The callback contract: the Trainer has every member a callback may rely on (TrainerView)."""
from __future__ import annotations

import paddle

from paddletrain.engine.callback import Callback, TrainerView
from paddletrain.engine.trainer import Trainer


def _members(protocol: type) -> set[str]:
    names = set(getattr(protocol, "__annotations__", {}))
    names |= {name for name in vars(protocol) if not name.startswith("_")}
    return names


def test_a_trainer_is_everything_a_callback_may_read():
    trainer = Trainer(paddle.nn.Linear(2, 2), paddle.optimizer.SGD(0.1, parameters=paddle.nn.Linear(2, 2).parameters()))
    assert isinstance(trainer, TrainerView)  # runtime_checkable: every member is there
    missing = [name for name in _members(TrainerView) if not hasattr(trainer, name)]
    assert not missing and len(_members(TrainerView)) > 20, missing


def test_a_callback_checks_its_options_before_it_is_built():
    class Picky(Callback):
        @classmethod
        def check_options(cls, options):
            if options.get("every", 1) < 1:
                raise ValueError(f"every={options['every']} must be >= 1")

        def __init__(self, every: int = 1) -> None:
            self.check_options({"every": every})
            self.every = every

    Callback.check_options({"anything": 1})  # the base accepts what the signature takes
    Picky.check_options({"every": 2})
    try:
        Picky.check_options({"every": 0})
    except ValueError as error:
        assert "every=0" in str(error)
    else:
        raise AssertionError("Picky.check_options accepted every=0")
