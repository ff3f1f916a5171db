"""GradientCallback on Keras 3's PyTorch backend: real model.fit, against a float64 twin and the TensorFlow backend's callback.

The torch fits run in their own process (``keras_torch_job.py``): Keras picks
its backend once, at import, and this process runs Keras on TensorFlow. The
same weights, data and fit configurations are trained here with the
TensorFlow callback, and the two runs' rows are read back with TensorBoard's
own loader (``conftest.read_events``) and held to each other.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from keras_jax_job import build
from keras_torch_job import job_fit

from conftest import read_events
from conftest import stats_content
from tb_gradcheck.core import metadata

HERE = pathlib.Path(__file__).resolve().parents[1]  # tests/, where the job scripts are
WIDTHS = (6, 12, 8, 1)
# Two backends' float32 forward and backward passes, and a few optimizer
# steps on each's own weights: float32 rounding in another order,
# compounded over a few layers and steps.
RTOL = 2e-5
ATOL = 1e-7
FITS = {
    # Every step written; SGD, so the float64 twin can follow the weights.
    "every": {"optimizer": "SGD", "optimizer_args": {"learning_rate": 0.05}, "callback": {}},
    # A window of 5 over 12 steps (writes at 5 and 10, the partial window at the end), Adam with clipping.
    "window": {
        "optimizer": "Adam",
        "optimizer_args": {"learning_rate": 0.01, "clipnorm": 0.5},
        "callback": {"every_n_steps": 5},
        "epochs": 2,
    },
    # Two micro-batches per update: one record per update, of their mean.
    "accumulate": {
        "optimizer": "SGD",
        "optimizer_args": {"learning_rate": 0.05, "momentum": 0.9, "gradient_accumulation_steps": 2},
        "callback": {},
    },
    # A static loss scale, recorded unscaled.
    "scaled": {
        "optimizer": "SGD",
        "optimizer_args": {"learning_rate": 0.05, "loss_scale_factor": 128.0},
        "callback": {"every_n_steps": 2},
    },
    # Weight decay (in update_norm, as TensorFlow's bracket around apply
    # measures it) and a global clip norm that binds (grad_norm_before_clip).
    "decay": {
        "optimizer": "AdamW",
        "optimizer_args": {"learning_rate": 0.01, "weight_decay": 0.1, "global_clipnorm": 0.3},
        "callback": {},
    },
    # A LossScaleOptimizer, NaN targets in the first and fourth batches: those
    # steps refused (the scale halved), the scale doubled after every 2
    # finite steps. A refused step has a step and a record of its own (its
    # unscaled gradient, no update); the loss scale and refused-step columns.
    "loss_scaled": {
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
    "poisoned": {
        "optimizer": "SGD",
        "optimizer_args": {"learning_rate": 0.05},
        "callback": {"every_n_steps": 4},
        "poison": [41],
    },
}
# Held to the float64 twin only: Keras' ReLU gradient on TensorFlow
# (``features > 0`` times the gradient) turns a masked unit's NaN into NaN,
# torch's (a select) into 0, so the backends' NaN counts differ.
TWIN_ONLY = {"poisoned"}
for _config in FITS.values():
    _config.update(widths=list(WIDTHS), batch_size=8, epochs=_config.get("epochs", 1))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both backends' runs of every fit: ``(root, start)``, the torch runs in ``root/<fit>``, TensorFlow's in ``root/tf_<fit>``."""
    import keras

    root = tmp_path_factory.mktemp("keras_torch")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, WIDTHS[0])).astype(np.float32)
    y = (x[:, :1] * 2.0 + rng.normal(size=(48, 1)) * 0.1).astype(np.float32)
    start = {f"w{i}": w for i, w in enumerate(build(keras, WIDTHS).get_weights())} | {"x": x, "y": y}
    np.savez(root / "start.npz", **start)
    (root / "fits.json").write_text(json.dumps(FITS))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    env.pop("KERAS_BACKEND", None)
    done = subprocess.run(
        [sys.executable, str(HERE / "keras_torch_job.py"), str(root)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-4000:]

    for name, config in FITS.items():
        if name in TWIN_ONLY:
            continue
        job_fit(keras, start, config, root / f"tf_{name}")
    return root, start


def test_torch_fit_takes_the_torch_callback_leaves_training_bit_identical_and_imports_no_tensorflow(runs):
    root, _ = runs
    result = json.loads((root / "result.json").read_text())
    assert result["backend"] == "torch"
    assert not result["tensorflow_imported"]
    for name in FITS:
        assert result[name]["callback"] == "tb_gradcheck.torch.keras.GradientCallback"
        # Weights and every optimizer variable (Adam's moments, the
        # accumulators) after the fit with the callback, against without.
        assert result[name]["bit_identical"], name
        assert result[name]["warnings"] == [], name
        assert result[name]["hooked"] == [], name  # the optimizer left as found
    assert result["check_arguments_refused"]  # the fit's gradient check runs on TensorFlow
    assert len(result["loss_scale_warning"]) == 1 and "LossScaleOptimizer" in result["loss_scale_warning"][0]
    assert not result["loss_scale_wrote"]


def test_torch_fit_again_goes_on_from_the_steps_of_the_first(runs):
    root, _ = runs
    assert [s for s, _, _ in read_events(root / "again" / "train")] == list(range(1, 13))


def test_torch_fit_that_raises_leaves_the_model_as_found(runs):
    root, _ = runs
    result = json.loads((root / "result.json").read_text())
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
    jit = json.loads((root / "result.json").read_text())["jit"]
    assert len(jit["warnings"]) == 1 and "jit_compile" in jit["warnings"][0]
    assert jit["jit_compile_after"] and jit["same_as_eager"]
    assert [s for s, _, _ in read_events(root / "jit" / "train")] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize("name", sorted(set(FITS) - TWIN_ONLY))
def test_torch_backend_rows_equal_the_tensorflow_backends(runs, name):
    root, _ = runs
    torch_run, tf_run = root / name / "train", root / f"tf_{name}" / "train"
    a, b = stats_content(torch_run), stats_content(tf_run)
    assert a["layer"]["rows"] == b["layer"]["rows"] == ["mlp/dense_0", "mlp/norm", "mlp/dense_1", "mlp/dense_2"]
    assert a["variable"]["rows"] == b["variable"]["rows"]
    assert a["window"] == b["window"]
    shared = [c for c in a["columns"] if c in b["columns"]]
    assert set(metadata.stored_columns(a["window"])) <= set(shared)
    # TensorFlow's callback measures no update under gradient accumulation; this one does.
    assert {"update_norm", "update_to_weight"} <= set(a["columns"])
    if name in ("window", "decay"):
        assert "grad_norm_before_clip" in shared
    for granularity in ("layer", "variable"):
        mine, theirs = read_events(torch_run, granularity=granularity), read_events(tf_run, granularity=granularity)
        assert [s for s, _, _ in mine] == [s for s, _, _ in theirs]
        for (step, x, _), (_, y, _) in zip(mine, theirs):
            columns = shared
            if name == "loss_scaled" and y[0, 0, b["columns"].index("refused_steps")] > 0:
                # A refused step's NaN reached other elements on each backend
                # (``TWIN_ONLY``): what the refusal did must agree.
                assert x[0, 0, a["columns"].index("refused_steps")] == 1
                for z, c in ((x, a), (y, b)):
                    assert np.any(z[0, :, c["columns"].index("grad_nonfinite")] > 0)
                    np.testing.assert_array_equal(z[0, :, c["columns"].index("update_norm")], 0)
                columns = ("weight_norm", "update_norm", "update_to_weight", "loss_scale", "refused_steps")
            for column in columns:
                np.testing.assert_allclose(
                    x[..., a["columns"].index(column)],
                    y[..., b["columns"].index(column)],
                    rtol=RTOL,
                    atol=ATOL,
                    err_msg=f"{name} {granularity} step {step} {column}",
                )
    if name == "window":
        assert [s for s, _, _ in read_events(torch_run)] == [5, 10, 12]  # the partial window at the end
    if name == "accumulate":
        assert [s for s, _, _ in read_events(torch_run)] == [1, 2, 3]  # 6 micro-batches, 3 updates
    if name == "loss_scaled":  # the premise: steps refused, and each its own step
        events = read_events(torch_run)
        refused = sum(x[0, 0, a["columns"].index("refused_steps")] for _, x, _ in events)
        assert {"loss_scale", "refused_steps"} <= set(shared) and refused == 2
        # Each training step its column: iterations plus the steps refused.
        assert [s for s, _, _ in events] == [1, 2, 3, 4, 5, 6]
    if name == "decay":  # the clip bound: the norm before it is above the applied one
        content, (_, x, _) = a, read_events(torch_run)[0]
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


def reference(grads, weights, units, groups):
    """numpy float64 statistics per group of names (a layer's parameters, or one), columns ``stored_columns(1)``."""
    out = []
    for group in groups:
        g = np.concatenate([grads[n].ravel() for n in group])
        w = np.concatenate([weights[n].ravel() for n in group])
        count = units[group[-1]]  # a layer's units are its last parameter's
        members = [np.all(grads[n].reshape(-1, count) == 0, axis=0) for n in group if units[n] == count]
        row = {
            "grad_norm": np.linalg.norm(g),
            "grad_max_abs": np.max(np.abs(g)),
            "grad_zero_fraction": np.mean(g == 0),
            "grad_nonfinite": np.sum(~np.isfinite(g)),
            "dead_unit_fraction": np.mean(np.logical_and.reduce(members)),
            "weight_norm": np.linalg.norm(w),
        }
        out.append([row[c] for c in metadata.stored_columns(1)])
    return np.array(out)


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
