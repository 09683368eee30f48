"""Parameter groups (decay, head LR, layer decay) checked through real optimizer steps; LR curves at exact
iterations; configuration errors."""
from __future__ import annotations

import math

import numpy as np
import paddle
import pytest
from paddle import nn

from paddletrain.config import OptimConfig, SchedConfig
from paddletrain.optim import build_optimizer, build_scheduler, param_groups, scaled_lr

paddle.set_device("cpu")


class TinyNet(nn.Layer):
    """ResNet's top-level layout: stem (conv1, bn1), param-less layers, two Sequential stages, a head."""

    def __init__(self, deep_stem: bool = False):
        super().__init__()
        self.conv1 = (
            nn.Sequential(nn.Conv2D(3, 4, 3, padding=1), nn.BatchNorm2D(4), nn.Conv2D(4, 4, 3, padding=1))
            if deep_stem
            else nn.Conv2D(3, 4, 3, padding=1)
        )
        self.bn1 = nn.BatchNorm2D(4)
        self.act = nn.ReLU()
        self.layer1 = nn.Sequential(nn.Conv2D(4, 4, 3, padding=1, bias_attr=False), nn.GroupNorm(2, 4))
        self.layer2 = nn.Sequential(nn.Conv2D(4, 6, 3, padding=1, bias_attr=False), nn.BatchNorm2D(6))
        self.norm = nn.LayerNorm(6)  # after the last stage: joins it
        self.pool = nn.AdaptiveAvgPool2D(1)
        self.fc = nn.Linear(6, 5)

    def forward(self, x):
        x = self.act(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        x = self.pool(x).flatten(1)
        return self.fc(self.norm(x))


def make_net(**kwargs) -> TinyNet:
    paddle.seed(0)
    return TinyNet(**kwargs)


def images():
    return paddle.to_tensor(np.random.default_rng(0).standard_normal((2, 3, 6, 6)).astype("float32"))


def group_of(groups, param):
    return next(g for g in groups if any(p is param for p in g["params"]))


def trainable(model):
    return {n: p.numpy().copy() for n, p in model.named_parameters() if not p.stop_gradient}


# ---------------------------------------------------------------------------------------------- param groups
def test_no_decay_on_norm_layers_and_biases_everything_else_decays():
    net = make_net()
    groups = param_groups(net, weight_decay=0.05)
    decay = {id(p) for g in groups if g["weight_decay"] > 0 for p in g["params"]}
    for name, param in net.named_parameters():
        is_norm_or_bias = name.startswith(("bn1", "norm", "layer1.1", "layer2.1")) or name.endswith("bias")
        assert (id(param) in decay) != is_norm_or_bias, name
    assert sum(len(g["params"]) for g in groups) == len(net.parameters())


@pytest.mark.parametrize("opt_name", ["sgd", "adamw"])
def test_a_zero_gradient_step_shrinks_weights_but_leaves_norms_and_biases(opt_name):
    net = make_net()
    lr, wd = 0.1, 0.5
    cfg = OptimConfig(name=opt_name, lr=lr, weight_decay=wd, momentum=0.9)
    optimizer = build_optimizer(net, cfg, lr)
    before = trainable(net)
    (net(images()) * 0).sum().backward()
    optimizer.step()
    after = trainable(net)
    for name, value in before.items():
        param = dict(net.named_parameters())[name]
        if len(param.shape) > 1 and not name.startswith(("layer1.1", "layer2.1")):
            np.testing.assert_allclose(after[name], value * (1 - lr * wd), rtol=1e-5, err_msg=name)
        else:
            np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_no_decay_norm_bias_false_decays_everything():
    groups = param_groups(make_net(), weight_decay=0.05, no_decay_norm_bias=False)
    assert [g["weight_decay"] for g in groups] == [0.05]


def test_head_lr_mult_is_applied_in_an_optimizer_step():
    net, lr, mult = make_net(), 0.1, 10.0
    config = OptimConfig(name="sgd", lr=lr, momentum=0.0, weight_decay=0.0, head_lr_mult=mult)
    optimizer = build_optimizer(net, config, lr)
    assert type(optimizer) is paddle.optimizer.SGD
    before = trainable(net)
    net(images()).square().mean().backward()
    grads = {n: p.grad.numpy().copy() for n, p in net.named_parameters() if p.grad is not None}
    optimizer.step()
    after = trainable(net)
    for name in ("fc.weight", "fc.bias", "layer1.0.weight", "conv1.weight"):
        expected_mult = mult if name.startswith("fc") else 1.0
        assert np.abs(grads[name]).max() > 0, name
        np.testing.assert_allclose(before[name] - after[name], lr * expected_mult * grads[name], rtol=1e-4,
                                   atol=1e-8, err_msg=name)


def test_layer_decay_multipliers_from_stem_to_head():
    net, d = make_net(), 0.5
    groups = param_groups(net, weight_decay=0.0, layer_decay=d, head_lr_mult=3.0)
    lr_of = {name: group_of(groups, p)["learning_rate"] for name, p in net.named_parameters()}
    # Two stages: stem d^3, layer1 d^2, layer2 (and the norm after it) d^1, head 1 x head_lr_mult.
    assert lr_of["conv1.weight"] == lr_of["bn1.weight"] == d**3
    assert lr_of["layer1.0.weight"] == lr_of["layer1.1.bias"] == d**2
    assert lr_of["layer2.0.weight"] == lr_of["norm.weight"] == d
    assert lr_of["fc.weight"] == lr_of["fc.bias"] == 3.0


def test_layer_decay_keeps_a_sequential_deep_stem_in_the_stem():
    net = make_net(deep_stem=True)
    groups = param_groups(net, weight_decay=0.0, layer_decay=0.5)
    assert group_of(groups, net.conv1[0].weight)["learning_rate"] == 0.5**3
    assert group_of(groups, net.layer1[0].weight)["learning_rate"] == 0.5**2


def test_layer_decay_uses_declared_stage_names():
    net = make_net()
    net.stage_names = ["layer2"]  # layer1 now precedes the first stage: part of the stem
    groups = param_groups(net, weight_decay=0.0, layer_decay=0.5)
    assert group_of(groups, net.layer1[0].weight)["learning_rate"] == 0.25
    assert group_of(groups, net.layer2[0].weight)["learning_rate"] == 0.5


def test_layer_decay_on_paddletrain_resnet_follows_its_stages():
    from paddletrain.models import create_model

    model = create_model("resnet20", num_classes=3)
    stages = list(model.stage_names)
    groups = param_groups(model, weight_decay=1e-4, layer_decay=0.8)
    first, last = getattr(model, stages[0]), getattr(model, stages[-1])
    assert group_of(groups, model.conv1.weight)["learning_rate"] == pytest.approx(0.8 ** (len(stages) + 1))
    assert group_of(groups, first.parameters()[0])["learning_rate"] == pytest.approx(0.8 ** len(stages))
    assert group_of(groups, last.parameters()[0])["learning_rate"] == pytest.approx(0.8)
    assert group_of(groups, model.get_classifier().weight)["learning_rate"] == 1.0


def test_param_group_errors_name_the_key():
    with pytest.raises(ValueError, match=r"optim\.layer_decay"):
        param_groups(make_net(), 0.0, layer_decay=1.5)
    with pytest.raises(ValueError, match=r"optim\.head_lr_mult"):
        param_groups(nn.Sequential(nn.Linear(2, 2)), 0.0, head_lr_mult=2.0)
    with pytest.raises(ValueError, match=r"optim\.weight_decay"):
        param_groups(make_net(), -1.0)


# ---------------------------------------------------------------------------------------------- optimizers
def test_build_optimizer_maps_config_to_paddle_optimizers():
    momentum = build_optimizer(make_net(), OptimConfig(name="sgd", momentum=0.8, nesterov=True), 0.1)
    assert type(momentum) is paddle.optimizer.Momentum
    assert momentum._momentum == 0.8 and momentum._use_nesterov
    adamw = build_optimizer(make_net(), OptimConfig(name="AdamW", betas=[0.8, 0.95], eps=1e-6), 1e-3)
    assert type(adamw) is paddle.optimizer.AdamW
    assert (adamw._beta1, adamw._beta2, adamw._epsilon) == (0.8, 0.95, 1e-6)
    assert adamw._grad_clip is None and momentum._grad_clip is None  # Precision.step clips


@pytest.mark.parametrize(
    "cfg, match",
    [
        (OptimConfig(name="lamb"), r"optim\.name must be one of \['sgd', 'adamw'\], got 'lamb'"),
        (OptimConfig(name="sgd", momentum=0.0, nesterov=True), r"optim\.nesterov"),
        (OptimConfig(name="sgd", momentum=1.0), r"optim\.momentum"),
        (OptimConfig(name="adamw", betas=[0.9]), r"optim\.betas"),
    ],
)
def test_build_optimizer_errors(cfg, match):
    with pytest.raises(ValueError, match=match):
        build_optimizer(make_net(), cfg, 0.1)


def test_scaled_lr():
    assert scaled_lr(0.1, 512, 256) == pytest.approx(0.2)
    with pytest.raises(ValueError, match=r"optim\.base_batch_size"):
        scaled_lr(0.1, 64, 0)


# ---------------------------------------------------------------------------------------------- schedules
def curve(scheduler, n: int):
    """The LR used by iterations 0..n-1 (one scheduler.step() after each optimizer step)."""
    values = []
    for _ in range(n):
        values.append(scheduler())
        scheduler.step()
    return values


def test_cosine_midpoint_is_the_mean_of_lr_and_min_lr_and_it_holds_min_lr_at_the_end():
    lrs = curve(build_scheduler(SchedConfig(name="cosine", min_lr=0.01), 0.1, steps_per_epoch=10, max_epochs=10), 110)
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[50] == pytest.approx((0.1 + 0.01) / 2)
    assert lrs[100] == pytest.approx(0.01) and lrs[109] == pytest.approx(0.01)
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))


def test_linear_warmup_then_cosine_starts_counting_after_warmup():
    cfg = SchedConfig(name="cosine", warmup_epochs=2, warmup_start_factor=0.1, min_lr=0.0)
    lrs = curve(build_scheduler(cfg, 0.1, steps_per_epoch=10, max_epochs=10), 100)
    assert lrs[0] == pytest.approx(0.01)
    assert lrs[10] == pytest.approx((0.01 + 0.1) / 2)  # halfway through warmup
    assert lrs[20] == pytest.approx(0.1)  # warmup end = start of the cosine
    assert lrs[60] == pytest.approx(0.05)  # cosine midpoint over the 80 steps after warmup
    assert lrs[99] == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 79 / 80)))


def test_fractional_warmup_epochs():
    cfg = SchedConfig(name="constant", warmup_epochs=0.5, warmup_start_factor=0.0)
    lrs = curve(build_scheduler(cfg, 1.0, steps_per_epoch=10, max_epochs=2), 8)
    assert lrs[:6] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert lrs[7] == 1.0


def test_step_schedule_drops_at_absolute_epochs_even_with_warmup():
    cfg = SchedConfig(name="step", step_size=3, gamma=0.1, warmup_epochs=1)
    lrs = curve(build_scheduler(cfg, 1.0, steps_per_epoch=10, max_epochs=10), 100)
    assert lrs[10] == pytest.approx(1.0)  # warmup end
    assert lrs[29] == pytest.approx(1.0) and lrs[30] == pytest.approx(0.1)
    assert lrs[59] == pytest.approx(0.1) and lrs[60] == pytest.approx(0.01)
    assert lrs[90] == pytest.approx(0.001)


def test_multistep_schedule_drops_at_each_milestone():
    cfg = SchedConfig(name="multistep", milestones=[2, 5], gamma=0.5)
    lrs = curve(build_scheduler(cfg, 0.8, steps_per_epoch=4, max_epochs=8), 32)
    assert lrs[7] == pytest.approx(0.8) and lrs[8] == pytest.approx(0.4)
    assert lrs[19] == pytest.approx(0.4) and lrs[20] == pytest.approx(0.2) and lrs[31] == pytest.approx(0.2)


def test_onecycle_peaks_at_lr_times_max_lr_factor_after_pct_start():
    cfg = SchedConfig(name="onecycle", max_lr_factor=2.0, pct_start=0.25, min_lr=0.0)
    lrs = curve(build_scheduler(cfg, 0.1, steps_per_epoch=10, max_epochs=4), 40)
    assert max(lrs) == pytest.approx(0.2) and lrs.index(max(lrs)) == 9  # Paddle peaks at pct * steps - 1
    assert lrs[0] == pytest.approx(0.2 / 25)
    assert lrs[39] == pytest.approx(0.0, abs=1e-9)


def test_warmup_scheduler_state_round_trip_resumes_the_same_curve():
    cfg = SchedConfig(name="cosine", warmup_epochs=1)
    reference = curve(build_scheduler(cfg, 0.1, 5, 4), 20)
    first = build_scheduler(cfg, 0.1, 5, 4)
    curve(first, 7)
    resumed = build_scheduler(cfg, 0.1, 5, 4)
    resumed.set_state_dict(first.state_dict())
    assert curve(resumed, 13) == pytest.approx(reference[7:])


@pytest.mark.parametrize(
    "cfg, match",
    [
        (SchedConfig(name="poly"), r"sched\.name must be one of"),
        (SchedConfig(name="cosine", warmup_epochs=10), r"sched\.warmup_epochs"),
        (SchedConfig(name="cosine", min_lr=1.0), r"sched\.min_lr"),
        (SchedConfig(name="multistep", milestones=[5, 3]), r"sched\.milestones"),
        (SchedConfig(name="multistep", milestones=[1, 3], warmup_epochs=2), r"sched\.milestones.*warmup"),
        (SchedConfig(name="onecycle", pct_start=1.5), r"sched\.pct_start"),
        (SchedConfig(name="cosine", warmup_epochs=1, warmup_start_factor=1.0), r"sched\.warmup_start_factor"),
    ],
)
def test_build_scheduler_errors_name_the_key(cfg, match):
    with pytest.raises(ValueError, match=match):
        build_scheduler(cfg, 0.1, steps_per_epoch=10, max_epochs=10)
