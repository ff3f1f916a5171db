"""The shared input checks: what each accepts, and the "Expected ... Received: ..." of what it refuses."""

import pathlib

import numpy as np
import pytest
import tensorflow as tf

from tb_gradcheck.core import validate
from tb_gradcheck.tensorflow import variables


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


@pytest.mark.parametrize("value", [tf.ones(2), np.ones(2), "ab", {"a": 1}, {1, 2}, 5])
def test_non_empty_list_refuses_iterables_that_are_not_lists(value):
    with pytest.raises(TypeError, match="`gradients` to be a list. Received"):
        validate.non_empty_list(value, "gradients")


def test_step_forms():
    assert variables.checked_step(5).dtype == tf.int64 and int(variables.checked_step(5)) == 5
    assert int(variables.checked_step(tf.Variable(3, dtype=tf.int32))) == 3
    with pytest.raises(ValueError, match="non-negative int64"):
        variables.checked_step(2**63)
    with pytest.raises(ValueError, match="non-negative. Received: -2"):
        variables.checked_step(tf.constant(-2))
    with pytest.raises(ValueError, match="scalar. Received: shape \\(2,\\)"):
        variables.checked_step(tf.constant([1, 2]))
    with pytest.raises(TypeError, match="Received: a float32 tensor"):
        variables.checked_step(tf.constant(1.0))
    with pytest.raises(TypeError, match="Received: True"):
        variables.checked_step(True)


def test_variables_refuses_empty_duplicates_integers_and_arrays():
    v = tf.Variable(1.0, name="v")
    with pytest.raises(ValueError, match="non-empty list of variables"):
        variables.checked_variables([])
    with pytest.raises(ValueError, match="variables\\[0\\] and variables\\[1\\] are the same variable 'v'"):
        variables.checked_variables([v, v])
    with pytest.raises(TypeError, match="floating-point variables.*int32"):
        variables.checked_variables([tf.Variable(1, name="count")])
    with pytest.raises(TypeError, match="variables\\[0\\] of type ndarray"):
        variables.checked_variables([np.ones(3)])


def test_gradients_checks_length_kind_dtype_and_shape():
    v = tf.Variable([1.0, 2.0], name="v")
    slices = tf.IndexedSlices(tf.ones((1,)), tf.constant([0]), tf.constant([2]))
    out = variables.checked_gradients([[1.0, 2.0]], [v])
    assert isinstance(out[0], tf.Tensor)
    assert (
        variables.checked_gradients([None], [v]) == [None] and variables.checked_gradients([slices], [v])[0] is slices
    )
    with pytest.raises(ValueError, match="len\\(gradients\\)=2, len\\(variables\\)=1"):
        variables.checked_gradients([tf.ones(2), tf.ones(2)], [v])
    with pytest.raises(ValueError, match="shape \\(3,\\) for variable 'v' of shape \\(2,\\)"):
        variables.checked_gradients([tf.ones(3)], [v])
    with pytest.raises(TypeError, match="floating-point gradients.*int32"):
        variables.checked_gradients([tf.constant([1, 2])], [v])
    with pytest.raises(TypeError, match="gradients\\[0\\] of type object"):
        variables.checked_gradients([object()], [v])
