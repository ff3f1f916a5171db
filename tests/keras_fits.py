"""The Keras backends' tests share one harness: the same fits on JAX or torch (``keras_job.py``) and on TensorFlow here.

tests/jax/test_keras.py and tests/torch/test_keras.py each take ``runs`` for
their backend and hold its rows to the TensorFlow backend's callback
(``assert_rows_equal_tensorflow``) and to a float64 twin of their own.
"""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np

from conftest import read_events
from conftest import stats_content
from keras_job import build
from keras_job import fit
from tb_gradcheck.core import metadata

HERE = pathlib.Path(__file__).resolve().parent  # tests/, where the job script is
WIDTHS = (6, 12, 8, 1)
# Two backends' float32 forward and backward passes (oneDNN, XLA's or
# torch's CPU kernels), and a few optimizer steps on each's own weights:
# float32 rounding in another order, compounded over a few layers and steps.
RTOL = 2e-5
ATOL = 1e-7
# The fits every backend runs; each test module adds its own.
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
}


def fits(**more):
    """``FITS`` with a backend's changes and additions (``{name: {key: value}}``), completed with the shared keys."""
    out = {name: dict(config) for name, config in FITS.items()}
    for name, changes in more.items():
        out.setdefault(name, {}).update(changes)
    for config in out.values():
        config.update(widths=list(WIDTHS), batch_size=8, epochs=config.get("epochs", 1))
    return out


def runs(tmp_path_factory, backend, configs, tensorflow_too):
    """Runs ``configs`` on ``backend`` (``keras_job.py``) and those named in ``tensorflow_too`` on TensorFlow here.

    Returns:
      ``(root, start)``: the backend's runs in ``root/<fit>``, TensorFlow's in
      ``root/tf_<fit>``; ``start`` the weights (``w0``...) and data (``x``, ``y``).
    """
    import keras

    root = tmp_path_factory.mktemp(f"keras_{backend}")
    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(48, WIDTHS[0])).astype(np.float32)
    y = (x[:, :1] * 2.0 + rng.normal(size=(48, 1)) * 0.1).astype(np.float32)
    start = {f"w{i}": w for i, w in enumerate(build(keras, WIDTHS).get_weights())} | {"x": x, "y": y}
    np.savez(root / "start.npz", **start)
    (root / "fits.json").write_text(json.dumps(configs))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    env.pop("KERAS_BACKEND", None)
    done = subprocess.run(
        [sys.executable, str(HERE / "keras_job.py"), backend, str(root)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-4000:]
    for name in tensorflow_too:
        fit(keras, start, configs[name], root / f"tf_{name}", execution=False)
    return root, start


def result(root):
    return json.loads((root / "result.json").read_text())


def assert_the_fits_trained_as_without_the_callback(root, backend, configs):
    """The backend's own callback, no TensorFlow imported, training bit-identical, the optimizer left as found."""
    done = result(root)
    assert done["backend"] == backend
    assert not done["tensorflow_imported"]
    for name in configs:
        assert done[name]["callback"] == f"tb_gradcheck.{backend}.keras.GradientCallback"
        # Weights and every optimizer variable (Adam's moments, the
        # accumulators) after the fit with the callback, against without.
        assert done[name]["bit_identical"], name
        assert done[name]["warnings"] == [], name
        assert done[name]["hooked"] == [], name
    assert done["check_arguments_refused"]  # the fit's gradient check runs on TensorFlow
    assert len(done["refused_warnings"]) == 1 and "LossScaleOptimizer" in done["refused_warnings"][0]
    assert not done["refused_wrote"]
    # A second fit of the same model and optimizer goes on from the first's steps.
    assert [s for s, _, _ in read_events(root / "again" / "train")] == list(range(1, 13))


def assert_rows_equal_tensorflow(root, name):
    """The backend's run of fit ``name`` against the TensorFlow backend's: rows, steps and every shared column."""
    mine_run, tf_run = root / name / "train", root / f"tf_{name}" / "train"
    a, b = stats_content(mine_run), stats_content(tf_run)
    assert a["layer"]["rows"] == b["layer"]["rows"] == ["mlp/dense_0", "mlp/norm", "mlp/dense_1", "mlp/dense_2"]
    assert a["variable"]["rows"] == b["variable"]["rows"]
    assert a["window"] == b["window"]
    shared = [c for c in a["columns"] if c in b["columns"]]
    assert set(metadata.stored_columns(a["window"])) <= set(shared)
    # TensorFlow's callback measures no update under gradient accumulation; these do.
    assert {"update_norm", "update_to_weight"} <= set(a["columns"])
    for granularity in ("layer", "variable"):
        mine, theirs = read_events(mine_run, granularity=granularity), read_events(tf_run, granularity=granularity)
        assert [s for s, _, _ in mine] == [s for s, _, _ in theirs]
        for (step, x, _), (_, y, _) in zip(mine, theirs):
            columns = shared
            if "refused_steps" in shared and y[0, 0, b["columns"].index("refused_steps")] > 0:
                # A refused step's NaN reached other elements on each backend
                # (each backend's ReLU treats NaN its own way): what the refusal did must agree.
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
    steps = [s for s, _, _ in read_events(mine_run)]
    if name == "window":
        assert steps == [5, 10, 12]  # the partial window at the end
    if name == "accumulate":
        assert steps == [1, 2, 3]  # 6 micro-batches, 3 updates
    return a, shared
