"""Precision on CPU: the fp32 guard, loss scaling through FakeGradScaler (and Paddle's real GradScaler forced on),
clipping on unscaled gradients, state round trips and configuration errors."""
from __future__ import annotations

import json
import logging
from contextlib import nullcontext
from unittest import mock

import numpy as np
import paddle
import paddle.amp.grad_scaler as grad_scaler
import pytest
from paddle.amp.auto_cast import amp_global_state

from paddletrain.config import AmpConfig
from paddletrain.engine.precision import GradScaler, Precision, StepResult, clip_grad_norm_
from paddletrain.testing import FakeGradScaler

paddle.set_device("cpu")


def make_model(seed: int = 0) -> paddle.nn.Layer:
    paddle.seed(seed)
    return paddle.nn.Sequential(paddle.nn.Linear(4, 8), paddle.nn.BatchNorm1D(8), paddle.nn.Linear(8, 3))


def make_optimizer(name: str, model: paddle.nn.Layer):
    if name == "momentum":
        return paddle.optimizer.Momentum(0.1, momentum=0.9, parameters=model.parameters(), weight_decay=1e-2)
    return paddle.optimizer.AdamW(0.01, parameters=model.parameters(), weight_decay=1e-2)


def batch():
    return paddle.to_tensor(np.linspace(-1, 1, 16, dtype="float32").reshape(4, 4))


def train_step(precision: Precision, model, optimizer, bad: bool = False, clip_norm=None) -> StepResult:
    """One training step; ``bad`` makes the loss inf (as an overflow would) so every gradient is inf/nan."""
    with precision.autocast():
        loss = model(batch()).square().mean()
    if bad:
        loss = loss * paddle.to_tensor(np.inf, dtype="float32")
    precision.backward(loss)
    return precision.step(optimizer, model.parameters(), clip_norm=clip_norm)


def weights(model) -> dict:
    """Trainable parameters only: BatchNorm running statistics move in every training forward."""
    return {n: p.numpy().copy() for n, p in model.named_parameters() if not p.stop_gradient}


def flat_state(state, prefix: str = "") -> dict:
    """Every tensor and number in an optimizer state_dict, keyed by path."""
    out = {}
    for key, value in state.items():
        if isinstance(value, dict):
            out.update(flat_state(value, f"{prefix}{key}."))
        elif isinstance(value, paddle.Tensor):
            out[prefix + key] = value.numpy().copy()
        elif isinstance(value, (int, float)):
            out[prefix + key] = value
    return out


def assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.fixture
def real_grad_scaler():
    """Paddle's own GradScaler, enabled on CPU by pretending the place is a GPU (its kernels run on CPU)."""
    class GpuPlace:
        def is_gpu_place(self) -> bool:
            return True

    tracer = mock.Mock(_expected_place=GpuPlace())

    def build(cls=GradScaler, **kwargs):
        with mock.patch.object(grad_scaler, "_dygraph_tracer", lambda: tracer):
            scaler = cls(**kwargs)
        assert scaler.is_enable()
        return scaler

    # GradScaler.scale() switches itself off unless the last auto_cast was float16.
    with mock.patch.object(amp_global_state(), "amp_dtype", "float16"):
        yield build


# ---------------------------------------------------------------------------------------------- fp32 guard
@pytest.mark.parametrize("opt_name", ["momentum", "adamw"])
def test_fp32_inf_loss_is_skipped_and_leaves_weights_and_optimizer_state_unchanged(opt_name):
    model = make_model()
    optimizer = make_optimizer(opt_name, model)
    precision = Precision()
    assert train_step(precision, model, optimizer).stepped
    before_w, before_s = weights(model), flat_state(optimizer.state_dict())

    result = train_step(precision, model, optimizer, bad=True)

    assert result.found_inf and not result.stepped and not np.isfinite(result.grad_norm)
    assert_same(weights(model), before_w)
    assert_same(flat_state(optimizer.state_dict()), before_s)
    assert all(p.grad is None or float(p.grad.abs().sum()) == 0.0 for p in model.parameters())


def test_skipped_first_step_does_not_change_what_the_next_good_step_does():
    # Paddle creates zero accumulators lazily; a skipped first step must not leave a trace in the update.
    skipped, fresh = make_model(), make_model()
    opt_a, opt_b = make_optimizer("adamw", skipped), make_optimizer("adamw", fresh)
    train_step(Precision(), skipped, opt_a, bad=True)
    train_step(Precision(), skipped, opt_a)
    train_step(Precision(), fresh, opt_b)
    for (name, a), b in zip(weights(skipped).items(), weights(fresh).values(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, err_msg=name)


def test_fp32_step_matches_a_plain_optimizer_step_and_reports_the_grad_norm():
    model, reference = make_model(), make_model()
    opt, ref_opt = make_optimizer("momentum", model), make_optimizer("momentum", reference)
    result = train_step(Precision(), model, opt)

    reference(batch()).square().mean().backward()
    expected_norm = np.sqrt(sum(float((p.grad**2).sum()) for p in reference.parameters() if p.grad is not None))
    ref_opt.step()

    assert result == StepResult(stepped=True, found_inf=False, grad_norm=pytest.approx(expected_norm, rel=1e-5),
                                loss_scale=None)
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)


# ---------------------------------------------------------------------------------------------- loss scaling
def fp16_precision(scaler) -> Precision:
    return Precision(enabled=True, dtype="float16", scaler=scaler, device="cpu")


def test_scale_decreases_after_decr_every_n_bad_steps():
    scaler = FakeGradScaler(init_loss_scaling=1024.0, decr_every_n_nan_or_inf=2)
    precision = fp16_precision(scaler)
    model = make_model()
    optimizer = make_optimizer("momentum", model)

    first = train_step(precision, model, optimizer, bad=True)
    assert first.found_inf and first.loss_scale == 1024.0 and precision.loss_scale == 1024.0
    train_step(precision, model, optimizer, bad=True)
    assert precision.loss_scale == 512.0
    assert precision.state_dict()["scaler"]["decr_count"] == 0


def test_scale_increases_after_incr_every_n_good_steps_and_a_bad_step_resets_the_count():
    scaler = FakeGradScaler(init_loss_scaling=8.0, incr_every_n_steps=3)
    precision = fp16_precision(scaler)
    model = make_model()
    optimizer = make_optimizer("momentum", model)
    for _ in range(2):
        train_step(precision, model, optimizer)
    train_step(precision, model, optimizer, bad=True)  # 8 -> 4, good-step count back to 0
    assert precision.loss_scale == 4.0
    scales = [train_step(precision, model, optimizer).loss_scale for _ in range(4)]
    assert scales == [4.0, 4.0, 4.0, 8.0]
    assert precision.loss_scale == 8.0


@pytest.mark.parametrize("opt_name", ["momentum", "adamw"])
def test_scaled_skipped_step_leaves_weights_and_optimizer_state_unchanged(opt_name):
    precision = fp16_precision(FakeGradScaler(init_loss_scaling=256.0))
    model = make_model()
    optimizer = make_optimizer(opt_name, model)
    train_step(precision, model, optimizer)
    params, state = weights(model), flat_state(optimizer.state_dict())

    result = train_step(precision, model, optimizer, bad=True)

    assert not result.stepped
    assert_same(weights(model), params)
    assert_same(flat_state(optimizer.state_dict()), state)


def test_scaled_good_step_equals_the_unscaled_fp32_step():
    scaled, plain = make_model(), make_model()
    opt_a, opt_b = make_optimizer("momentum", scaled), make_optimizer("momentum", plain)
    result = train_step(fp16_precision(FakeGradScaler(init_loss_scaling=4096.0)), scaled, opt_a)
    reference = train_step(Precision(), plain, opt_b)
    assert result.grad_norm == pytest.approx(reference.grad_norm, rel=1e-5)
    for a, b in zip(scaled.parameters(), plain.parameters(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-7)


def test_clipping_happens_on_unscaled_gradients():
    model, reference = make_model(), make_model()
    reference(batch()).square().mean().backward()
    true_grads = [p.grad.numpy().copy() for p in reference.parameters() if p.grad is not None]
    true_norm = np.sqrt(sum(float((g**2).sum()) for g in true_grads))
    clip_norm = true_norm / 10

    before = [p.numpy().copy() for p in model.parameters() if not p.stop_gradient]
    optimizer = paddle.optimizer.SGD(learning_rate=1.0, parameters=model.parameters())
    result = train_step(fp16_precision(FakeGradScaler(init_loss_scaling=1024.0)), model, optimizer, clip_norm=clip_norm)

    assert result.grad_norm == pytest.approx(true_norm, rel=1e-5)  # the unscaled norm, not 1024x
    trained = [p for p in model.parameters() if not p.stop_gradient]
    updates = [b - p.numpy() for b, p in zip(before, trained, strict=True)]
    assert np.sqrt(sum(float((u**2).sum()) for u in updates)) == pytest.approx(clip_norm, rel=1e-4)
    for update, grad in zip(updates, true_grads, strict=True):
        # atol: float32 rounding of weight - update for weights of order 1.
        np.testing.assert_allclose(update, grad * clip_norm / true_norm, rtol=1e-4, atol=2e-7)


def test_clip_norm_larger_than_the_norm_leaves_gradients_alone():
    model, reference = make_model(), make_model()
    opt_a, opt_b = make_optimizer("momentum", model), make_optimizer("momentum", reference)
    result = train_step(Precision(), model, opt_a, clip_norm=1e6)
    train_step(Precision(), reference, opt_b)
    assert result.stepped
    for a, b in zip(model.parameters(), reference.parameters(), strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-6)


def huge_gradient_step(precision: Precision, model, optimizer) -> StepResult:
    """Finite gradients (3e38) whose global norm overflows float32: the scaler's own check passes them."""
    with precision.autocast():
        loss = model[-1].bias.sum() * paddle.to_tensor(3e38, dtype="float32")
    precision.backward(loss)
    return precision.step(optimizer, model.parameters())


@pytest.mark.parametrize("scaler", ["none", "fake", "paddle"])
def test_a_gradient_norm_that_overflows_skips_the_step(scaler, real_grad_scaler):
    """The clip zeroes such gradients; stepping on them would still move the weights by weight decay and
    momentum. With Paddle's scaler this relies on ``scaler._found_inf`` being what ``step()`` reads."""
    scalers = {"none": lambda: None, "fake": lambda: FakeGradScaler(init_loss_scaling=1.0),
               "paddle": lambda: real_grad_scaler(init_loss_scaling=1.0)}
    made = scalers[scaler]()
    precision = Precision() if made is None else fp16_precision(made)
    model = make_model()
    optimizer = make_optimizer("momentum", model)
    train_step(precision, model, optimizer)
    before_w, before_s = weights(model), flat_state(optimizer.state_dict())

    result = huge_gradient_step(precision, model, optimizer)

    assert result.found_inf and not result.stepped and result.grad_norm == float("inf")
    assert_same(weights(model), before_w)
    assert_same(flat_state(optimizer.state_dict()), before_s)
    if made is not None:
        assert precision.loss_scale == 0.5  # the scaler backed off as for any overflow


def test_clip_grad_norm_of_mixed_dtypes_works_in_float32_and_keeps_each_dtype():
    """O2 keeps norm layers in float32 and the rest in low precision (bfloat16 here: CPU has its kernels)."""
    ones = paddle.nn.initializer.Constant(1.0)
    low = paddle.create_parameter([2], "bfloat16", default_initializer=ones)
    high = paddle.create_parameter([3], "float32", default_initializer=ones)
    loss = (low.astype("float32") * paddle.to_tensor([300.0, 400.0])).sum() + (high * paddle.to_tensor(
        [0.0, 1200.0, 0.0])).sum()
    loss.backward()

    norm = clip_grad_norm_([low, high], 13.0)

    assert float(norm) == pytest.approx(1300.0)  # sqrt(300^2 + 400^2 + 1200^2), no bfloat16 rounding
    assert low.grad.dtype == paddle.bfloat16 and high.grad.dtype == paddle.float32
    np.testing.assert_allclose(low.grad.astype("float32").numpy(), [3.0, 4.0], rtol=1e-2)
    np.testing.assert_allclose(high.grad.numpy(), [0.0, 12.0, 0.0], rtol=1e-5)


def test_clip_grad_norm_without_a_limit_measures_and_leaves_gradients_bit_identical():
    model = make_model()
    model(batch()).square().mean().backward()
    trained = [p for p in model.parameters() if p.grad is not None]  # not BatchNorm's running statistics
    grads = [p.grad.numpy().copy() for p in trained]
    norm = clip_grad_norm_(model.parameters(), None)
    assert float(norm) == pytest.approx(np.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads)),
                                        rel=1e-5)
    for grad, p in zip(grads, trained, strict=True):
        np.testing.assert_array_equal(p.grad.numpy(), grad)
    assert clip_grad_norm_([paddle.create_parameter([2], "float32")], 1.0) is None  # no gradient at all


def test_state_dict_round_trip_is_plain_python_and_restores_scale_and_counters():
    precision = fp16_precision(FakeGradScaler(init_loss_scaling=64.0, incr_every_n_steps=5))
    model = make_model()
    optimizer = make_optimizer("momentum", model)
    train_step(precision, model, optimizer, bad=True)
    train_step(precision, model, optimizer)
    train_step(precision, model, optimizer)
    state = precision.state_dict()
    json.dumps(state)  # storable by any checkpoint format

    restored = fp16_precision(FakeGradScaler(init_loss_scaling=2.0**16))
    restored.load_state_dict(state)
    assert restored.loss_scale == 32.0
    assert restored.state_dict() == state
    assert state["scaler"]["incr_count"] == 2


def test_loading_scaler_state_into_a_run_without_scaler_warns_and_is_ignored(caplog):
    state = fp16_precision(FakeGradScaler()).state_dict()
    with caplog.at_level(logging.WARNING, logger="paddletrain.engine.precision"):
        Precision().load_state_dict(state)
    assert "ignored" in caplog.text
    assert Precision().state_dict() == {}


# ---------------------------------------------------------------------------------------------- Paddle parity
def run_sequence(precision: Precision, pattern: str):
    model = make_model()
    optimizer = make_optimizer("momentum", model)
    scales = [train_step(precision, model, optimizer, bad=(c == "x")).loss_scale for c in pattern]
    return scales + [precision.loss_scale], [p.numpy() for p in model.parameters()]


def test_fake_scaler_matches_paddles_real_grad_scaler(real_grad_scaler):
    settings = dict(init_loss_scaling=16.0, incr_every_n_steps=2, decr_every_n_nan_or_inf=2)
    real = real_grad_scaler(**settings)
    pattern = "..xx.x..x"
    real_scales, real_weights = run_sequence(fp16_precision(real), pattern)
    fake_scales, fake_weights = run_sequence(fp16_precision(FakeGradScaler(**settings)), pattern)

    assert fake_scales == real_scales
    assert real_scales[-1] != 16.0  # the pattern really exercises growth and back-off
    assert real._scale.shape == [1]  # what Paddle's unscale kernel and state_dict expect after GradScaler._update
    for a, b in zip(real_weights, fake_weights, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    fake_state, real_state = FakeGradScaler(**settings).state_dict(), real_grad_scaler(**settings).state_dict()
    assert fake_state.keys() == real_state.keys()


@pytest.mark.xfail(strict=True, raises=TypeError, reason="Paddle 3.3 GradScaler._update: float() of a [1] tensor")
def test_upstream_grad_scaler_backoff_still_crashes_under_numpy_2_4(real_grad_scaler):
    """When this starts passing, Paddle fixed its back-off and precision.GradScaler can go."""
    if np.lib.NumpyVersion(np.__version__) < "2.4.0":
        raise TypeError("older NumPy: the upstream bug does not show, nothing to check")
    run_sequence(fp16_precision(real_grad_scaler(paddle.amp.GradScaler, init_loss_scaling=4.0)), "x")


def test_state_round_trip_into_paddles_real_grad_scaler(real_grad_scaler):
    source = fp16_precision(FakeGradScaler(init_loss_scaling=128.0, incr_every_n_steps=7))
    model = make_model()
    optimizer = make_optimizer("momentum", model)
    train_step(source, model, optimizer, bad=True)
    train_step(source, model, optimizer)
    target = fp16_precision(real_grad_scaler())
    target.load_state_dict(json.loads(json.dumps(source.state_dict())))
    assert target.loss_scale == 64.0
    assert target.state_dict() == source.state_dict()


# ---------------------------------------------------------------------------------------------- configuration
def test_amp_is_inert_on_cpu_logs_one_line_and_runs_float32(caplog):
    model = make_model()
    optimizer = make_optimizer("momentum", model)
    with caplog.at_level(logging.INFO, logger="paddletrain.engine.precision"):
        precision = Precision(enabled=True, level="O2", dtype="float16", device="cpu")
    assert [r.levelno for r in caplog.records] == [logging.INFO]
    assert "inert on CPU" in caplog.text and "float32" in caplog.text
    assert precision.scaler is None and not precision.amp_active
    assert isinstance(precision.autocast(), nullcontext)
    assert precision.setup(model, optimizer) == (model, optimizer)
    assert model.parameters()[0].dtype == paddle.float32


def test_autocast_runs_eval_in_float32_unless_eval_in_amp_or_o2():
    def ctx(**kw):
        return Precision(enabled=True, dtype="bfloat16", device="gpu:0", **kw)

    assert not isinstance(ctx().autocast(training=True), nullcontext)
    assert isinstance(ctx().autocast(training=False), nullcontext)
    assert not isinstance(ctx(eval_in_amp=True).autocast(training=False), nullcontext)
    assert not isinstance(ctx(level="O2").autocast(training=False), nullcontext)
    assert isinstance(Precision(device="gpu:0").autocast(), nullcontext)


def test_auto_scaler_on_gpu_is_paddles_grad_scaler_with_the_configured_settings(real_grad_scaler):
    tracer = mock.Mock(_expected_place=mock.Mock(is_gpu_place=lambda: True))
    with mock.patch.object(grad_scaler, "_dygraph_tracer", lambda: tracer):
        precision = Precision.from_config(AmpConfig(enabled=True, init_loss_scaling=512.0, incr_every_n_steps=9),
                                          device="gpu:0")
    assert isinstance(precision.scaler, GradScaler)
    assert precision.loss_scale == 512.0
    assert precision.state_dict()["scaler"]["incr_every_n_steps"] == 9


@pytest.mark.parametrize(
    "kwargs, key",
    [
        (dict(level="O3"), "trainer.amp.level"),
        (dict(dtype="float8"), "trainer.amp.dtype"),
        (dict(decr_ratio=1.5), "trainer.amp.decr_ratio"),
        (dict(incr_ratio=1.0), "trainer.amp.incr_ratio"),
        (dict(incr_every_n_steps=0), "trainer.amp.incr_every_n_steps"),
        (dict(dtype="bfloat16", scaler=True), "trainer.amp.use_scaler"),
        (dict(dtype="bfloat16", scaler=FakeGradScaler()), "trainer.amp.use_scaler"),
    ],
)
def test_configuration_errors_name_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        Precision(enabled=True, device="cpu", **kwargs)


def test_from_config_bfloat16_with_use_scaler_true_is_an_error():
    with pytest.raises(ValueError, match=r"trainer\.amp\.use_scaler"):
        Precision.from_config(AmpConfig(enabled=True, dtype="bfloat16", use_scaler=True), device="gpu:0")
    assert Precision.from_config(AmpConfig(enabled=True, dtype="bfloat16"), device="gpu:0").scaler is None


def test_float16_without_scaler_warns():
    with pytest.warns(UserWarning, match="underflow"):
        Precision(enabled=True, dtype="float16", scaler=None, device="gpu:0")


def test_injected_scaler_without_amp_is_an_error():
    with pytest.raises(ValueError, match=r"trainer\.amp\.enabled"):
        Precision(enabled=False, scaler=FakeGradScaler())
