"""The full-size sums of an XLA-compiled step (of squares, counts), in the form that is cheap where it runs.

A plain sum over a whole tensor is the cheapest form almost everywhere: one
fused, vectorised kernel in TensorFlow's graph mode and in XLA on a GPU. XLA's
CPU backend is the exception: it emits a float sum as one serial loop (adding
in order, as it must without fast-math), which is latency-bound at about
1.4 ns an element, 3x its max and 4x TensorFlow's own sum. There the sum goes
through a matrix-vector product with a vector of ones, which XLA hands to
Eigen's vectorised GEMV: on the benchmark's 20-layer MLP, compiled, a sum of
squares per gradient cost 1.14x the bare step as a reduction and 1.07x as a
GEMV. The result is the same sum, in another float32 order.

``compiled`` is whether the step is XLA-compiled (``stash``,
``GradientCallback`` with ``jit_compile``); ``on_cpu`` decides the rest.
"""

import functools

import tensorflow as tf


@functools.cache
def on_cpu():
    """Whether a compiled step runs on the CPU: no GPU or TPU is visible (read once)."""
    return not any(tf.config.list_logical_devices(kind) for kind in ("GPU", "TPU"))


def total(values, compiled=False):
    """The sum of every element of ``values`` (``tf.reduce_sum``), in their dtype."""
    if compiled and on_cpu():
        return _gemv_sum(values)
    return tf.reduce_sum(values)


def sumsq64(values, compiled=False):
    """The sum of squares of ``values``, squared and summed in float64.

    A float32 (or narrower) square cannot under- or overflow in float64, so
    this needs no rare-case cond, which under XLA would take the tensor as
    an operand. Compiled, it costs no more than the float32 sum (a GEMV
    either way).
    """
    return total(tf.square(tf.cast(values, tf.float64)), compiled)


def count(mask, compiled=False):
    """The number of true elements of the bool tensor ``mask``, as an exact float64.

    Compiled on a CPU, the GEMV's row sums of zeros and ones are exact below
    2**24 and are added in float64; a wider last axis takes the integer count.
    """
    if compiled and on_cpu() and _width(mask) < 2**24:
        if mask.shape.num_elements() == 0:
            return tf.constant(0.0, tf.float64)
        return tf.reduce_sum(tf.cast(_row_sums(tf.cast(mask, tf.float32)), tf.float64))
    return tf.cast(tf.math.count_nonzero(mask, dtype=tf.int64), tf.float64)


def _gemv_sum(values):
    """The sum of every element of ``values``, as a GEMV over its last axis, then a sum of the short result."""
    if values.shape.num_elements() == 0:
        return tf.constant(0, values.dtype)
    return tf.reduce_sum(_row_sums(values))


def _width(values):
    return int(values.shape[-1]) if values.shape.rank else 1


def _row_sums(values):
    """The sums over the last axis of ``values`` (a scalar is one row of one), as a GEMV with a vector of ones."""
    width = _width(values)
    return tf.linalg.matvec(tf.reshape(values, [-1, width]), tf.ones([width], values.dtype))
