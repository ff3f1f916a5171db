"""Models and setups beyond the Dense ones: each once broke the TensorFlow side, held to independent references.

Every fit trains on one fixed batch per step (``batch_size`` = the data), so
the test takes the same gradient or forward itself, in float64 NumPy from a
tape or a probe model at the weights the step starts from, and compares it
with the rows read back by TensorBoard's event file loader
(``conftest.read_events``).
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import read_events
from conftest import stats_content
from reference_stats import activation_reference
from tb_gradcheck import GradientWriter
from tb_gradcheck.core import metadata
from tb_gradcheck.core.rowstats import MISSING
from tb_gradcheck.keras import GradientCallback

# A tape in the test and the fit's train step are both float32 over a few hundred elements; the stored values
# are float32 (6e-8). 1e-5 relative is far above that rounding and far below any real difference (a missed
# variable, a second call counted, a gradient of another step).
RTOL = 1e-5


class Before(keras.callbacks.Callback):
    """Keeps the trainable weights before every training batch."""

    def __init__(self):
        super().__init__()
        self.weights = []

    def on_train_batch_begin(self, batch, logs=None):
        self.weights.append([v.numpy() for v in self.model.trainable_variables])


def tape_gradients(model, weights, x, y):
    """The gradient of the compiled loss at ``weights`` on ``(x, y)``, float64."""
    for v, w in zip(model.trainable_variables, weights):
        v.assign(w)
    with tf.GradientTape() as tape:
        loss = model.compute_loss(x=x, y=y, y_pred=model(x, training=True))
    return [np.asarray(g, np.float64) for g in tape.gradient(loss, model.trainable_variables)]


def test_separable_and_depthwise_convolutions_record_every_variable(tmp_path):
    # SeparableConv2D's depthwise_kernel was tested for truth (`a or b`), which a Keras Variable refuses: the
    # fit failed before its first step.
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(8, 6, 6, 3)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32)
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [
            keras.Input((6, 6, 3)),
            keras.layers.SeparableConv2D(4, 3, depth_multiplier=2, activation="relu", name="sep"),
            keras.layers.DepthwiseConv2D(2, activation="relu", name="depth"),
            keras.layers.Flatten(),
            keras.layers.Dense(1, name="out"),
        ]
    )
    model.compile(keras.optimizers.SGD(0.05), "mse")
    before = Before()
    model.fit(
        x, y, batch_size=len(x), epochs=2, shuffle=False, verbose=0, callbacks=[before, GradientCallback(tmp_path)]
    )

    run = tmp_path / "train"
    content = stats_content(run)
    paths = [v.path for v in model.trainable_variables]
    assert content["variable"]["rows"] == paths
    columns = content["columns"]
    stored = read_events(run, granularity="variable")
    assert [s for s, _, _ in stored] == [1, 2]
    for (_, value, _), weights in zip(stored, before.weights):
        grads = tape_gradients(model, weights, x, y)
        for column, want in (
            ("grad_norm", [np.linalg.norm(g) for g in grads]),
            ("grad_max_abs", [np.abs(g).max() for g in grads]),
            ("grad_zero_fraction", [np.mean(g == 0) for g in grads]),
        ):
            np.testing.assert_allclose(value[0, :, columns.index(column)], want, rtol=RTOL, err_msg=column)
        # A depthwise kernel's units are its (input channel, multiplier) pairs: its last two axes.
        depthwise = grads[paths.index(model.get_layer("sep").depthwise_kernel.path)]
        dead = np.all(depthwise.reshape(-1, depthwise.shape[2] * depthwise.shape[3]) == 0, axis=0).mean()
        row = content["variable"]["rows"].index(model.get_layer("sep").depthwise_kernel.path)
        assert value[0, row, columns.index("dead_unit_fraction")] == pytest.approx(dead)


def recurrent_model():
    keras.utils.set_random_seed(2)
    return keras.Sequential(
        [
            keras.Input((5, 3)),
            keras.layers.LSTM(4, return_sequences=True, name="lstm"),
            keras.layers.GRU(3, name="gru"),
            keras.layers.Dense(1, name="out"),
        ]
    )


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["compiled", "eager"])
def test_recurrent_cells_rows_take_their_rnn_layers_output(tmp_path, run_eagerly):
    # The cells own the weights and run inside the RNN's while loop: a compiled step kept their outputs there
    # and the write could not reach them (InaccessibleTensorError). Their rows take the RNN layer's output, in
    # both modes; an LSTM's or GRU's output is not its `activation`'s, so no saturation is claimed for it.
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(8, 5, 3)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32)
    model = recurrent_model()
    model.compile(keras.optimizers.SGD(0.05), "mse", run_eagerly=run_eagerly)
    before = Before()
    callback = GradientCallback(tmp_path, activations=True)
    model.fit(x, y, batch_size=len(x), epochs=2, shuffle=False, verbose=0, callbacks=[before, callback])

    run = tmp_path / "train"
    content = stats_content(run)
    rows, columns = content["layer"]["rows"], content["columns"]
    names = ("lstm", "gru", "out")
    assert rows == [model.get_layer(n).trainable_variables[0].path.rsplit("/", 1)[0] for n in names]
    probe = keras.Model(model.inputs[0], [model.get_layer(n).output for n in names])
    stored = read_events(run)
    assert [s for s, _, _ in stored] == [1, 2]
    for (_, value, _), weights in zip(stored, before.weights):
        for v, w in zip(model.trainable_variables, weights):
            v.assign(w)
        outputs = probe(x, training=True)
        for i, output in enumerate(outputs):
            want = activation_reference(np.asarray(output, np.float64).ravel())
            for column in metadata.ACTIVATION_STAT_COLUMNS:
                got = value[0, i, columns.index(column)]
                if want[column] == MISSING:
                    assert got == MISSING, (rows[i], column)
                else:
                    np.testing.assert_allclose(got, want[column], rtol=RTOL, err_msg=f"{rows[i]} {column}")


def test_write_inside_an_xla_compiled_step_says_to_stash(tmp_path):
    # XLA cannot compile summary ops: the step failed when it ran, with "Uninitialized arguments" on one of the
    # writer's variables, naming neither the call nor the documented way (stash, then write_stashed).
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    writer = GradientWriter(tmp_path)

    @tf.function(jit_compile=True)
    def step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(model(x) ** 2)
        writer.write(tape.gradient(loss, model.trainable_variables), model.trainable_variables, 1)

    with pytest.raises(ValueError, match=r"outside tf.function\(jit_compile=True\).*stash"):
        step(tf.ones((2, 3)))
    writer.close()


class Block(keras.layers.Layer):
    """A custom layer holding a depthwise convolution: not reachable through any ``layers`` attribute."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.depthwise = keras.layers.DepthwiseConv2D(3, name="depthwise")

    def call(self, x):
        return keras.ops.mean(self.depthwise(x), axis=(1, 2))


class Subclassed(keras.Model):
    """Nested sub-layers and a train step of its own, as users write them."""

    def __init__(self):
        super().__init__(name="subclassed")
        self.block = Block(name="block")
        self.out = keras.layers.Dense(1, name="out")

    def call(self, x, training=False):
        return self.out(self.block(x))

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            loss = self.compute_loss(x=x, y=y, y_pred=self(x, training=True))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        return {"loss": loss}


def test_a_depthwise_kernel_inside_a_custom_layer_has_its_channels_as_units(tmp_path):
    # The depthwise kernels were found by walking `layers` attributes, which a custom Layer does not have: a
    # kernel inside one counted its last axis (the multiplier, here 1) as its units, so a channel whose
    # gradient is all zero was not a dead unit.
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(8, 5, 5, 3)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32)
    x[..., 0] = 0.0  # input channel 0 is silent: its depthwise filter's gradient is exactly zero
    keras.utils.set_random_seed(4)
    model = Subclassed()
    model(x[:1])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    before = Before()
    model.fit(x, y, batch_size=len(x), epochs=1, verbose=0, callbacks=[before, GradientCallback(tmp_path)])

    run = tmp_path / "train"
    content = stats_content(run)
    paths = [v.path for v in model.trainable_variables]
    assert content["variable"]["rows"] == paths
    columns = content["columns"]
    [(_, value, _)] = read_events(run, granularity="variable")
    grads = tape_gradients(model, before.weights[0], x, y)
    np.testing.assert_allclose(value[0, :, columns.index("grad_norm")], [np.linalg.norm(g) for g in grads], rtol=RTOL)
    kernel = paths.index(model.block.depthwise.kernel.path)
    assert not grads[kernel][..., 0, :].any() and grads[kernel][..., 1:, :].all()
    assert value[0, kernel, columns.index("dead_unit_fraction")] == pytest.approx(1 / 3)


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["compiled", "eager"])
def test_stacked_cells_last_row_is_the_rnn_output_and_the_others_missing(tmp_path, run_eagerly):
    # TensorFlow's RNN calls the cells once outside its loop (timestep 0, for the output's shape): the stacked
    # cells' rows held that call alone in a compiled fit (timestep 0 and every step's in an eager one).
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(8, 5, 3)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32)
    keras.utils.set_random_seed(5)
    cells = [keras.layers.LSTMCell(4, name="first"), keras.layers.GRUCell(3, name="last")]
    rnn = keras.layers.RNN(keras.layers.StackedRNNCells(cells), return_sequences=True, name="rnn")
    model = keras.Sequential([keras.Input((5, 3)), rnn, keras.layers.Flatten(), keras.layers.Dense(1, name="out")])
    model.compile(keras.optimizers.SGD(0.05), "mse", run_eagerly=run_eagerly)
    before = Before()
    model.fit(
        x, y, batch_size=len(x), epochs=1, verbose=0, callbacks=[before, GradientCallback(tmp_path, activations=True)]
    )

    run = tmp_path / "train"
    content = stats_content(run)
    rows, columns = content["layer"]["rows"], content["columns"]
    [(_, value, _)] = read_events(run)
    for v, w in zip(model.trainable_variables, before.weights[0]):
        v.assign(w)
    output = np.asarray(keras.Model(model.inputs[0], rnn.output)(x, training=True), np.float64)
    rms = columns.index("act_rms")
    first, last = (rows.index(cell.trainable_variables[0].path.rsplit("/", 1)[0]) for cell in cells)
    assert (value[0, first, rms:] == MISSING).all()
    np.testing.assert_allclose(value[0, last, rms], np.sqrt(np.mean(output**2)), rtol=RTOL)


def test_attention_projections_count_each_head_dimension_as_a_unit(tmp_path):
    # A query kernel [dim, heads, key_dim] took its last axis as its units: dimension d of every head was one
    # unit, dead only when dead in all heads, so a (head, dimension) whose gradient is all zero went unseen.
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(8, 4, 6)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32)
    keras.utils.set_random_seed(6)
    tokens = keras.Input((4, 6))
    mha = keras.layers.MultiHeadAttention(2, 4, name="mha")
    model = keras.Model(tokens, keras.layers.Dense(1, name="out")(keras.layers.Flatten()(mha(tokens, tokens))))
    key = mha._key_dense
    # Head 0's key dimension 0 is zero for every input: the scores do not depend on query (head 0, dimension
    # 0), whose kernel column and bias element get exactly zero gradient; head 1's dimension 0 does not.
    key.kernel.assign(np.where(np.arange(8).reshape(2, 4) == 0, 0.0, key.kernel.numpy()))
    key.bias.assign(np.ones((2, 4), np.float32) * (np.arange(8).reshape(2, 4) != 0))
    model.compile(keras.optimizers.SGD(0.05), "mse")
    before = Before()
    model.fit(x, y, batch_size=len(x), epochs=1, verbose=0, callbacks=[before, GradientCallback(tmp_path)])

    run = tmp_path / "train"
    content = stats_content(run)
    columns, paths = content["columns"], [v.path for v in model.trainable_variables]
    grads = dict(zip(paths, tape_gradients(model, before.weights[0], x, y)))
    query = mha._query_dense
    kernel, bias = grads[query.kernel.path], grads[query.bias.path]
    dead = np.all(kernel.reshape(6, 8) == 0, axis=0)
    assert dead.tolist() == [True] + [False] * 7 and (bias.ravel() == 0).tolist() == dead.tolist()
    dead_column = columns.index("dead_unit_fraction")
    [(_, variable, _)] = read_events(run, granularity="variable")
    for path in (query.kernel.path, query.bias.path):
        assert variable[0, content["variable"]["rows"].index(path), dead_column] == pytest.approx(1 / 8), path
    [(_, layer, _)] = read_events(run)
    assert layer[0, content["layer"]["rows"].index("mha/query"), dead_column] == pytest.approx(1 / 8)


@pytest.mark.parametrize(
    "layer, squashed",
    [(lambda: keras.layers.ConvLSTM1D(2, 2, name="rnn"), False), (lambda: keras.layers.SimpleRNN(3, name="rnn"), True)],
    ids=["conv_lstm", "simple_rnn"],
)
def test_a_recurrent_layer_claims_saturation_only_when_its_output_is_its_activations(tmp_path, layer, squashed):
    # A ConvLSTM's output is o * tanh(c), not its `activation`'s: |h| > 0.98 is not tanh saturation. A
    # SimpleRNN's output is tanh(...) itself.
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=(8, 4, 5, 3)).astype(np.float32), rng.normal(size=(8, 1)).astype(np.float32)
    if squashed:
        x = x.reshape(8, 4, 15)
    keras.utils.set_random_seed(7)
    rnn = layer()
    model = keras.Sequential([keras.Input(x.shape[1:]), rnn, keras.layers.Flatten(), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    before = Before()
    model.fit(
        x, y, batch_size=len(x), epochs=1, verbose=0, callbacks=[before, GradientCallback(tmp_path, activations=True)]
    )

    run = tmp_path / "train"
    content = stats_content(run)
    [(_, value, _)] = read_events(run)
    for v, w in zip(model.trainable_variables, before.weights[0]):
        v.assign(w)
    output = np.asarray(keras.Model(model.inputs[0], rnn.output)(x, training=True), np.float64)
    want = activation_reference(output.ravel(), squashed=output if squashed else None)
    row = content["layer"]["rows"].index(rnn.trainable_variables[0].path.rsplit("/", 1)[0])
    for column in metadata.ACTIVATION_STAT_COLUMNS:
        got = value[0, row, content["columns"].index(column)]
        np.testing.assert_allclose(got, want[column], rtol=RTOL, err_msg=column)
