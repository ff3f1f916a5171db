"""The shared input checks: what each accepts, and the "Expected ... Received: ..." of what it refuses."""

import pathlib

import numpy as np
import pytest

from tb_gradcheck.core import validate


@pytest.mark.parametrize("value", [1, 7, np.int64(3)])
def test_positive_int_accepts_counts(value):
    assert validate.positive_int(value, "n") == int(value) and type(validate.positive_int(value, "n")) is int


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "3", None])
def test_positive_int_refuses_the_rest(value):
    with pytest.raises(ValueError, match=f"Expected `n` to be a positive integer. Received: {value!r}"):
        validate.positive_int(value, "n")


def test_non_negative_int_and_fraction():
    assert validate.non_negative_int(0, "seed") == 0
    with pytest.raises(ValueError, match="`seed` to be a non-negative integer.*Received: -1"):
        validate.non_negative_int(-1, "seed")
    with pytest.raises(ValueError, match="Received: 18446744073709551616"):
        validate.non_negative_int(2**64, "seed")
    assert validate.fraction(0.25, "tolerance") == 0.25
    for bad in (0, 1, 1.5):
        with pytest.raises(ValueError, match="between 0 and 1 \\(exclusive\\)"):
            validate.fraction(bad, "tolerance")
    with pytest.raises(TypeError, match="`tolerance` to be a number. Received: str"):
        validate.fraction("0.1", "tolerance")


def test_path_and_one_of():
    assert validate.path(pathlib.Path("a/b"), "logdir") == "a/b"
    assert validate.path(b"logs", "logdir") == "logs"
    with pytest.raises(TypeError, match="`logdir` to be a path. Received: int"):
        validate.path(3, "logdir")
    assert validate.one_of("layer", "granularity", ("layer", "variable")) == "layer"
    with pytest.raises(ValueError, match="one of \\['layer', 'variable'\\]. Received: 'row'"):
        validate.one_of("row", "granularity", ("layer", "variable"))


@pytest.mark.parametrize("value", [np.ones(2), "ab", {"a": 1}, {1, 2}, 5])
def test_non_empty_list_refuses_iterables_that_are_not_lists(value):
    with pytest.raises(TypeError, match="`gradients` to be a list. Received"):
        validate.non_empty_list(value, "gradients")


def test_exactly_one_instance_and_optional_path():
    validate.exactly_one(logdir="a", writer=None)
    with pytest.raises(
        ValueError, match="Expected exactly one of `logdir` and `writer`. Received: logdir=None, writer=None"
    ):
        validate.exactly_one(logdir=None, writer=None)
    with pytest.raises(ValueError, match="Received: logdir='a', writer=3"):
        validate.exactly_one(logdir="a", writer=3)
    assert validate.instance(3, "n", int, "an int") == 3
    with pytest.raises(TypeError, match="Expected `model` to be a torch.nn.Module. Received: str"):
        validate.instance("m", "model", int, "a torch.nn.Module")
    assert validate.optional_path(None, "log_dir") is None
    assert validate.optional_path(pathlib.Path("x"), "log_dir") == "x"
    with pytest.raises(TypeError, match="Expected `log_dir` to be a path or None. Received: list"):
        validate.optional_path([], "log_dir")
