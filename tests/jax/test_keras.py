"""GradientCallback on Keras 3's JAX backend: real model.fit, against a float64 twin and the TensorFlow backend's callback.

The JAX fits run in their own process (``keras_job.py``, through
``keras_fits.runs``): Keras picks its backend once, at import, and this
process runs Keras on TensorFlow. The same weights, data and fit
configurations are trained here with the TensorFlow callback, and the two
runs' rows are read back with TensorBoard's own loader
(``conftest.read_events``) and held to each other.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import keras_fits
from conftest import read_events
from conftest import stats_content
from keras_fits import RTOL
from reference_stats import layer_groups
from reference_stats import reference
from tb_gradcheck.core import metadata
from tb_gradcheck.core import rowstats

FITS = keras_fits.fits(
    # Two steps per call on the JAX side (the loop over a call's steps is the callback's).
    window={"steps_per_execution": 2},
    # The JAX side's step not jitted.
    scaled={"run_eagerly": True},
    # Decoupled weight decay: Keras' JAX optimizer decays the weights before
    # the update step it hands the gradients to; the update and the weights
    # the gradient was taken at must still be the whole step's, as on TensorFlow.
    decay={
        "optimizer": "AdamW",
        "optimizer_args": {"learning_rate": 0.01, "weight_decay": 0.5},
        "callback": {},
        "epochs": 1,
    },
    # No gradient reaches dense_0 (behind a stop_gradient), in a window of
    # 4 over 6 steps: its rows are MISSING, as TensorFlow's (a None
    # gradient), not the zero gradient of a dead layer.
    stopped={
        "optimizer": "SGD",
        "optimizer_args": {"learning_rate": 0.05},
        "callback": {"every_n_steps": 4},
        "stop_gradient": True,
    },
    # The EMA overwrites the weights after the update step, every 3rd step: part of the step's change.
    ema={
        "optimizer": "SGD",
        "optimizer_args": {"learning_rate": 0.05, "use_ema": True, "ema_momentum": 0.5, "ema_overwrite_frequency": 3},
        "callback": {},
        "epochs": 1,
    },
)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The JAX runs of every fit in ``root/<fit>``, TensorFlow's in ``root/tf_<fit>``: ``(root, start)``."""
    return keras_fits.runs(tmp_path_factory, "jax", FITS, tensorflow_too=FITS)


def test_jax_fit_takes_the_jax_callback_leaves_training_bit_identical_and_imports_no_tensorflow(runs):
    root, _ = runs
    keras_fits.assert_the_fits_trained_as_without_the_callback(root, "jax", FITS)


@pytest.mark.parametrize("name", sorted(FITS))
def test_jax_backend_rows_equal_the_tensorflow_backends(runs, name):
    root, _ = runs
    keras_fits.assert_rows_equal_tensorflow(root, name)


def twin_gradients(weights, x, y):
    """float64 gradients of the model's mean squared error (JAX under x64), ``[kernel, bias, gamma, beta, ...]``."""

    def loss(w):
        h = jax.nn.relu(x @ w[0] + w[1])
        mean = h.mean(-1, keepdims=True)
        var = ((h - mean) ** 2).mean(-1, keepdims=True)
        h = (h - mean) / jnp.sqrt(var + 1e-3) * w[2] + w[3]  # LayerNormalization's epsilon
        h = jax.nn.relu(h @ w[4] + w[5])
        return jnp.mean((h @ w[6] + w[7] - y) ** 2)

    with jax.enable_x64(True):
        w = [jnp.asarray(v, jnp.float64) for v in weights]
        return [np.asarray(g) for g in jax.grad(loss)(w)]


def test_jax_backend_rows_equal_a_float64_twin_of_the_same_gradients(runs):
    root, start = runs
    run = root / "every" / "train"
    content = stats_content(run)
    names = content["variable"]["rows"]
    assert names[:4] == ["mlp/dense_0/kernel", "mlp/dense_0/bias", "mlp/norm/gamma", "mlp/norm/beta"]
    weights = [np.asarray(start[f"w{i}"], np.float64) for i in range(len(names))]
    x, y = (np.asarray(start[k], np.float64) for k in ("x", "y"))
    units = {n: w.shape[-1] for n, w in zip(names, weights)}
    layers, variables = read_events(run), read_events(run, granularity="variable")
    assert [s for s, _, _ in layers] == [1, 2, 3, 4, 5, 6]
    base = len(metadata.stored_columns(1))
    update_col = content["columns"].index("update_norm")
    for k, ((_, layer, _), (_, variable, _)) in enumerate(zip(layers, variables)):
        batch = slice(8 * k, 8 * (k + 1))
        g = dict(zip(names, twin_gradients(weights, x[batch], y[batch])))
        w = dict(zip(names, weights))
        np.testing.assert_allclose(layer[0, :, :base], reference(g, w, units, layer_groups(content)), rtol=RTOL)
        np.testing.assert_allclose(variable[0, :, :base], reference(g, w, units, [[n] for n in names]), rtol=RTOL)
        # SGD: the update is the learning rate times the gradient.
        np.testing.assert_allclose(variable[0, :, update_col], [0.05 * np.linalg.norm(g[n]) for n in names], rtol=RTOL)
        weights = [w[n] - 0.05 * g[n] for n in names]


def test_a_layer_no_gradient_reaches_is_missing_not_a_dead_layer(runs):
    # Keras' JAX trainer hands the optimizer zeros for dense_0 (jax.grad
    # has no None); its rows must say "no gradient", as TensorFlow's do,
    # not a layer whose every unit is dead.
    root, _ = runs
    run = root / "stopped" / "train"
    content = stats_content(run)
    dense = content["layer"]["rows"].index("mlp/dense_0")
    columns = [content["columns"].index(c) for c in ("grad_norm", "grad_zero_fraction", "dead_unit_fraction")]
    layers = read_events(run)
    assert [s for s, _, _ in layers] == [4, 6]  # a window of 4, then the partial one
    for _, layer, _ in layers:
        np.testing.assert_array_equal(layer[:, dense][:, columns], rowstats.MISSING)
        assert np.all(layer[:, dense + 1][:, columns[0]] > 0)  # the layers after it have their gradient
