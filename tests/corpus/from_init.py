"""Explosions present from the first step: nothing to rise from, the gradient is too large for its weights from the start."""

import numpy as np

from corpus.healthy import _tf
from corpus.registry import Expect
from corpus.registry import custom_loop
from corpus.registry import scenario

DEPTH = 30
STEPS = 40
RNN = "rnn/rnn/simple_rnn_cell"


def _first_step_norm(model, loss_fn, x, y):
    """The global gradient norm of one batch at the model's current weights, and the loss."""
    tf = _tf()
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(loss_fn(y, model(x, training=True)))
    return float(tf.linalg.global_norm(tape.gradient(loss, model.trainable_variables))), float(loss)


def _deep_relu(scale):
    tf = _tf()
    tf.keras.utils.set_random_seed(60)  # the same draws, scaled: the twin differs in the scale only
    init = tf.keras.initializers.VarianceScaling(scale, "fan_in", "untruncated_normal")
    layers = [tf.keras.Input((32,))]
    layers += [tf.keras.layers.Dense(64, "relu", kernel_initializer=init, name=f"dense_{i}") for i in range(DEPTH)]
    layers.append(tf.keras.layers.Dense(10, name="out"))
    return tf.keras.Sequential(layers, name="mlp")


@scenario(
    Expect(
        "exploding",
        ("mlp/dense_0", f"mlp/dense_{DEPTH - 1}", "mlp/out"),
        allowed=r"mlp/dense_\d+",
        steps=(0, 0),
        severity="error",
    )
)
def deep_relu_2x_he(run_dir):
    """A 30-layer plain ReLU MLP initialised at twice He's standard deviation (He et al. 2015, eq. 10, with variance 8/n instead of 2/n): every layer doubles the signal, forward and backward, so the gradient is 2**30 times too large from the first step. There is no past for it to rise from."""
    tf = _tf()
    rng = np.random.default_rng(60)
    x = rng.normal(size=(64 * STEPS, 32)).astype(np.float32)
    y = rng.integers(0, 10, 64 * STEPS)
    loss_fn = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    twin_norm, twin_loss = _first_step_norm(_deep_relu(2.0), loss_fn, x[:64], y[:64])
    model = _deep_relu(8.0)
    norm, loss = _first_step_norm(model, loss_fn, x[:64], y[:64])
    batches = [(x[i * 64 : (i + 1) * 64], y[i * 64 : (i + 1) * 64]) for i in range(STEPS)]
    custom_loop(run_dir, model, loss_fn, batches, tf.keras.optimizers.Adam(1e-3))
    numbers = {"norm_step0": norm, "he_twin_norm_step0": twin_norm, "loss_step0": loss, "he_twin_loss_step0": twin_loss}
    return numbers, [
        ("the gradient at step 0 is 1e6 times its He twin's or more", norm >= 1e6 * twin_norm),
        ("the twin is an ordinary start (loss under 10)", twin_loss < 10),
    ]


def _adding(n, length, rng):
    """The adding problem (Hochreiter & Schmidhuber 1997): the sum of the two marked values of a sequence."""
    values = rng.uniform(0, 1, (n, length)).astype(np.float32)
    marks = np.zeros((n, length), np.float32)
    for row in marks:
        row[rng.choice(length, 2, replace=False)] = 1.0
    return np.stack([values, marks], axis=-1), (values * marks).sum(axis=1, keepdims=True)


def _adding_rnn(gain, length):
    tf = _tf()
    L = tf.keras.layers
    tf.keras.utils.set_random_seed(61)
    recurrent = tf.keras.initializers.Orthogonal(gain=gain)
    return tf.keras.Sequential(
        [
            tf.keras.Input((length, 2)),
            L.SimpleRNN(32, recurrent_initializer=recurrent, name="rnn"),
            L.Dense(1, name="out"),
        ],
        name="rnn",
    )


@scenario(Expect("exploding", (RNN,), allowed=r"rnn/out", steps=(0, 0), severity="error"))
def rnn_gain3_adding(run_dir):
    """A tanh SimpleRNN whose recurrent kernel is orthogonal with gain 3, on the adding problem over 50 steps: backpropagation through time multiplies the gradient by up to 3 per step (Pascanu et al. 2013), so it explodes from the first batch. Clipped, as careful loops do, so the weights barely move and it stays exploded."""
    tf = _tf()
    length = 50
    x, y = _adding(2048, length, np.random.default_rng(61))
    loss_fn = tf.keras.losses.MeanSquaredError()
    twin_norm, _ = _first_step_norm(_adding_rnn(1.0, length), loss_fn, x[:32], y[:32])
    model = _adding_rnn(3.0, length)
    norm, _ = _first_step_norm(model, loss_fn, x[:32], y[:32])
    batches = [(x[i * 32 : (i + 1) * 32], y[i * 32 : (i + 1) * 32]) for i in range(60)]
    _, norms, first_bad = custom_loop(run_dir, model, loss_fn, batches, tf.keras.optimizers.SGD(0.01, clipnorm=1.0))
    total = np.sqrt((norms**2).sum(axis=1))
    numbers = {"norm_step0": norm, "gain1_twin_norm_step0": twin_norm, "median_norm": float(np.median(total))}
    return numbers, [
        ("the gradient at step 0 is 1e3 times its gain-1 twin's or more", norm >= 1e3 * twin_norm),
        ("it stays there: the median step's norm is too", np.median(total) >= 1e3 * twin_norm),
        ("no NaN: the explosion is there without one", first_bad is None),
    ]
