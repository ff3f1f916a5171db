"""``GradientCallback(activations=True)`` on Keras' TensorFlow backend, through real fits, against float64 statistics.

Every fit trains on one fixed batch per step (``batch_size`` = the data), so
the test's own callback (``Probe``) can take the same forward independently:
before each step it runs the model's row layers on that batch with
``training=True`` and the weights the step starts from (a Functional model
returning the intermediate outputs; a ``MultiHeadAttention``'s projections
called on its input), and computes each activation column from its
definition in float64 (``metadata.ACTIVATION_STAT_COLUMNS``). The callback's
events are read back with TensorBoard's own event file loader
(``conftest.read_events``). No model has Dropout, so the forward is
deterministic.
"""

import csv
import io
import os
import subprocess
import sys
import warnings

import keras
import numpy as np
import pytest

from conftest import ROOT
from conftest import read_events
from conftest import stats_content
from reference_stats import activation_reference
from tb_gradcheck import cli
from tb_gradcheck.core import metadata
from tb_gradcheck.core.rowstats import MISSING
from tb_gradcheck.keras import GradientCallback

# The probe runs the layers eagerly and the fit in a traced graph, where TensorFlow may fuse or reorder the
# float32 arithmetic of a layer (a few units in the last place of an output, ~1e-7 relative); the callback sums
# squares in float32 (a tree reduction over a few thousand elements, ~1e-7 relative), and stores float32
# (6e-8): 1e-5 is far above those and far below any real difference (a missed or extra call moves act_rms by
# percents, a wrong element set changes a count by a whole element).
RTOL = 1e-5
ACT = metadata.ACTIVATION_STAT_COLUMNS


def _row(layer):
    """The row name of a layer: the parent of its first variable's path (``keras.variables.owner``)."""
    return layer.trainable_variables[0].path.rsplit("/", 1)[0]


def mlp(seed=0, plant_dead=False):
    """Dense(relu), Dense + ReLU layer, Dense(tanh), Dense + Activation("sigmoid"), Dense, with saturating weights."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((6,)),
            keras.layers.Dense(16, activation="relu"),
            keras.layers.Dense(16),
            keras.layers.ReLU(),
            keras.layers.Dense(16, activation="tanh"),
            keras.layers.Dense(8),
            keras.layers.Activation("sigmoid"),
            keras.layers.Dense(2),
        ]
    )
    model.layers[3].kernel.assign(model.layers[3].kernel * 30.0)  # part of the tanh and sigmoid outputs saturate
    model.layers[4].kernel.assign(model.layers[4].kernel * 12.0)
    if plant_dead:  # six units of the first layer have no positive output for any input of the data
        model.layers[0].bias.assign(np.r_[np.full(6, -100.0), np.zeros(10)].astype(np.float32))
    return model


def cnn(seed=0):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((6, 6, 3)),
            keras.layers.Conv2D(8, 3, padding="same"),
            keras.layers.BatchNormalization(),
            keras.layers.ReLU(),
            keras.layers.Conv2D(4, 3),
            keras.layers.BatchNormalization(),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(2),
        ]
    )


def transformer(seed=0):
    keras.utils.set_random_seed(seed)
    tokens = keras.Input((5, 8))
    h = keras.layers.Dense(16, name="embed")(tokens)
    attended = keras.layers.MultiHeadAttention(2, 8, name="mha")(h, h)
    h = keras.layers.LayerNormalization(name="norm")(keras.layers.Add()([h, attended]))
    h = keras.layers.Dense(16, name="up")(keras.layers.Dense(32, activation="relu", name="ffn")(h))
    out = keras.layers.Dense(2, name="head")(keras.layers.GlobalAveragePooling1D()(h))
    return keras.Model(tokens, out)


MODELS = {"mlp": mlp, "cnn": cnn, "transformer": transformer}
SHAPES = {"mlp": (24, 6), "cnn": (4, 6, 6, 3), "transformer": (3, 5, 8)}


def data(name, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=SHAPES[name]).astype(np.float32)
    return x, rng.normal(size=(x.shape[0], 2)).astype(np.float32)


def _kind(layer):
    """The test's own reading of what a row's output goes into: (kind, before the activation, unit axis) or None."""
    act = getattr(layer, "activation", None)
    for kind in ("relu", "tanh", "sigmoid"):
        if act is getattr(keras.activations, kind):
            return kind, False, -1
    return None


def _followers(model):
    out = {}
    if isinstance(model, keras.Sequential):
        for layer, nxt in zip(model.layers, model.layers[1:]):
            if isinstance(nxt, keras.layers.ReLU):
                out[id(layer)] = ("relu", True, -1)
            elif isinstance(nxt, keras.layers.Activation):
                out[id(layer)] = (nxt.get_config()["activation"], True, -1)
    return out


class Probe(keras.callbacks.Callback):
    """Before every step: float64 statistics of each row layer's training-mode output on the step's batch."""

    def __init__(self, model, x):
        super().__init__()
        self.x = x
        self.expected = {}  # step -> {row: {column: value}}
        rows = [layer for layer in model._flatten_layers(include_self=False) if layer._trainable_variables]
        top = [layer for layer in rows if layer in model.layers]
        self.inner = [layer for layer in rows if layer not in model.layers]  # MultiHeadAttention's projections
        self.mha = [layer for layer in model.layers if isinstance(layer, keras.layers.MultiHeadAttention)]
        feeds = [model.get_layer("embed").output] if self.mha else []
        self.probe = keras.Model(model.inputs, [layer.output for layer in top] + feeds)
        self.top = top
        follow = _followers(model)
        self.how = {_row(layer): _kind(layer) or follow.get(id(layer)) for layer in rows}

    def on_train_batch_begin(self, batch, logs=None):
        outs = self.probe([self.x] if len(self.probe.inputs) == 1 else self.x, training=True)
        got = {_row(layer): np.asarray(o, np.float64) for layer, o in zip(self.top, outs)}
        if self.mha:
            mha, h = self.mha[0], outs[-1]
            for layer in (mha._query_dense, mha._key_dense, mha._value_dense):
                got[_row(layer)] = np.asarray(layer(h), np.float64)
            got[_row(mha._output_dense)] = np.asarray(mha(h, h, training=True), np.float64)
        step = int(self.model.optimizer.iterations.numpy()) + 1
        self.expected[step] = {row: self.stats(row, a) for row, a in got.items()}

    def stats(self, row, a):
        how = self.how.get(row)
        if how is None:
            return activation_reference(a.ravel())
        kind, before, axis = how
        y = {"relu": np.maximum, "tanh": lambda v, _: np.tanh(v), "sigmoid": lambda v, _: 1 / (1 + np.exp(-v))}
        out = y[kind](a, 0.0) if before else a
        if kind == "relu":
            return activation_reference(a.ravel(), units=np.moveaxis(out, axis, -1).reshape(-1, a.shape[axis]))
        return activation_reference(a.ravel(), squashed=out, tanh=kind == "tanh")


def fit(tmp_path, name, steps=4, every_n_steps=1, model=None, probe=True, **kwargs):
    """A fit of ``steps`` steps on one batch with the callback; returns (model, probe, {step: {row: {column: value}}})."""
    model = model or MODELS[name]()
    x, y = data(name)
    model.compile(keras.optimizers.SGD(0.05), "mse", jit_compile=kwargs.pop("jit_compile", False))
    callbacks = [Probe(model, x)] if probe else []
    callbacks.append(GradientCallback(str(tmp_path), every_n_steps=every_n_steps, activations=True))
    model.fit(x, y, batch_size=len(x), epochs=steps, shuffle=False, verbose=0, callbacks=callbacks, **kwargs)
    run = os.path.join(str(tmp_path), "train")
    content = stats_content(run)
    rows, columns = content["layer"]["rows"], content["columns"]
    stored = {}
    for step, array, _ in read_events(run):
        stored[step] = {row: {c: float(array[0, i, columns.index(c)]) for c in ACT} for i, row in enumerate(rows)}
        others = array[1:, :, [columns.index(c) for c in ACT]]
        assert np.all(others == MISSING), "activation columns are taken at the write step only"
    return model, callbacks[0] if probe else None, stored


def _values(stored):
    """The stored columns by step, rows in depth order (two fits' models have different names)."""
    return {step: [list(row.values()) for row in rows.values()] for step, rows in stored.items()}


def assert_matches(stored, expected, steps):
    assert sorted(stored) == steps
    for step in steps:
        assert set(stored[step]) == set(expected[step]), step
        for row, want in expected[step].items():
            for column, value in want.items():
                np.testing.assert_allclose(
                    stored[step][row][column], value, rtol=RTOL, err_msg=f"{step} {row} {column}"
                )


@pytest.mark.parametrize("name", sorted(MODELS))
def test_stored_activations_equal_float64_statistics_of_the_same_outputs_every_step(tmp_path, name):
    _, probe, stored = fit(tmp_path, name)
    assert_matches(stored, probe.expected, [1, 2, 3, 4])
    kinds = {row: how for row, how in probe.how.items() if how is not None}
    assert kinds, "the model has rows with a dead or saturated fraction"  # the comparison covers them


def test_export_reads_a_keras_runs_act_columns_as_stored(tmp_path, capsys):
    _, _, stored = fit(tmp_path, "mlp", probe=False)
    assert cli.main(["export", str(tmp_path), "--run", "train", "--metric", "act_dead_fraction"]) == 0
    table = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    rows = list(stored[1])
    assert table[0] == ["step"] + rows and [r[0] for r in table[1:]] == ["1", "2", "3", "4"]
    for line in table[1:]:
        want = [stored[int(line[0])][row]["act_dead_fraction"] for row in rows]
        # An empty cell where nothing is stored (no ReLU follows the row's layer).
        assert [cell == "" for cell in line[1:]] == [w == MISSING for w in want]
        got = [float(cell) if cell else MISSING for cell in line[1:]]
        np.testing.assert_array_equal(np.array(got, np.float32), np.array(want, np.float32))


@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_a_window_stores_the_write_steps_forward_in_its_last_slab(tmp_path, name):
    _, probe, stored = fit(tmp_path, name, steps=6, every_n_steps=3)
    assert_matches(stored, probe.expected, [3, 6])


def test_a_validation_pass_does_not_change_the_recorded_outputs(tmp_path):
    x_val = np.full((5, 6), 30.0, np.float32)  # outputs unlike the training batch's: counted, they would show
    for eager in (False, True):
        model = mlp()
        model.run_eagerly = eager
        _, probe, stored = fit(tmp_path / str(eager), "mlp", model=model, validation_data=(x_val, np.zeros((5, 2))))
        assert_matches(stored, probe.expected, [1, 2, 3, 4])


def test_planted_dead_units_and_saturated_layers_are_recorded(tmp_path):
    model, probe, stored = fit(tmp_path, "mlp", model=mlp(plant_dead=True))
    first, tanh, sigmoid = (_row(model.layers[i]) for i in (0, 3, 4))
    for step in stored:
        assert stored[step][first]["act_dead_fraction"] >= 6 / 16  # the planted six, perhaps more
        assert stored[step][tanh]["act_saturated_fraction"] > 0.1
        assert stored[step][sigmoid]["act_saturated_fraction"] > 0.1
        assert stored[step][_row(model.layers[-1])]["act_dead_fraction"] == MISSING  # nothing follows it
    assert_matches(stored, probe.expected, [1, 2, 3, 4])


@pytest.mark.parametrize("eager", [False, True])
def test_non_finite_outputs_are_counted_and_their_max_is_nan_or_inf(tmp_path, eager):
    model = mlp()
    # Unit 3 of the second layer is Inf or NaN for every sample (NaN where its input is 0), and all after it.
    # Planted in a weight, not the data: a NaN input to the first layer's MatMul + BiasAdd + Relu, which
    # TensorFlow fuses in a graph, comes out of it as 0.
    kernel = model.layers[1].kernel.numpy()
    kernel[0, 3] = np.inf
    model.layers[1].kernel.assign(kernel)
    model.run_eagerly = eager
    x, y = data("mlp")
    model.compile(keras.optimizers.SGD(0.05), "mse", jit_compile=False)
    probe = Probe(model, x)
    callback = GradientCallback(str(tmp_path), activations=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.fit(x, y, batch_size=len(x), epochs=1, shuffle=False, verbose=0, callbacks=[probe, callback])
    content = stats_content(tmp_path / "train")
    [(step, array, _)] = read_events(tmp_path / "train")
    columns = content["columns"]
    stored = {
        row: {c: float(array[0, i, columns.index(c)]) for c in ACT} for i, row in enumerate(content["layer"]["rows"])
    }
    second = stored[_row(model.layers[1])]
    assert second["act_nonfinite"] == len(x) and not np.isfinite(second["act_max_abs"])
    assert stored[_row(model.layers[0])]["act_nonfinite"] == 0
    assert_matches({1: stored}, probe.expected, [1])


@pytest.mark.parametrize("every_n_steps", [1, 3])
def test_under_xla_the_columns_are_computed_in_the_compiled_step(tmp_path, recwarn, every_n_steps):
    # The definitions are traced with the step (rowstats.activation_columns in tf.experimental.numpy): XLA stays on,
    # the write step's compiled function computes them, and the steps between writes run their own function.
    model, probe, stored = fit(tmp_path, "mlp", steps=6, every_n_steps=every_n_steps, jit_compile=True)
    assert not [w for w in recwarn if "XLA off" in str(w.message)], [str(w.message) for w in recwarn]
    assert model.jit_compile is True
    assert_matches(stored, probe.expected, list(range(every_n_steps, 7, every_n_steps)))


def test_steps_per_execution_records_every_step(tmp_path):
    _, _, every = fit(tmp_path / "plain", "mlp", probe=False)
    model = mlp()
    model.compile(keras.optimizers.SGD(0.05), "mse", steps_per_execution=2, jit_compile=False)
    x, y = data("mlp")
    callback = GradientCallback(str(tmp_path / "spe"), activations=True)
    model.fit(x, y, batch_size=len(x), epochs=4, shuffle=False, verbose=0, callbacks=[callback])
    assert [s for s, _, _ in read_events(tmp_path / "spe" / "train")] == [1, 2, 3, 4]
    _, _, spe = fit(tmp_path / "spe2", "mlp", probe=False, steps=4)
    assert _values(spe) == _values(every)


def test_gradient_accumulation_records_the_updating_steps_forward(tmp_path):
    model = mlp()
    x, y = data("mlp")
    model.compile(keras.optimizers.SGD(0.05, gradient_accumulation_steps=2), "mse", jit_compile=False)
    probe = Probe(model, x)
    callback = GradientCallback(str(tmp_path), activations=True)
    model.fit(x, y, batch_size=len(x), epochs=4, shuffle=False, verbose=0, callbacks=[probe, callback])
    content = stats_content(tmp_path / "train")
    columns, rows = content["columns"], content["layer"]["rows"]
    events = read_events(tmp_path / "train")
    assert events, "one record per optimizer update"
    for step, array, _ in events:
        stored = {row: {c: float(array[0, i, columns.index(c)]) for c in ACT} for i, row in enumerate(rows)}
        # The batch is the same at every step: the update's micro-step ran the weights of its last update.
        expected = [e for e in probe.expected.values() if np.isclose(e[rows[0]]["act_rms"], stored[rows[0]]["act_rms"])]
        assert expected, step
        assert_matches({step: stored}, {step: expected[-1]}, [step])


def test_the_fit_leaves_the_layers_call_weights_and_saved_model_as_without_it(tmp_path):
    """Bit-identical weights with Grappler's remapper off.

    With it on, the layer outputs kept for the write are a second reader of a
    pre-activation (``Dense`` then a ``ReLU`` layer), and the remapper fuses
    MatMul + BiasAdd + Relu only where the sum has one reader: the unfused
    sum differs by an ulp (docs/tensorflow.md, "Cost and side effects").
    """
    import tensorflow as tf  # here, not at the top: the torch fit below imports this module without TensorFlow

    saved = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({"remapping": False})
    try:
        plain = mlp()
        x, y = data("mlp")
        plain.compile(keras.optimizers.SGD(0.05), "mse", jit_compile=False)
        plain.fit(x, y, batch_size=len(x), epochs=4, shuffle=False, verbose=0)
        model, _, _ = fit(tmp_path, "mlp", probe=False)
    finally:
        tf.config.optimizer.set_experimental_options({"remapping": saved.get("remapping", True)})
    for layer in model.layers:
        assert "call" not in vars(layer)  # the class's own call again
    for a, b in zip(plain.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(a, b)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    np.testing.assert_array_equal(loaded.predict(x, verbose=0), model.predict(x, verbose=0))


def test_a_fit_that_raises_puts_the_layers_call_back(tmp_path):
    class Boom(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("planted")

    model = mlp()
    x, y = data("mlp")
    model.compile("sgd", "mse", jit_compile=False)
    with pytest.raises(RuntimeError, match="planted"):
        model.fit(x, y, epochs=1, verbose=0, callbacks=[GradientCallback(str(tmp_path), activations=True), Boom()])
    model.fit(x, y, epochs=1, verbose=0)  # the next fit, without the callback, detaches it
    assert not any("call" in vars(layer) for layer in model.layers)


def test_activations_must_be_a_bool():
    with pytest.raises(TypeError, match="activations"):
        GradientCallback("/tmp/unused", activations="yes")


REFUSALS = """
import os, sys
backend = sys.argv[1]
os.environ["KERAS_BACKEND"] = backend if backend != "mirrored" else "tensorflow"
import keras, numpy as np
if backend == "mirrored":
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    with tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile("sgd", "mse")
from tb_gradcheck.keras import GradientCallback
try:
    callback = GradientCallback(sys.argv[2], activations=True)
    if backend == "mirrored":
        model.fit(np.ones((4, 3)), np.ones((4, 1)), verbose=0, callbacks=[callback])
except ValueError as error:
    print("REFUSED:", error)
"""


@pytest.mark.parametrize("backend", ["jax", "mirrored"])
def test_activations_are_refused_with_a_clear_error_where_they_are_not_recorded(tmp_path, backend):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", REFUSALS, backend, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    refused = [line for line in done.stdout.splitlines() if line.startswith("REFUSED:")]
    assert refused, done.stdout + done.stderr
    assert "Expected `activations" in refused[0] and "Received:" in refused[0]
    assert {"jax": "JAX backend", "mirrored": "2 replicas"}[backend] in refused[0]
    assert not os.path.exists(os.path.join(str(tmp_path), "train")) or not os.listdir(tmp_path / "train")


TORCH_FIT = """
import os, sys
os.environ["KERAS_BACKEND"] = "torch"
sys.modules["tensorflow"] = None  # the torch backend's callback must not need TensorFlow
import keras, numpy as np
sys.path[:0] = [sys.argv[3], os.path.dirname(sys.argv[3])]
from test_keras_activations import mlp, data
from tb_gradcheck.keras import GradientCallback
model = mlp(plant_dead=True)
start = np.load(sys.argv[1])
model.set_weights([start[f"w{i}"] for i in range(len(model.weights))])
x, y = data("mlp")
model.compile(keras.optimizers.SGD(0.05), "mse", jit_compile=False)
callback = GradientCallback(sys.argv[2], activations=True, every_n_steps=int(sys.argv[4]))
model.fit(x, y, batch_size=len(x), epochs=4, shuffle=False, verbose=0, callbacks=[callback])
assert not any("call" in vars(layer) for layer in model.layers)
print("DONE")
"""
# Two backends' float32 kernels round differently (a few ulp per output), and three SGD steps carry that into
# the next steps' outputs: 1e-4 holds them to float32 agreement and still catches any real difference (a
# missed call or a wrong element set moves a column by percents; a count differs by a whole element).
BACKENDS_RTOL = 1e-4


@pytest.mark.parametrize("every_n_steps", [1, 2])
def test_keras_on_torch_records_the_same_activation_columns_as_on_tensorflow(tmp_path, every_n_steps):
    model = mlp(plant_dead=True)
    np.savez(tmp_path / "start.npz", **{f"w{i}": w for i, w in enumerate(model.get_weights())})
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            TORCH_FIT,
            str(tmp_path / "start.npz"),
            str(tmp_path / "torch"),
            str(ROOT / "tests" / "tensorflow"),
            str(every_n_steps),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "DONE" in done.stdout, done.stdout + done.stderr
    _, _, tensorflow = fit(tmp_path / "tf", "mlp", model=model, probe=False, every_n_steps=every_n_steps)
    content = stats_content(tmp_path / "torch" / "train")
    columns = content["columns"]
    on_torch = {s: a[0, :, [columns.index(c) for c in ACT]] for s, a, _ in read_events(tmp_path / "torch" / "train")}
    assert sorted(on_torch) == sorted(tensorflow) == list(range(every_n_steps, 5, every_n_steps))
    for step, values in on_torch.items():
        want = np.array([list(row.values()) for row in tensorflow[step].values()], np.float32)
        np.testing.assert_allclose(values.T, want, rtol=BACKENDS_RTOL, err_msg=str(step))
        assert values[0, ACT.index("act_dead_fraction")] >= 6 / 16  # the planted dead units, on both
