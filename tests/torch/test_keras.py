"""GradientCallback on Keras 3's PyTorch backend: real model.fit, against a float64 twin and the TensorFlow backend's callback.

The torch fits run in their own process (``keras_job.py``, through
``keras_fits.runs``): Keras picks its backend once, at import, and this
process runs Keras on TensorFlow. The same weights, data and fit
configurations are trained here with the TensorFlow callback, and the two
runs' rows are read back with TensorBoard's own loader
(``conftest.read_events``) and held to each other.
"""

import numpy as np
import pytest
import torch

import keras_fits
from conftest import read_events
from conftest import stats_content
from keras_fits import RTOL
from reference_stats import reference
from tb_gradcheck.core import metadata

FITS = keras_fits.fits(
    # Weight decay (in update_norm, as TensorFlow's bracket around apply
    # measures it) and a global clip norm that binds (grad_norm_before_clip).
    decay={
        "optimizer": "AdamW",
        "optimizer_args": {"learning_rate": 0.01, "weight_decay": 0.1, "global_clipnorm": 0.3},
        "callback": {},
    },
    # A LossScaleOptimizer, NaN targets in the first and fourth batches: those
    # steps refused (the scale halved), the scale doubled after every 2
    # finite steps. A refused step has a step and a record of its own (its
    # unscaled gradient, no update); the loss scale and refused-step columns.
    loss_scaled={
        "optimizer": "SGD",
        "optimizer_args": {"learning_rate": 0.05},
        "loss_scale": {"initial_scale": 2.0**15, "dynamic_growth_steps": 2},
        "callback": {},
        "poison": [3, 27],
    },
    # A NaN target in the last batch: the loss NaN, and through it the
    # gradients of every unit that sample reaches (its ReLU masks, taken on
    # finite weights, are the same on both backends; a later step's NaN
    # weights would not be: each backend's ReLU treats NaN its own way).
    poisoned={
        "optimizer": "SGD",
        "optimizer_args": {"learning_rate": 0.05},
        "callback": {"every_n_steps": 4},
        "poison": [41],
    },
)
# Held to the float64 twin only: Keras' ReLU gradient on TensorFlow
# (``features > 0`` times the gradient) turns a masked unit's NaN into NaN,
# torch's (a select) into 0, so the backends' NaN counts differ.
TWIN_ONLY = {"poisoned"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The torch runs of every fit in ``root/<fit>``, TensorFlow's in ``root/tf_<fit>``: ``(root, start)``."""
    return keras_fits.runs(tmp_path_factory, "torch", FITS, tensorflow_too=set(FITS) - TWIN_ONLY)


def test_torch_fit_takes_the_torch_callback_leaves_training_bit_identical_and_imports_no_tensorflow(runs):
    root, _ = runs
    keras_fits.assert_the_fits_trained_as_without_the_callback(root, "torch", FITS)


def test_torch_fit_that_raises_leaves_the_model_as_found(runs):
    root, _ = runs
    result = keras_fits.result(root)
    step, callback = result["raise_step"], result["raise_callback"]
    # In the step: detached before the error goes on; what was recorded is written.
    assert step["hooked_after_raise"] == []
    assert [s for s, _, _ in read_events(root / "raise_step" / "train")] == [1, 2]
    # In another callback: still attached, until the next fit's first step
    # (without the callback) detaches it and runs Keras' own train function.
    assert callback["hooked_after_raise"] == sorted(["apply", "_clip_gradients", "_backend_update_step"])
    for r in (step, callback):
        assert r["hooked_after_next_fit"] == []
        assert r["next_train_function"] == "one_step_on_data"
        # That fit, and the one that raised, trained as without the callback.
        assert r["bit_identical"]


def test_torch_fit_with_jit_compile_runs_eagerly_and_puts_it_back(runs):
    root, _ = runs
    jit = keras_fits.result(root)["jit"]
    assert len(jit["warnings"]) == 1 and "jit_compile" in jit["warnings"][0]
    assert jit["jit_compile_after"] and jit["same_as_eager"]
    assert [s for s, _, _ in read_events(root / "jit" / "train")] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("name", sorted(set(FITS) - TWIN_ONLY))
def test_torch_backend_rows_equal_the_tensorflow_backends(runs, name):
    root, _ = runs
    content, shared = keras_fits.assert_rows_equal_tensorflow(root, name)
    torch_run = root / name / "train"
    if name in ("window", "decay"):
        assert "grad_norm_before_clip" in shared
    if name == "loss_scaled":  # the premise: steps refused, and each its own step
        events = read_events(torch_run)
        refused = sum(x[0, 0, content["columns"].index("refused_steps")] for _, x, _ in events)
        assert {"loss_scale", "refused_steps"} <= set(shared) and refused == 2
        # Each training step its column: iterations plus the steps refused.
        assert [s for s, _, _ in events] == [1, 2, 3, 4, 5, 6]
    if name == "decay":  # the clip bound: the norm before it is above the applied one
        (_, x, _) = read_events(torch_run)[0]
        before, after = (x[0, :, content["columns"].index(c)] for c in ("grad_norm_before_clip", "grad_norm"))
        assert np.all(before > after)


def twin_gradients(weights, x, y):
    """float64 gradients of the model's mean squared error (torch autograd), ``[kernel, bias, gamma, beta, ...]``."""
    w = [torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in weights]
    x, y = torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)
    h = torch.relu(x @ w[0] + w[1])
    mean = h.mean(-1, keepdim=True)
    var = ((h - mean) ** 2).mean(-1, keepdim=True)
    h = (h - mean) / torch.sqrt(var + 1e-3) * w[2] + w[3]  # LayerNormalization's epsilon
    h = torch.relu(h @ w[4] + w[5])
    torch.mean((h @ w[6] + w[7] - y) ** 2).backward()
    return [v.grad.numpy() for v in w]


def twin_run(start, poison=None):
    """The "every" fit (SGD 0.05, batches of 8) in float64: per step, ``{name: gradient}`` and ``{name: weight}`` before it."""
    names = [f"w{i}" for i in range(8)]
    weights = [np.asarray(start[n], np.float64) for n in names]
    x, y = (np.array(start[k], np.float64) for k in ("x", "y"))
    if poison is not None:
        y[poison] = np.nan
    out = []
    for k in range(6):
        batch = slice(8 * k, 8 * (k + 1))
        g = twin_gradients(weights, x[batch], y[batch])
        out.append((g, weights))
        weights = [w - 0.05 * d for w, d in zip(weights, g)]
    return out


def test_torch_backend_rows_equal_a_float64_twin_of_the_same_gradients(runs):
    root, start = runs
    run = root / "every" / "train"
    content = stats_content(run)
    names = content["variable"]["rows"]
    assert names[:4] == ["mlp/dense_0/kernel", "mlp/dense_0/bias", "mlp/norm/gamma", "mlp/norm/beta"]
    groups = [[v for v in names if v.rsplit("/", 1)[0] == layer] for layer in content["layer"]["rows"]]
    layers, variables = read_events(run), read_events(run, granularity="variable")
    assert [s for s, _, _ in layers] == [1, 2, 3, 4, 5, 6]
    base = len(metadata.stored_columns(1))
    update_col = content["columns"].index("update_norm")
    for (_, layer, _), (_, variable, _), (grads, weights) in zip(layers, variables, twin_run(start)):
        g, w = dict(zip(names, grads)), dict(zip(names, weights))
        units = {n: v.shape[-1] for n, v in w.items()}
        np.testing.assert_allclose(layer[0, :, :base], reference(g, w, units, groups), rtol=RTOL)
        np.testing.assert_allclose(variable[0, :, :base], reference(g, w, units, [[n] for n in names]), rtol=RTOL)
        # SGD: the update is the learning rate times the gradient.
        np.testing.assert_allclose(variable[0, :, update_col], [0.05 * np.linalg.norm(g[n]) for n in names], rtol=RTOL)


def test_torch_backend_counts_the_nan_gradients_of_a_float64_twin(runs):
    root, start = runs
    run = root / "poisoned" / "train"
    content = stats_content(run)
    names, column = content["variable"]["rows"], content["columns"].index
    groups = [[names.index(v) for v in names if v.rsplit("/", 1)[0] == layer] for layer in content["layer"]["rows"]]
    grads, _ = twin_run(start, poison=FITS["poisoned"]["poison"])[-1]
    counts = np.array([np.sum(np.isnan(g)) for g in grads])
    sizes = np.array([g.size for g in grads])
    assert np.all(counts > 0) and np.any(counts < sizes)  # the premise: some units out of the NaN's reach
    # Written at 4, then the partial window (steps 5 and 6) at 6, NaN at 6 only.
    layers, variables = read_events(run), read_events(run, granularity="variable")
    assert [s for s, _, _ in variables] == [4, 6]
    (_, layer, _), (_, variable, _) = layers[-1], variables[-1]
    last, max_slab = 0, content["aggregates"].index("max")
    np.testing.assert_array_equal(variable[last, :, column("grad_nonfinite")], counts)
    np.testing.assert_array_equal(layer[last, :, column("grad_nonfinite")], [counts[g].sum() for g in groups])
    np.testing.assert_array_equal(variable[last, :, column("first_nonfinite_offset")], 0)
    assert np.all(np.isnan(variable[max_slab, :, column("grad_norm")]))  # NaN propagates through the window's max
    # grad_norm_finite leaves the NaN step out: its window max is step 5's norm.
    step5 = twin_run(start)[4][0]
    np.testing.assert_allclose(
        variable[max_slab, :, column("grad_norm_finite")], [np.linalg.norm(g) for g in step5], rtol=RTOL
    )
