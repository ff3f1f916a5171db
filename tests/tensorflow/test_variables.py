"""tensorflow/variables.py: the checks of the variables, gradients and step a TensorFlow writer is given."""

import numpy as np
import pytest
import tensorflow as tf

from tb_gradcheck.core import validate
from tb_gradcheck.tensorflow import variables


def test_a_tensor_is_not_taken_for_a_list():
    with pytest.raises(TypeError, match="`gradients` to be a list. Received"):
        validate.non_empty_list(tf.ones(2), "gradients")


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
