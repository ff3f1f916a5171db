"""The writer's full-size sums (of squares, of nonzeros), in the form that is cheap where the step runs.

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


def half_sumsq(values, compiled=False):
    """Half the sum of squares of ``values`` (``tf.nn.l2_loss``), in their dtype."""
    if compiled and on_cpu():
        return 0.5 * _gemv_sum(tf.square(values))
    return tf.nn.l2_loss(values)


def total(values, compiled=False):
    """The sum of every element of ``values`` (``tf.reduce_sum``), in their dtype."""
    if compiled and on_cpu():
        return _gemv_sum(values)
    return tf.reduce_sum(values)


def _gemv_sum(values):
    """The sum of every element of ``values``, as a GEMV over its last axis, then a sum of the short result."""
    if values.shape.num_elements() == 0:
        return tf.constant(0, values.dtype)
    width = int(values.shape[-1]) if values.shape.rank else 1
    rows = tf.reshape(values, [-1, width])
    return tf.reduce_sum(tf.linalg.matvec(rows, tf.ones([width], values.dtype)))
