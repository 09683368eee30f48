"""Parameter groups (decay, head LR, layer decay) checked through real optimizer steps; every optimizer against
its published update rule (numpy references for LAMB, LARS, Nesterov SGD, RMSProp); LR curves at exact
iterations; configuration errors."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import paddle
import pytest
from paddle import nn

from paddletrain.config import OptimConfig
from paddletrain.models import create_model
from paddletrain.optim import DEFAULT_EPS, LarsMomentum, build_optimizer, param_groups, scaled_lr
from paddletrain.registry import OPTIMIZERS

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


def _rmsprop_decay_only(w, lr, wd, eps=1e-8, rho=0.9):
    g = wd * w  # L2 in the gradient; first step: r = (1 - rho) g^2, no momentum yet
    return w - lr * g / np.sqrt((1 - rho) * g * g + eps)


# What one step does to a decayed weight w when the loss gradient is zero: the decay alone, per its definition.
DECAY_ONLY_STEP = {
    "sgd": lambda w, lr, wd: w * (1 - lr * wd),  # L2 in the gradient
    "adamw": lambda w, lr, wd: w * (1 - lr * wd),  # decoupled
    "adam": lambda w, lr, wd: w - lr * (wd * w) / (np.abs(wd * w) + 1e-8),  # L2 gradient, normalised by Adam
    "rmsprop": _rmsprop_decay_only,
    "lamb": lambda w, lr, wd: w * (1 - lr),  # r = 0, trust ratio ||w|| / ||wd w|| cancels wd
    "lars": lambda w, lr, wd: w * (1 - lr * wd),  # ||g|| = 0: no layer-wise adaptation, plain decay
}


def test_every_registered_builtin_optimizer_is_covered():
    assert set(DECAY_ONLY_STEP) <= set(OPTIMIZERS.names())


@pytest.mark.parametrize("opt_name", sorted(DECAY_ONLY_STEP))
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
            expected = DECAY_ONLY_STEP[opt_name](value.astype("float64"), lr, wd)
            np.testing.assert_allclose(after[name], expected, rtol=1e-5, atol=1e-7, err_msg=name)
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


def test_norm_bias_lr_mult_is_applied_in_an_optimizer_step_on_top_of_the_head_mult():
    net, lr = make_net(), 0.1
    config = OptimConfig(name="sgd", lr=lr, momentum=0.0, weight_decay=0.0, head_lr_mult=2.0, norm_bias_lr_mult=8.0)
    optimizer = build_optimizer(net, config, lr)
    before = trainable(net)
    net(images()).square().mean().backward()
    grads = {n: p.grad.numpy().copy() for n, p in net.named_parameters() if p.grad is not None}
    optimizer.step()
    after = trainable(net)
    for name, mult in (("fc.weight", 2.0), ("fc.bias", 16.0), ("bn1.weight", 8.0), ("conv1.weight", 1.0)):
        assert np.abs(grads[name]).max() > 0, name
        np.testing.assert_allclose(before[name] - after[name], lr * mult * grads[name], rtol=1e-4, atol=1e-8,
                                   err_msg=name)


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



@pytest.mark.parametrize("name", sorted(DEFAULT_EPS))
def test_a_null_eps_is_the_optimizers_default_from_its_one_table(name):
    assert build_optimizer(make_net(), OptimConfig(name=name, eps=None), 1e-3)._epsilon == DEFAULT_EPS[name]
    assert build_optimizer(make_net(), OptimConfig(name=name, eps=3e-7), 1e-3)._epsilon == 3e-7

def optim_cfg(**options):
    """An OptimConfig with the keys the schema does not have yet (trust_coefficient, rho, centered)."""
    fields = {f.name for f in dataclasses.fields(OptimConfig)}
    base = OptimConfig(**{k: v for k, v in options.items() if k in fields})
    return SimpleNamespace(**{**dataclasses.asdict(base), **options})


@pytest.mark.parametrize(
    "make_cfg, match",
    [
        (lambda: OptimConfig(name="lion"), r"unknown optimizer optim\.name='lion'.*registered: .*lamb, lars"),
        (lambda: OptimConfig(name="lamd"), r"did you mean lamb"),
        (lambda: OptimConfig(name="sgd", momentum=1.0), r"optim\.momentum"),
        (lambda: OptimConfig(name="lars", momentum=-0.1), r"optim\.momentum"),
        (lambda: OptimConfig(name="adamw", betas=[0.9]), r"optim\.betas"),
        (lambda: OptimConfig(name="adamw", betas=[0.9, 1.0]), r"optim\.betas=\[0\.9, 1\.0\] is not allowed"),
        (lambda: OptimConfig(name="lamb", eps=0.0), r"optim\.eps"),
        (lambda: optim_cfg(name="lars", trust_coefficient=0.0), r"optim\.trust_coefficient"),
        (lambda: optim_cfg(name="rmsprop", rho=1.0), r"optim\.rho"),
    ],
)
def test_build_optimizer_errors(make_cfg, match):
    # An OptimConfig is checked when constructed, the rest when the optimizer is built: both name the key.
    with pytest.raises(ValueError, match=match):
        build_optimizer(make_net(), make_cfg(), 0.1)


def test_scaled_lr():
    assert scaled_lr(0.1, 512, 256) == pytest.approx(0.2)
    with pytest.raises(ValueError, match=r"optim\.base_batch_size"):
        scaled_lr(0.1, 64, 0)


# ---------------------------------------------------------------------------------------------- update rules
class TwoLayer(nn.Layer):
    """A body and a head: groups for decay / no decay (biases) x LR multiplier 1 / head_lr_mult."""

    def __init__(self):
        super().__init__()
        self.body = nn.Linear(3, 4)
        self.fc = nn.Linear(4, 2)


def two_layer(seed: int = 0) -> TwoLayer:
    net = TwoLayer()
    rng = np.random.default_rng(seed)
    for param in net.parameters():  # non-zero biases too, so the no-decay group has a real norm
        param.set_value((rng.uniform(0.5, 1.5, param.shape) * rng.choice([-1, 1], param.shape)).astype("float32"))
    return net


def synthetic_gradients(net, steps: int, seed: int = 1):
    rng = np.random.default_rng(seed)
    return [[rng.standard_normal(p.shape).astype("float32") for p in net.parameters()] for _ in range(steps)]


def run_steps(net, optimizer, gradients):
    """Optimizer steps whose gradients are exactly ``gradients`` (the loss is linear in the parameters)."""
    for step in gradients:
        loss = sum((p * paddle.to_tensor(g)).sum() for p, g in zip(net.parameters(), step, strict=True))
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
    return [p.numpy().astype("float64") for p in net.parameters()]


def reference_setup(net, wd, head_lr_mult):
    """Per parameter (float64 weights, weight decay, LR multiplier) as param_groups assigns them."""
    head = {id(p) for p in net.fc.parameters()}
    return [(p.numpy().astype("float64"), wd if len(p.shape) > 1 else 0.0, head_lr_mult if id(p) in head else 1.0)
            for p in net.parameters()]


def lamb_reference(setup, gradients, lr, beta1, beta2, eps):
    """You et al. 2019, Algorithm 2 (LAMB with Adam's bias correction); no-decay tensors take the Adam step."""
    out = []
    for i, (w, wd, mult) in enumerate(setup):
        m = v = 0.0
        for t, step in enumerate(gradients, start=1):
            g = step[i].astype("float64")
            m = beta1 * m + (1 - beta1) * g
            v = beta2 * v + (1 - beta2) * g * g
            r = (m / (1 - beta1**t)) / (np.sqrt(v / (1 - beta2**t)) + eps)
            update = r + wd * w
            ratio = np.linalg.norm(w) / np.linalg.norm(update) if wd > 0 else 1.0
            w = w - lr * mult * ratio * update
        out.append(w)
    return out


def lars_reference(setup, gradients, lr, momentum, trust, eps):
    """You et al. 2017, Algorithm 1 (LARS with momentum); no-decay tensors take the plain momentum step."""
    out = []
    for i, (w, wd, mult) in enumerate(setup):
        velocity = 0.0
        for step in gradients:
            g = step[i].astype("float64")
            local = 1.0
            if wd > 0:
                local = trust * np.linalg.norm(w) / (np.linalg.norm(g) + wd * np.linalg.norm(w) + eps)
            velocity = momentum * velocity + lr * mult * local * (g + wd * w)
            w = w - velocity
        out.append(w)
    return out


def nesterov_reference(setup, gradients, lr, momentum):
    """Nesterov momentum as Sutskever et al. 2013 / PyTorch: v = mu v + g; w -= lr (g + mu v); L2 in g."""
    out = []
    for i, (w, wd, mult) in enumerate(setup):
        velocity = 0.0
        for step in gradients:
            g = step[i].astype("float64") + wd * w
            velocity = momentum * velocity + g
            w = w - lr * mult * (g + momentum * velocity)
        out.append(w)
    return out


def rmsprop_reference(setup, gradients, lr, rho, momentum, eps):
    """RMSProp with momentum, epsilon inside the square root (TensorFlow's form); L2 in g."""
    out = []
    for i, (w, wd, mult) in enumerate(setup):
        mean_square = velocity = 0.0
        for step in gradients:
            g = step[i].astype("float64") + wd * w
            mean_square = rho * mean_square + (1 - rho) * g * g
            velocity = momentum * velocity + lr * mult * g / np.sqrt(mean_square + eps)
            w = w - velocity
        out.append(w)
    return out


UPDATE_RULES = {
    "lamb": (dict(lr=0.05, weight_decay=0.1, betas=[0.9, 0.99], eps=1e-6),
             lambda s, g, c: lamb_reference(s, g, c.lr, c.betas[0], c.betas[1], c.eps)),
    "lars": (dict(lr=2.0, weight_decay=0.05, momentum=0.9, trust_coefficient=0.02, eps=1e-8),
             lambda s, g, c: lars_reference(s, g, c.lr, c.momentum, c.trust_coefficient, c.eps)),
    "sgd": (dict(lr=0.05, weight_decay=0.1, momentum=0.9, nesterov=True),
            lambda s, g, c: nesterov_reference(s, g, c.lr, c.momentum)),
    "rmsprop": (dict(lr=0.01, weight_decay=0.1, momentum=0.9, rho=0.8, eps=1e-6),
                lambda s, g, c: rmsprop_reference(s, g, c.lr, c.rho, c.momentum, c.eps)),
}


@pytest.mark.parametrize("opt_name", sorted(UPDATE_RULES))
def test_three_steps_match_the_published_update_rule_for_decay_and_no_decay_groups(opt_name):
    options, reference = UPDATE_RULES[opt_name]
    cfg = optim_cfg(name=opt_name, head_lr_mult=2.0, **options)
    net = two_layer()
    setup = reference_setup(net, cfg.weight_decay, cfg.head_lr_mult)
    gradients = synthetic_gradients(net, 3)
    result = run_steps(net, build_optimizer(net, cfg, cfg.lr), gradients)
    expected = reference(setup, gradients, cfg)
    for (start, wd, mult), got, want in zip(setup, result, expected, strict=True):
        moved = np.abs(want - start).max()
        assert moved > 1e-3, "the steps must move every tensor for the comparison to mean anything"
        # Compare the displacements: float32 rounding of w itself would hide an error in a small update.
        np.testing.assert_allclose(got - start, want - start, rtol=1e-4, atol=1e-6 * moved,
                                   err_msg=f"{opt_name} wd={wd} lr_mult={mult}")


def test_lars_adapts_only_the_decayed_tensors():
    cfg = optim_cfg(name="lars", lr=2.0, weight_decay=0.05, momentum=0.0, trust_coefficient=0.02)
    net = two_layer()
    start = [p.numpy().astype("float64") for p in net.parameters()]
    gradients = synthetic_gradients(net, 1)
    result = run_steps(net, build_optimizer(net, cfg, cfg.lr), gradients)
    for param, before, after, g in zip(net.parameters(), start, result, gradients[0], strict=True):
        plain_sgd = before - cfg.lr * g
        if len(param.shape) > 1:  # adapted: the trust ratio makes the step far smaller than lr * g
            assert np.abs(after - before).max() < 0.1 * np.abs(plain_sgd - before).max()
        else:
            np.testing.assert_allclose(after, plain_sgd, rtol=1e-6)


@pytest.mark.parametrize("opt_name", ["lamb", "lars"])
def test_optimizer_state_round_trip_continues_exactly(opt_name):
    cfg = optim_cfg(name=opt_name, lr=0.05, weight_decay=0.05, momentum=0.9, trust_coefficient=0.02)
    gradients = synthetic_gradients(two_layer(), 4)
    straight = two_layer()
    expected = run_steps(straight, build_optimizer(straight, cfg, cfg.lr), gradients)

    # Optimizer state is keyed by parameter and accumulator names; each guard names them as a fresh process
    # (a real resume) does.
    with paddle.utils.unique_name.guard():
        first = two_layer()
        optimizer = build_optimizer(first, cfg, cfg.lr)
        run_steps(first, optimizer, gradients[:2])
        model_state, optimizer_state = first.state_dict(), optimizer.state_dict()
    with paddle.utils.unique_name.guard():
        resumed = two_layer(seed=7)
        optimizer = build_optimizer(resumed, cfg, cfg.lr)
        resumed.set_state_dict(model_state)
        optimizer.set_state_dict(optimizer_state)
        result = run_steps(resumed, optimizer, gradients[2:])
    for got, want in zip(result, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_lars_is_paddles_kernel_with_groups():
    optimizer = build_optimizer(two_layer(), optim_cfg(name="lars", weight_decay=0.01), 0.1)
    assert isinstance(optimizer, LarsMomentum)
    assert isinstance(optimizer, paddle.incubate.optimizer.LarsMomentumOptimizer)
    decays = sorted(g["lars_weight_decay"] for g in optimizer._param_groups)
    assert decays == [0.0, 0.01] and all(g["weight_decay"] is None for g in optimizer._param_groups)
