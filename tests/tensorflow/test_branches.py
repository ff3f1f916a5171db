"""The writer's conds stay functional If ops (no Switch per captured tensor), and still pick the right branch."""

import numpy as np
import pytest
import tensorflow as tf

from tb_gradcheck import GradientWriter
from tb_gradcheck.tensorflow import branches

LOWER = "_lower_using_switch_merge"


def _ifs(graph):
    return [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]


def test_cond_is_kept_as_one_if_op_and_takes_the_right_branch():
    xs = [tf.constant(np.full(3, i, np.float32)) for i in range(5)]

    @tf.function
    def f(flag):
        # Both branches capture every tensor: lowered, that is a Switch each.
        return branches.cond(flag, lambda: tf.add_n(xs), lambda: tf.add_n(xs) * -1.0)

    graph = f.get_concrete_function(tf.TensorSpec([], tf.bool)).graph
    (op,) = _ifs(graph)
    assert op.get_attr(LOWER) is False
    assert f(tf.constant(True)).numpy().tolist() == [10.0] * 3
    assert f(tf.constant(False)).numpy().tolist() == [-10.0] * 3


def test_static_predicates_pick_in_python_and_xla_compiles_the_rest():
    assert branches.cond(True, lambda: 1, lambda: 2) == 1
    assert branches.cond(tf.constant(False), lambda: 1, lambda: 2) == 2

    @tf.function(jit_compile=True)
    def g(x):
        return branches.cond(x > 0, lambda: x * 2.0, lambda: x - 1.0)

    assert g(tf.constant(3.0)).numpy() == 6.0 and g(tf.constant(-3.0)).numpy() == -4.0


@pytest.mark.parametrize("every", [1, 10])
def test_no_cond_of_a_traced_writer_step_is_lowered(tmp_path, every):
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(3), tf.keras.layers.Dense(2)])
    variables = model.trainable_variables
    x = tf.ones([2, 4])
    writer = GradientWriter(tmp_path, every_n_steps=every)
    step = tf.Variable(10, dtype=tf.int64)

    @tf.function
    def train_step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        grads = tape.gradient(loss, variables)
        with writer.applying(variables, step) as update:
            pass
        writer.write(grads, variables, step, update=update)

    graph = train_step.get_concrete_function().graph
    found = _ifs(graph)
    assert found, "the writer's step has conds (the rare recount, the write step, the open check)"
    assert all(op.get_attr(LOWER) is False for op in found), [op.name for op in found]
    train_step()
    writer.close()
