"""The compiled-step sums give the plain sums, compiled with XLA on this CPU, for every shape the writer meets."""

import numpy as np
import pytest
import tensorflow as tf

from tb_gradcheck.tensorflow import full_sums

SHAPES = [(), (0,), (3, 0), (7,), (5, 1), (1, 9), (4, 6), (3, 3, 2, 8)]


def test_this_machine_takes_the_gemv_form():
    # CI and these machines have no accelerator: the compiled form is the GEMV one.
    assert full_sums.on_cpu()


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_compiled_sums_equal_the_plain_ones(shape, dtype):
    values = np.random.default_rng(0).normal(size=shape).astype(dtype)
    counts = (values > 0).astype(dtype)

    @tf.function(jit_compile=True)
    def compiled(v, c):
        return (
            full_sums.total(tf.square(v), compiled=True),
            full_sums.total(c, compiled=True),
            full_sums.count(v > 0, compiled=True),
        )

    sumsq, total, count = compiled(tf.constant(values), tf.constant(counts))
    assert sumsq.dtype == total.dtype == tf.as_dtype(dtype) and count.dtype == tf.float64
    np.testing.assert_allclose(sumsq.numpy(), np.sum(values.astype(np.float64) ** 2), rtol=1e-6)
    assert total.numpy() == count.numpy() == counts.sum()  # a count of ones is exact in either order
    assert full_sums.count(tf.constant(values > 0)).numpy() == counts.sum()


def test_non_finite_values_stay_non_finite():
    @tf.function(jit_compile=True)
    def sumsq(v):
        return full_sums.total(tf.square(v), compiled=True)

    assert np.isinf(sumsq(tf.constant([[1.0, np.inf], [2.0, 3.0]], tf.float32)).numpy())
    assert np.isnan(sumsq(tf.constant([[1.0, np.nan], [-np.inf, 3.0]], tf.float32)).numpy())


@pytest.mark.parametrize("compiled", [False, True], ids=["graph", "xla"])
def test_float64_sum_of_squares_keeps_float32_extremes(compiled):
    values = tf.constant([[3e-30, 4e-30], [3e30, 4e30]], tf.float32)  # squares under- and overflow in float32
    fn = tf.function(lambda v: [full_sums.sumsq64(v[i], compiled) for i in range(2)], jit_compile=compiled)
    small, large = fn(values)
    assert small.dtype == tf.float64
    assert small.numpy() == pytest.approx(25e-60, rel=1e-6) and large.numpy() == pytest.approx(25e60, rel=1e-6)
