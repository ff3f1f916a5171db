"""A window's step between writes: what the traced graph runs, counted, and what it records over long windows."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tb_gradcheck import GradientWriter
from tb_gradcheck.core import metadata
from tb_gradcheck.tensorflow import window
from tests.tensorflow.test_writer import COL
from tests.tensorflow.test_writer import rows
from tests.tensorflow.test_writer import stats_events

# Issue 46: between writes a traced step adds at most this many ops beyond
# one per variable and its conds, whatever the number of variables (the
# scatter of the held sums, the conds' predicate, the state the cond captures).
OTHER_OPS_BETWEEN_WRITES = 48
CONDS = ("If", "StatelessIf")


def _step_graph(n_layers, writer, bracketed=False):
    """The top-level graph of a traced training step of an MLP, with ``writer.write`` or without a writer.

    ``bracketed``: the update in ``writer.applying`` and its bracket given to ``write`` after it.
    """
    keras = tf.keras
    model = keras.Sequential([keras.Input((8,))] + [keras.layers.Dense(8, activation="relu") for _ in range(n_layers)])
    variables = model.trainable_variables
    optimizer = keras.optimizers.SGD(1e-3)
    optimizer.build(variables)
    x = tf.ones([4, 8])
    step = tf.Variable(1, dtype=tf.int64)

    @tf.function
    def train():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model(x, training=True) ** 2)
        grads = tape.gradient(loss, variables)
        if bracketed:
            with writer.applying(variables, step) as update:
                optimizer.apply_gradients(zip(grads, variables))
            writer.write(grads, variables, step, update=update)
        else:
            if writer is not None:
                writer.write(grads, variables, step)
            optimizer.apply_gradients(zip(grads, variables))
        step.assign_add(1)

    return len(variables), train.get_concrete_function().graph


@pytest.mark.parametrize("n_layers", [6, 21])
def test_a_window_step_between_writes_adds_one_cond_and_a_fixed_number_of_ops(tmp_path, n_layers):
    n_variables, bare = _step_graph(n_layers, None)
    with GradientWriter(tmp_path, every_n_steps=10) as writer:
        _, graph = _step_graph(n_layers, writer)
    assert n_variables in (12, 42)
    added = collections.Counter(op.type for op in graph.get_operations())
    added.subtract(op.type for op in bare.get_operations())
    conds = [op for op in graph.get_operations() if op.type in CONDS]
    assert added["L2Loss"] == n_variables  # the one op per variable: the norm's fused pass
    other = sum(added.values()) - n_variables - len(conds)
    assert other <= OTHER_OPS_BETWEEN_WRITES, dict(added)
    # Two conds: one on the held sums, which waits for every gradient, and the
    # weights' one, which reads only the step and the weights, so that no
    # update waits for the backward pass (recording._record_window).
    on_gradients = [op for op in conds if "L2Loss" in _ancestor_types(op)]
    assert len(conds) == 2 and len(on_gradients) == 1, [op.name for op in conds]
    (weights,) = set(conds) - set(on_gradients)
    assert not {"L2Loss", "Pack", "ResourceScatterUpdate"} & _ancestor_types(weights)
    # Between writes the cond on the gradients takes its other branch, which
    # does nothing (a constant and its output).
    library = {f.signature.name: f for f in graph.as_graph_def().library.function}
    assert len(library[on_gradients[0].get_attr("else_branch").name].node_def) <= 2


def test_a_window_write_step_does_not_take_the_gradients_norms_again(tmp_path):
    """The write branch reuses the ``l2_loss`` each gradient had at the top level (``statistics.half_sums``).

    Its only ``L2Loss`` ops are the zero counts' (of a ``Sign``); a second
    norm per gradient there was a pass over every gradient at each write.
    """
    with GradientWriter(tmp_path, every_n_steps=10) as writer:
        n_variables, graph = _step_graph(6, writer)
    library = graph.as_graph_def().library.function
    (write,) = [f for f in library if any(n.op == "WriteSummary" for n in f.node_def)]
    producers = {n.name: n.op for n in write.node_def}
    norms = [n for n in write.node_def if n.op == "L2Loss"]
    assert len(norms) == n_variables  # the zero counts, one per gradient
    assert all(producers.get(n.input[0].split(":")[0]) == "Sign" for n in norms), [n.input[0] for n in norms]


def test_an_update_bracket_adds_no_cond_between_the_update_and_the_writers(tmp_path):
    """With ``applying``, a step between writes runs the snapshot's cond, at its start, and the writer's.

    The update is measured inside the writer's write branch: a cond of the
    bracket's own after the update would sit between the last update and
    the writer's cond at every step (optimizer.py, "Cost").
    """
    with GradientWriter(tmp_path, every_n_steps=10) as writer:
        n_variables, graph = _step_graph(6, writer, bracketed=True)
    conds = [op for op in graph.get_operations() if op.type in CONDS]
    on_gradients = [op for op in conds if "L2Loss" in _ancestor_types(op)]
    assert len(conds) == 2 and len(on_gradients) == 1, [op.name for op in conds]
    (snapshot,) = set(conds) - set(on_gradients)
    assert not {"L2Loss", "AssignSubVariableOp", "ResourceApplyGradientDescent"} & _ancestor_types(snapshot)
    assert sum(op.type == "L2Loss" for op in graph.get_operations()) == n_variables


def _ancestor_types(op):
    """The types of the ops ``op`` depends on, through data and control inputs."""
    seen, stack = set(), list(op.inputs) + list(op.control_inputs)
    while stack:
        node = stack.pop()
        node = node.op if isinstance(node, tf.Tensor) else node
        if node.name not in seen:
            seen.add(node.name)
            stack.extend(list(node.inputs) + list(node.control_inputs))
    return {op.graph.get_operation_by_name(name).type for name in seen}


def test_a_window_longer_than_the_held_steps_records_every_step_and_the_rare_ones_in_order(tmp_path):
    # 150 steps between writes fill the held steps twice (window.DEPTH = 64);
    # among them, steps whose sums of squares leave the quick band (tiny,
    # huge) or are not finite, which are added on their own between folds.
    assert 150 > 2 * window.DEPTH
    layer = tf.keras.layers.Dense(3, name="d")
    layer.build((None, 2))
    kernel, bias = layer.kernel, layer.bias
    rng = np.random.default_rng(0)
    scales = rng.uniform(0.5, 4.0, size=151)
    scales[[70, 71]] = [1e-18, 1e25]  # squares below and above float32's band: the norm is taken again
    scales[100] = np.nan
    with GradientWriter(tmp_path, every_n_steps=150) as writer:

        @tf.function
        def step_fn(scale, step):
            writer.write([tf.fill([2, 3], scale), tf.fill([3], scale * 2.0)], [kernel, bias], step)

        for step, scale in enumerate(scales):
            step_fn(tf.constant(scale, tf.float32), tf.constant(step, tf.int64))
    written = stats_events(tmp_path)
    assert [e[0] for e in written] == [0, 150]
    _, content, arr = written[1]
    window_scales = scales[1:].astype(np.float32).astype(np.float64)
    kernel_norm = np.sqrt(6.0) * window_scales
    layer_norm = np.sqrt(6.0 * window_scales**2 + 3.0 * (2.0 * window_scales) ** 2)
    finite = np.isfinite(window_scales)
    for granularity, norms in (("variable", kernel_norm), ("layer", layer_norm)):
        block = rows(content, arr, granularity)[:, 0]
        agg = {a: block[i] for i, a in enumerate(metadata.AGGREGATES)}
        assert agg["last"][COL["grad_norm"]] == pytest.approx(norms[-1], rel=1e-6)
        for a in ("mean", "max", "min", "sum"):  # the NaN step shows in every reduced aggregate
            assert np.isnan(agg[a][COL["grad_norm"]]), (granularity, a)
        ok = norms[finite]
        # float32 sums of 150 terms in another order than one by one: a few ulps.
        assert agg["max"][COL["grad_norm_finite"]] == pytest.approx(ok.max(), rel=1e-6)
        assert agg["min"][COL["grad_norm_finite"]] == pytest.approx(ok.min(), rel=1e-6)
        assert agg["sum"][COL["grad_norm_finite"]] == pytest.approx(ok.sum(), rel=1e-5)
        assert agg["mean"][COL["grad_norm_finite"]] == pytest.approx(ok.mean(), rel=1e-5)
        assert agg["sum"][COL["grad_nonfinite"]] == 1 and agg["max"][COL["grad_nonfinite"]] == 1
        assert agg["min"][COL["grad_nonfinite"]] == 0
        assert (block[:, COL["first_nonfinite_offset"]] == 50).all()  # step 100, written at 150
