"""An optimizer's state saved by structured parameter name: restored into any process's names, exactly, and
refused in one line where it does not fit (paddletrain.engine.optimizer_state)."""
from __future__ import annotations

import warnings

import numpy as np
import paddle
import pytest

from paddletrain.checkpoint.untrusted import StateValueError
from paddletrain.engine.limits import Limits
from paddletrain.engine.optimizer_state import BY_PARAMETER, optimizer_state
from paddletrain.engine.state_checks import check_optimizer_state
from paddletrain.engine.trainer import Trainer

OPTIMIZERS = {
    "momentum": lambda model, lr: paddle.optimizer.Momentum(learning_rate=lr, momentum=0.9,
                                                            parameters=model.parameters()),
    "adamw": lambda model, lr: paddle.optimizer.AdamW(learning_rate=lr, parameters=model.parameters()),
}


def small_net(seed: int) -> paddle.nn.Layer:
    """A convolution, a batch norm (whose statistics are parameters the optimizer never updates) and a head."""
    paddle.seed(seed)
    return paddle.nn.Sequential(paddle.nn.Conv2D(3, 4, 3, padding=1), paddle.nn.BatchNorm2D(4), paddle.nn.ReLU(),
                                paddle.nn.AdaptiveAvgPool2D(1), paddle.nn.Flatten(), paddle.nn.Linear(4, 3))


def batches(count: int = 4) -> list:
    rng = np.random.RandomState(0)
    return [(paddle.to_tensor(rng.randn(8, 3, 6, 6).astype("float32")),
             paddle.to_tensor(rng.randint(0, 3, 8).astype("int64"))) for _ in range(count)]


def trainer_of(model, kind: str, epochs: int, warmup: bool = False) -> Trainer:
    lr = paddle.optimizer.lr.LinearWarmup(0.05, warmup_steps=3, start_lr=0.0, end_lr=0.05) if warmup else 0.05
    optimizer = OPTIMIZERS[kind](model, lr)
    return Trainer(model, optimizer, scheduler=lr if warmup else None, limits=Limits(max_epochs=epochs),
                   num_classes=3)


def weights(model) -> dict[str, np.ndarray]:
    return {name: value.numpy().copy() for name, value in model.state_dict().items()}


@pytest.mark.parametrize("kind", OPTIMIZERS)
def test_a_state_restores_into_a_model_whose_parameters_got_other_names_and_continues_exactly(kind):
    data = batches()
    straight = small_net(0)
    trainer_of(straight, kind, epochs=2, warmup=True).fit(data)

    first = small_net(0)
    half = trainer_of(first, kind, epochs=1, warmup=True)
    half.fit(data)
    state = half.state_dict()
    paddle.nn.Linear(2, 2)  # anything built first moves Paddle's automatic names (conv2d_7.w_0 -> conv2d_8.w_0)
    later = small_net(1)
    assert [p.name for p in later.parameters()] != [p.name for p in first.parameters()]
    resumed = trainer_of(later, kind, epochs=2, warmup=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed.load_state_dict(state)
    assert not [w for w in caught if "unused values" in str(w.message)], "an exact restore warns of nothing"
    resumed.fit(data)
    expected, actual = weights(straight), weights(later)
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


def test_the_state_is_keyed_by_structured_names_and_holds_only_updated_parameters():
    model = small_net(0)
    trainer = trainer_of(model, "adamw", epochs=1)
    trainer.fit(batches(2))
    saved = optimizer_state(trainer.optimizer, model)
    assert set(saved[BY_PARAMETER]) == {"0.weight", "0.bias", "1.weight", "1.bias", "5.weight", "5.bias"}
    assert set(saved[BY_PARAMETER]["0.weight"]) == {"moment1", "moment2", "beta1_pow_acc", "beta2_pow_acc"}


def test_a_state_of_another_model_is_refused_naming_the_parameter():
    model = small_net(0)
    trainer = trainer_of(model, "momentum", epochs=1)
    trainer.fit(batches(2))
    saved = optimizer_state(trainer.optimizer, model)
    saved[BY_PARAMETER]["head.weight"] = saved[BY_PARAMETER].pop("5.weight")
    other = small_net(0)
    with pytest.raises(StateValueError, match=r"optimizer\.by_parameter\.head\.weight belongs to no parameter"):
        check_optimizer_state(OPTIMIZERS["momentum"](other, 0.1), other, saved)
    saved[BY_PARAMETER]["5.weight"] = saved[BY_PARAMETER].pop("head.weight")
    saved[BY_PARAMETER]["5.weight"]["velocity"] = paddle.zeros([3, 3])
    with pytest.raises(StateValueError, match=r"5\.weight\.velocity has shape \[3, 3\], but its parameter "
                                              r"5\.weight has shape \[4, 3\]"):
        check_optimizer_state(OPTIMIZERS["momentum"](other, 0.1), other, saved)


def test_another_optimizers_state_is_refused_naming_the_accumulator():
    model = small_net(0)
    trainer = trainer_of(model, "momentum", epochs=1)
    trainer.fit(batches(2))
    state = trainer.state_dict()
    with pytest.raises(StateValueError, match=r"0\.weight\.velocity is state this optimizer \(AdamW"):
        trainer_of(small_net(0), "adamw", epochs=2).load_state_dict(state)


def test_an_older_flat_state_loads_where_its_names_are_this_processs_and_is_refused_where_not():
    model = small_net(0)
    trainer = trainer_of(model, "momentum", epochs=1)
    trainer.fit(batches(2))
    state = trainer.state_dict()
    state["optimizer"] = trainer.optimizer.state_dict()  # as checkpoints were written before by_parameter
    before = optimizer_state(trainer.optimizer, model)[BY_PARAMETER]
    same_names = trainer_of(model, "momentum", epochs=2)  # its accumulators would be named ..._velocity_1
    same_names.load_state_dict(state)
    after = optimizer_state(same_names.optimizer, model)[BY_PARAMETER]
    assert after.keys() == before.keys()
    for name in before:
        np.testing.assert_array_equal(after[name]["velocity"].numpy(), before[name]["velocity"].numpy())
    same_names.fit(batches(2))
    with pytest.raises(StateValueError, match="is keyed by Paddle's automatic parameter name.*fresh process"):
        trainer_of(small_net(0), "momentum", epochs=2).load_state_dict(state)


@pytest.mark.slow  # a two-job sweep stopped in its second job, then its printed continue command: about 40 s
def test_a_sweeps_second_job_continues_with_the_command_it_printed(tmp_path):
    """The second job's model is the second built in the sweep's process, so its parameters have other automatic
    names than in a fresh process: the continue command printed for it failed at its first step (issue 47)."""
    import shlex
    import signal
    import subprocess
    import sys

    from tests.test_console import fit_env

    args = ["-m", "optim.lr=0.001,0.002", "data.shapes.num_train=256", "data.shapes.num_val=32", "data.image_size=16",
            "data.batch_size=16", "trainer.max_epochs=3", "trainer.cpu_threads=1", "callbacks.visualdl=null",
            "callbacks.progress_bar.enabled=false", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = subprocess.Popen([sys.executable, "-m", "paddletrain.fit", *args], cwd=tmp_path, env=fit_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines, in_second_job = [], False
    for line in proc.stdout:  # stop the second job once its first epoch saved a checkpoint
        lines.append(line)
        in_second_job = in_second_job or "#1 : optim.lr=0.002" in line
        if in_second_job and "Saved checkpoint" in line:
            proc.send_signal(signal.SIGINT)
            break
    lines += proc.stdout.readlines()
    assert proc.wait(timeout=300) == 130, "".join(lines)[-3000:]
    hint = next(line for line in lines if "Continue with: " in line).split("Continue with: ", 1)[1].strip()
    command = shlex.split(hint)
    assert command[:3] == ["python", "-m", "paddletrain.fit"] and "optim.lr=0.002" in command
    resumed = subprocess.run([sys.executable, *command[1:]], cwd=tmp_path, env=fit_env(), capture_output=True,
                             text=True, timeout=300)
    output = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, output[-3000:]
    assert "Resumed from" in output and "Optimizer set error" not in output
