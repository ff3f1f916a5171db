"""The writing core (eventlog, structure, rowstats, running) against TensorFlow's writer: same bytes, same numbers.

TensorFlow's writer computes its statistics in the graph; the core computes
them on the host from per-parameter reductions, for the PyTorch and JAX
writers. These twins hold the two definitions to the same rows, and the two
event paths to the same ``Summary.Value`` bytes.
"""

import glob

import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_file_loader
from tensorboard.util import tensor_util

from tb_gradcheck import GradientWriter
from tb_gradcheck.core import eventlog
from tb_gradcheck.core import metadata
from tb_gradcheck.core import rowstats
from tb_gradcheck.core import running
from tb_gradcheck.tensorflow import statistics
from tb_gradcheck.tensorflow.variables import Rows


def _values(run_dir):
    """Every gradients summary value of a run, with its step, in file order."""
    out = []
    for path in sorted(glob.glob(str(run_dir / "events.out.tfevents.*"))):
        for event in event_file_loader.EventFileLoader(path).Load():
            out.extend((event.step, v) for v in event.summary.value if v.tag.startswith("gradients/"))
    return out


def _variables():
    """A Keras model's variables: two Dense layers, kernels then biases, grouped by layer."""
    model = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(4), tf.keras.layers.Dense(2)])
    return list(model.trainable_variables)


def _gradients(step):
    """A step's gradients with every case: a dead unit, exact zeros, a NaN at step 4, a missing gradient at step 2."""
    rng = np.random.default_rng(step)
    kernel = rng.normal(size=(3, 4)).astype(np.float32)
    kernel[:, 1] = 0.0  # unit 1 of dense is dead in the kernel ...
    bias = rng.normal(size=4).astype(np.float32)
    bias[1] = 0.0  # ... and in the bias
    head = (rng.normal(size=(4, 2)) * 10.0 ** (step - 3)).astype(np.float32)
    if step == 4:
        head[0, 0] = np.nan
    head_bias = np.zeros(2, np.float32)
    return [kernel, bias, None if step == 2 else head, head_bias]


def _reductions(gradients, rows):
    """The per-parameter reductions a framework adapter computes, here in float64 NumPy."""
    present = np.array([g is not None for g in gradients])
    grads = [np.asarray(g, np.float64) for g in gradients if g is not None]
    units = [u for u, p in zip(rows.variable_units, present) if p]
    return rowstats.Reductions(
        present=present,
        norm=np.array([np.sqrt(np.sum(g * g)) for g in grads]),
        nonfinite=np.array([np.sum(~np.isfinite(g)) for g in grads], np.float64),
        max_abs=np.array([np.max(np.abs(g)) for g in grads]),
        nonzero=np.array([np.count_nonzero(g) for g in grads], np.float64),
        dead=np.concatenate([(g.reshape(-1, u) == 0).all(axis=0) for g, u in zip(grads, units)]),
    )


def test_eventlog_writes_the_same_summary_values_as_the_tensorflow_writer(tmp_path):
    variables = _variables()
    with GradientWriter(tmp_path / "tf") as writer:
        for step in range(3):
            writer.write([tf.constant(g) for g in _gradients(step)[:2]], variables[:2], step)
    tf_values = _values(tmp_path / "tf")
    content = metadata.parse(tf_values[0][1].metadata.plugin_data.content)
    n_layers = len(content["layer"]["rows"])
    log = eventlog.EventLog(tmp_path / "core")
    for step, value in tf_values:
        array = tensor_util.make_ndarray(value.tensor)
        log.stats(content, array[:, :n_layers], array[:, n_layers:-1], step)
    log.close()
    core_values = _values(tmp_path / "core")
    assert [s for s, _ in core_values] == [0, 1, 2]
    # Tag, metadata (full on the first event, slim after) and tensor bytes, header row included.
    assert [v.SerializeToString() for _, v in core_values] == [v.SerializeToString() for _, v in tf_values]


def test_rowstats_rows_match_tensorflow_stats_compute():
    variables = _variables()
    rows = Rows(variables)
    for step in range(6):
        gradients = _gradients(step)
        tf_layer, tf_variable = statistics.compute([None if g is None else tf.constant(g) for g in gradients], rows)
        weights = np.array([np.linalg.norm(v.numpy().astype(np.float64)) for v in variables])
        layer, variable = rowstats.rows(_reductions(gradients, rows), rows, weight_norms=weights, onset=True)
        # float32 storage on both sides; the sums run in another order (relative 1e-6 covers it).
        np.testing.assert_allclose(layer, tf_layer.numpy(), rtol=1e-6, err_msg=f"step {step}")
        np.testing.assert_allclose(variable, tf_variable.numpy(), rtol=1e-6, err_msg=f"step {step}")


@pytest.mark.parametrize("scale", [1e-30, 1e25])
def test_rowstats_norms_neither_under_nor_overflow(scale):
    variables = _variables()
    rows = Rows(variables)
    gradients = [np.full(v.shape, scale, np.float32) for v in variables]
    layer, _ = rowstats.rows(_reductions(gradients, rows), rows)
    expected = scale * np.sqrt([16.0, 10.0])  # 12 + 4 elements, then 8 + 2
    np.testing.assert_allclose(layer[:, 0], expected, rtol=1e-6)


def test_running_window_matches_the_tensorflow_window(tmp_path):
    variables = _variables()
    rows = Rows(variables)
    n = 3
    with GradientWriter(tmp_path, every_n_steps=n) as writer:
        for step in range(1, 7):
            writer.write([None if g is None else tf.constant(g) for g in _gradients(step)], variables, step)
    tf_points = {step: tensor_util.make_ndarray(v.tensor) for step, v in _values(tmp_path)}
    assert sorted(tf_points) == [3, 6]

    weights = np.array([np.linalg.norm(v.numpy().astype(np.float64)) for v in variables])
    weight_rows = np.concatenate([rowstats.combine_norms(weights, rows), weights])
    present_l = rows.layer_matrix().any(axis=1)
    state, steps = running.init(np.full, len(rows.layer_names) + len(rows.variable_names)), []
    for step in range(1, 7):
        gradients = _gradients(step)
        r = _reductions(gradients, rows)
        norm_v, nonfinite_v = np.zeros(len(variables)), np.zeros(len(variables))
        norm_v[r.present], nonfinite_v[r.present] = r.norm, r.nonfinite
        layer_present = np.bincount(rows.layer_of, r.present, len(rows.layer_names)) > 0
        x = running.step_columns(np, norm_v, nonfinite_v, r.present, rows.layer_matrix(), layer_present & present_l)
        state, steps = running.add(np, state, x), steps + [step]
        if step % n:
            continue
        last = np.concatenate(rowstats.rows(r, rows, onset=True))
        slabs = rowstats.window_slabs(running.to_numpy(state, np.asarray, steps), step, weight_rows, last)
        expected = tf_points[step][:, :-1]  # without the header row
        np.testing.assert_allclose(slabs, expected, rtol=1e-6, err_msg=f"window ending at step {step}")
        state, steps = running.init(np.full, len(weight_rows)), []
