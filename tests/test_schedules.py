"""Learning-rate schedules: each registered shape, warmup, resume, and their errors naming the key."""
from __future__ import annotations

import itertools
import math

import pytest

from paddletrain.config import SchedConfig
from paddletrain.errors import ConfigError
from paddletrain.schedules import build_scheduler, schedule_steps


def build(cfg: SchedConfig, lr: float, steps_per_epoch: int, max_epochs: int):
    return build_scheduler(cfg, lr, schedule_steps(steps_per_epoch, max_epochs, cfg.warmup_epochs))

def curve(scheduler, n: int):
    """The LR used by iterations 0..n-1 (one scheduler.step() after each optimizer step)."""
    values = []
    for _ in range(n):
        values.append(scheduler())
        scheduler.step()
    return values


def test_cosine_midpoint_is_the_mean_of_lr_and_min_lr_and_it_holds_min_lr_at_the_end():
    lrs = curve(build(SchedConfig(name="cosine", min_lr=0.01), 0.1, 10, 10), 110)
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[50] == pytest.approx((0.1 + 0.01) / 2)
    assert lrs[100] == pytest.approx(0.01) and lrs[109] == pytest.approx(0.01)
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def test_linear_warmup_then_cosine_starts_counting_after_warmup():
    cfg = SchedConfig(name="cosine", warmup_epochs=2, warmup_start_factor=0.1, min_lr=0.0)
    lrs = curve(build(cfg, 0.1, 10, 10), 100)
    assert lrs[0] == pytest.approx(0.01)
    assert lrs[10] == pytest.approx((0.01 + 0.1) / 2)  # halfway through warmup
    assert lrs[20] == pytest.approx(0.1)  # warmup end = start of the cosine
    assert lrs[60] == pytest.approx(0.05)  # cosine midpoint over the 80 steps after warmup
    assert lrs[99] == pytest.approx(0.1 * 0.5 * (1 + math.cos(math.pi * 79 / 80)))


def test_fractional_warmup_epochs():
    cfg = SchedConfig(name="constant", warmup_epochs=0.5, warmup_start_factor=0.0)
    lrs = curve(build(cfg, 1.0, 10, 2), 8)
    assert lrs[:6] == pytest.approx([0.0, 0.2, 0.4, 0.6, 0.8, 1.0])
    assert lrs[7] == 1.0


def test_step_schedule_drops_at_absolute_epochs_even_with_warmup():
    cfg = SchedConfig(name="step", step_size=3, gamma=0.1, warmup_epochs=1)
    lrs = curve(build(cfg, 1.0, 10, 10), 100)
    assert lrs[10] == pytest.approx(1.0)  # warmup end
    assert lrs[29] == pytest.approx(1.0) and lrs[30] == pytest.approx(0.1)
    assert lrs[59] == pytest.approx(0.1) and lrs[60] == pytest.approx(0.01)
    assert lrs[90] == pytest.approx(0.001)


def test_multistep_schedule_drops_at_each_milestone():
    cfg = SchedConfig(name="multistep", milestones=[2, 5], gamma=0.5)
    lrs = curve(build(cfg, 0.8, 4, 8), 32)
    assert lrs[7] == pytest.approx(0.8) and lrs[8] == pytest.approx(0.4)
    assert lrs[19] == pytest.approx(0.4) and lrs[20] == pytest.approx(0.2) and lrs[31] == pytest.approx(0.2)


def test_onecycle_peaks_at_lr_times_max_lr_factor_after_pct_start():
    cfg = SchedConfig(name="onecycle", max_lr_factor=2.0, pct_start=0.25, min_lr=0.0)
    lrs = curve(build(cfg, 0.1, 10, 4), 40)
    assert max(lrs) == pytest.approx(0.2) and lrs.index(max(lrs)) == 9  # Paddle peaks at pct * steps - 1
    assert lrs[0] == pytest.approx(0.2 / 25)
    assert lrs[39] == pytest.approx(0.0, abs=1e-9)


def test_warmup_scheduler_state_round_trip_resumes_the_same_curve():
    cfg = SchedConfig(name="cosine", warmup_epochs=1)
    reference = curve(build(cfg, 0.1, 5, 4), 20)
    first = build(cfg, 0.1, 5, 4)
    curve(first, 7)
    resumed = build(cfg, 0.1, 5, 4)
    resumed.set_state_dict(first.state_dict())
    assert curve(resumed, 13) == pytest.approx(reference[7:])


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(name="poly"), r"unknown scheduler sched\.name='poly'"),
        (dict(name="cosine", warmup_epochs=10), r"sched\.warmup_epochs"),
        (dict(name="multistep", milestones=[1, 3], warmup_epochs=2), r"sched\.milestones.*warmup"),
        (dict(name="onecycle", pct_start=1.5), r"sched\.pct_start"),
        (dict(name="cosine", warmup_epochs=1, warmup_start_factor=1.0), r"sched\.warmup_start_factor"),
    ],
)
def test_build_scheduler_errors_name_the_key(options, match):
    # A SchedConfig is checked when constructed, the rest when the schedule is built: both name the key.
    with pytest.raises(ValueError, match=match):
        build(SchedConfig(**options), 0.1, 10, 10)



@pytest.mark.parametrize("warmup_epochs, steps_per_epoch, words", [
    # 4 steps, 1 of them warm-up: the cycle has 3, named with the warm-up that took the fourth.
    (0.25, 4, r"of the 3-step one-cycle schedule \(4 optimizer steps less sched\.warmup_epochs' 1\): train more "
              r"steps .*, or sched\.warmup_epochs=0$"),
    # 10 steps without warm-up: a pct_start that leaves 2 steps each side is named.
    (0.0, 10, r"of the 10-step one-cycle schedule: set sched\.pct_start between 0\.2 and 0\.8$"),
])
def test_a_onecycle_too_short_for_pct_start_names_its_length_and_what_to_change(warmup_epochs, steps_per_epoch,
                                                                                   words):
    cfg = SchedConfig(name="onecycle", pct_start=0.1, warmup_epochs=warmup_epochs)
    with pytest.raises(ConfigError, match=r"sched\.pct_start=0\.1 leaves a phase under 2 steps " + words):
        build(cfg, 0.1, steps_per_epoch, 1)
    fixed = SchedConfig(name="onecycle", pct_start=0.2, warmup_epochs=0.0)
    if steps_per_epoch == 10:  # the value the message offers works
        build(fixed, 0.1, steps_per_epoch, 1)
