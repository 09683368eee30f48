"""comparisons/step_profile.py: a short profile whose parts add up to the step."""
from __future__ import annotations

import pytest

from comparisons.step_profile import StepProfileConfig, run_step_profile


def test_a_short_profile_reports_every_part_and_the_peaks():
    result = run_step_profile(StepProfileConfig(model="resnet20", image_size=8, batch_size=4, steps=2, warmup=1,
                                                repeats=1))
    assert [row["part of a step"] for row in result["rows"]] == ["forward", "backward", "optimizer"]
    assert sum(float(row["share"].rstrip("%")) for row in result["rows"]) == pytest.approx(100, abs=0.2)
    assert result["achieved_gflops"] > 0 and len(result["peaks"]) == 6
    assert all(row["GFLOP/s"] > 0 for row in result["peaks"])



def test_the_profile_can_take_the_recipes_input_gradient_as_a_convolution():
    kwargs = dict(model="resnet20", image_size=8, batch_size=4, steps=1, warmup=0, repeats=1)
    plain = run_step_profile(StepProfileConfig(**kwargs))
    converted = run_step_profile(StepProfileConfig(**kwargs, conv_input_grad=True))
    # resnet20: 21 convolutions less the four strided ones (two 3x3, two 1x1 projections).
    assert (plain["converted"], converted["converted"]) == (0, 17)
    # The same layers and shapes: the arithmetic counted does not change with the backward's kernel.
    assert converted["flops_per_step"] == plain["flops_per_step"]
    assert "17 convolutions with model.conv_input_grad" in converted["notes"][0]
