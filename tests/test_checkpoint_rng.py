"""Random generator state: captured without pickle, restored exactly, also through a checkpoint."""
from __future__ import annotations

import random

import numpy as np
import paddle

from paddletrain.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from paddletrain.checkpoint.rng import generator_state_from_dict, generator_state_to_dict


def _draw():
    return random.random(), np.random.rand(3), paddle.randn([4]).numpy()


def test_generator_state_survives_its_dict_form():
    paddle.seed(123)
    paddle.randn([7])  # advance the engine so the state is not just the seed
    state = paddle.get_rng_state("cpu")[0]
    rebuilt = generator_state_from_dict(generator_state_to_dict(state))
    assert rebuilt.__getstate__() == state.__getstate__()


def test_restored_generators_repeat_the_same_draws(tmp_path):
    random.seed(1), np.random.seed(1), paddle.seed(1)
    _draw()
    path = save_checkpoint(tmp_path / "c", {"rng": rng_state()})
    expected = _draw()
    _draw()  # move every generator on
    set_rng_state(load_checkpoint(path).state["rng"])
    actual = _draw()
    assert actual[0] == expected[0]
    np.testing.assert_array_equal(actual[1], expected[1])
    np.testing.assert_array_equal(actual[2], expected[2])


def test_set_rng_state_accepts_lists_for_tuples():
    snapshot = rng_state()
    expected = _draw()
    version, internal, gauss = snapshot["python"]
    kind, keys, pos, has_gauss, cached = snapshot["numpy"]
    set_rng_state({"python": [version, list(internal), gauss], "numpy": [kind, keys, pos, has_gauss, cached],
                   "paddle_cpu": snapshot["paddle_cpu"]})
    actual = _draw()
    assert actual[0] == expected[0]
    np.testing.assert_array_equal(actual[2], expected[2])
