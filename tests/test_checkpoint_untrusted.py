"""The checks of untrusted values and of whole saved structures built from them (paddletrain.checkpoint.untrusted):
each returns what its reader may use, or raises StateValueError naming the dotted key of the first value that
does not fit."""
from __future__ import annotations

import math

import numpy as np
import pytest

from paddletrain.checkpoint.untrusted import (
    StateValueError,
    anything,
    checked_bool,
    checked_int,
    checked_number,
    like,
    list_of,
    mapping_of,
    record,
    tensor,
)

PROGRESS = record({"epoch": checked_int}, optional={"finished": checked_bool, "note": anything},
                  defaults={"finished": False})


def test_a_record_checks_its_fields_fills_defaults_and_drops_what_it_does_not_know():
    assert PROGRESS({"epoch": 3, "extra": [1]}, "progress") == {"epoch": 3, "finished": False}
    assert PROGRESS({"epoch": 3, "finished": True, "note": "x"}, "progress") == {"epoch": 3, "finished": True,
                                                                                "note": "x"}
    with pytest.raises(StateValueError, match=r"^progress\.epoch is missing$"):
        PROGRESS({"finished": True}, "progress")
    with pytest.raises(StateValueError, match=r"^progress\.finished is 'no': expected true or false$"):
        PROGRESS({"epoch": 3, "finished": "no"}, "progress")
    with pytest.raises(StateValueError, match=r"^progress is \[3\]: expected a mapping"):
        PROGRESS([3], "progress")


def test_a_record_passes_other_keys_through_their_own_check():
    flat = record(optional={"lr": anything}, others=tensor)
    moment = np.zeros(3, np.float32)
    assert flat({"lr": {"x": 1}, "w_moment": moment}, "optimizer")["w_moment"] is moment
    with pytest.raises(StateValueError, match=r"^optimizer\.w_moment is 'abc': expected a tensor$"):
        flat({"w_moment": "abc"}, "optimizer")


def test_the_whole_state_is_named_where_its_key_is_empty():
    with pytest.raises(StateValueError, match=r"^\(the whole state\) is 3: expected a mapping"):
        PROGRESS(3, "")
    with pytest.raises(StateValueError, match=r"^epoch is missing$"):  # a top-level field, without a leading dot
        PROGRESS({}, "")


def test_a_mapping_of_checks_every_value_under_its_name_and_refuses_keys_that_are_not_names():
    numbers = mapping_of(checked_number, what="metric names")
    assert numbers({"val/top1": np.float32(0.5), "loss": math.inf}, "metrics") == {"val/top1": 0.5, "loss": math.inf}
    with pytest.raises(StateValueError, match=r"^metrics\.val/top1 is 'high': expected a number$"):
        numbers({"val/top1": "high"}, "metrics")
    with pytest.raises(StateValueError, match=r"^metrics has the key 1: expected metric names$"):
        numbers({1: 0.5}, "metrics")
    nested = mapping_of(mapping_of(tensor))
    with pytest.raises(StateValueError, match=r"^opt\.conv\.weight\.velocity is None: expected a tensor$"):
        nested({"conv.weight": {"velocity": None}}, "opt")


def test_a_list_of_holds_its_length_and_names_each_item_by_index():
    counts = list_of(checked_int, what="counts", min_items=1, max_items=3)
    assert counts((1, 2), "c") == [1, 2]
    for value in ([], [1, 2, 3, 4], {"a": 1}, "12"):
        with pytest.raises(StateValueError, match=r"^c is not a list of counts \(1 to 3\)"):
            counts(value, "c")
    with pytest.raises(StateValueError, match=r"^c\[1\] is True: expected an integer"):
        counts([1, True], "c")


def test_like_holds_a_saved_state_to_the_kinds_of_the_state_now():
    now = {"last_epoch": -1, "last_lr": 0.1, "verbose": False, "milestones": [3, 6], "name": "step"}
    check = like(now)
    saved = {"last_epoch": 7, "last_lr": 0.01, "verbose": True, "milestones": [3, 6], "name": "any", "extra": 1}
    assert check(saved, "scheduler") == saved  # what the scheduler does not have now is kept as it was
    assert check({**saved, "last_lr": 1}, "scheduler")["last_lr"] == 1  # an int rate is a rate
    for key, value, says in (("last_epoch", "8", r"scheduler\.last_epoch is '8'"),
                             ("last_epoch", -2, r"scheduler\.last_epoch is -2"),
                             ("last_lr", math.nan, r"scheduler\.last_lr is nan: expected a finite number"),
                             ("verbose", 1, r"scheduler\.verbose is 1: expected true or false"),
                             ("milestones", [3], r"scheduler\.milestones is \[3\]: expected a list of 2 values"),
                             ("milestones", [3, "6"], r"scheduler\.milestones\[1\] is '6'")):
        with pytest.raises(StateValueError, match=says):
            check({**saved, key: value}, "scheduler")


def test_a_tensor_is_anything_with_a_shape_and_a_dtype():
    array = np.ones((2, 3), np.float32)
    assert tensor(array, "w") is array
    for value in ([1.0, 2.0], 1.0, {"shape": [2]}):
        with pytest.raises(StateValueError, match=r"^w is .*: expected a tensor$"):
            tensor(value, "w")
