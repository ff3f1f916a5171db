"""GradientCallback on Keras 3's JAX backend: real model.fit, against a float64 twin and the TensorFlow backend's callback.

The JAX fits run in their own process (``keras_jax_job.py``): Keras picks its
backend once, at import, and this process runs Keras on TensorFlow. The
same weights, data and fit configurations are trained here with the
TensorFlow callback, and the two runs' rows are read back with TensorBoard's
own loader (``conftest.read_events``) and held to each other.
"""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from keras_jax_job import build
from keras_jax_job import fit
from test_jax_writer import layer_groups
from test_jax_writer import reference

from conftest import read_events
from conftest import stats_content
from tb_gradcheck.core import metadata

HERE = pathlib.Path(__file__).resolve().parents[1]  # tests/, where the job scripts are
WIDTHS = (6, 12, 8, 1)
# Two backends' float32 forward and backward passes (oneDNN and XLA's CPU
# kernels), and a few optimizer steps on each's own weights: float32
# rounding in another order, compounded over a few layers and steps.
RTOL = 2e-5
ATOL = 1e-7
FITS = {
    # Every step written; SGD, so the float64 twin can follow the weights.
    "every": {"optimizer": "SGD", "optimizer_args": {"learning_rate": 0.05}, "callback": {}},
    # A window of 5 over 12 steps (writes at 5 and 10, the partial window at
    # the end), Adam with clipping, two steps per call on the JAX side.
    "window": {
        "optimizer": "Adam",
        "optimizer_args": {"learning_rate": 0.01, "clipnorm": 0.5},
        "callback": {"every_n_steps": 5},
        "epochs": 2,
        "steps_per_execution": 2,
    },
    # Two micro-batches per update: one record per update, of their mean.
    "accumulate": {
        "optimizer": "SGD",
        "optimizer_args": {"learning_rate": 0.05, "momentum": 0.9, "gradient_accumulation_steps": 2},
        "callback": {},
    },
    # A static loss scale, recorded unscaled; the JAX side's step not jitted.
    "scaled": {
        "optimizer": "SGD",
        "optimizer_args": {"learning_rate": 0.05, "loss_scale_factor": 128.0},
        "callback": {"every_n_steps": 2},
        "run_eagerly": True,
    },
}
for _config in FITS.values():
    _config.update(widths=list(WIDTHS), batch_size=8, epochs=_config.get("epochs", 1))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both backends' runs of every fit: ``(root, start)``, the JAX runs in ``root/<fit>``, TensorFlow's in ``root/tf_<fit>``."""
    import keras

    root = tmp_path_factory.mktemp("keras_jax")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, WIDTHS[0])).astype(np.float32)
    y = (x[:, :1] * 2.0 + rng.normal(size=(48, 1)) * 0.1).astype(np.float32)
    start = {f"w{i}": w for i, w in enumerate(build(keras, WIDTHS).get_weights())} | {"x": x, "y": y}
    np.savez(root / "start.npz", **start)
    (root / "fits.json").write_text(json.dumps(FITS))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, str(HERE / "keras_jax_job.py"), str(root)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-4000:]

    for name, config in FITS.items():
        fit(keras, start, config, root / f"tf_{name}", execution=False)
    return root, start


def test_jax_fit_takes_the_jax_callback_leaves_training_bit_identical_and_imports_no_tensorflow(runs):
    root, _ = runs
    result = json.loads((root / "result.json").read_text())
    assert result["backend"] == "jax"
    assert not result["tensorflow_imported"]
    for name in FITS:
        assert result[name]["callback"] == "tb_gradcheck.jax.keras.GradientCallback"
        # Weights and every optimizer variable (Adam's moments, the
        # accumulators) after the fit with the callback, against without.
        assert result[name]["bit_identical"], name
    assert result["check_arguments_refused"]  # the fit's gradient check runs on TensorFlow
    assert len(result["loss_scale_warning"]) == 1 and "LossScaleOptimizer" in result["loss_scale_warning"][0]
    assert not result["loss_scale_wrote"]


@pytest.mark.parametrize("name", sorted(FITS))
def test_jax_backend_rows_equal_the_tensorflow_backends(runs, name):
    root, _ = runs
    jax_run, tf_run = root / name / "train", root / f"tf_{name}" / "train"
    a, b = stats_content(jax_run), stats_content(tf_run)
    assert a["layer"]["rows"] == b["layer"]["rows"] == ["mlp/dense_0", "mlp/norm", "mlp/dense_1", "mlp/dense_2"]
    assert a["variable"]["rows"] == b["variable"]["rows"]
    assert a["window"] == b["window"]
    shared = [c for c in a["columns"] if c in b["columns"]]
    assert set(metadata.stored_columns(a["window"])) <= set(shared)
    # TensorFlow's callback measures no update under gradient accumulation; this one does.
    assert {"update_norm", "update_to_weight"} <= set(a["columns"])
    for granularity in ("layer", "variable"):
        mine, theirs = read_events(jax_run, granularity=granularity), read_events(tf_run, granularity=granularity)
        assert [s for s, _, _ in mine] == [s for s, _, _ in theirs]
        for (step, x, _), (_, y, _) in zip(mine, theirs):
            for column in shared:
                np.testing.assert_allclose(
                    x[..., a["columns"].index(column)],
                    y[..., b["columns"].index(column)],
                    rtol=RTOL,
                    atol=ATOL,
                    err_msg=f"{name} {granularity} step {step} {column}",
                )
    if name == "window":
        assert [s for s, _, _ in read_events(jax_run)] == [5, 10, 12]  # the partial window at the end
    if name == "accumulate":
        assert [s for s, _, _ in read_events(jax_run)] == [1, 2, 3]  # 6 micro-batches, 3 updates


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
