"""Pathological training runs, each with the findings it must get."""

import numpy as np

from corpus.healthy import _batches
from corpus.healthy import _mlp
from corpus.healthy import _regression
from corpus.healthy import _tf
from corpus.registry import Expect
from corpus.registry import custom_loop
from corpus.registry import scenario
from corpus.registry import silent_units

SPIKE_STEP = 137
RNN = "rnn/rnn/simple_rnn_cell"


@scenario(Expect("vanishing", ("mlp/dense_0", "mlp/dense_1"), allowed=r"mlp/dense_[2-6]", severity="warning"))
def deep_sigmoid(run_dir):
    """A 10-layer sigmoid MLP with the "standard" initialisation U[-1/sqrt(n), 1/sqrt(n)]: gradients vanish toward the input (Glorot & Bengio 2010, fig. 7)."""
    tf = _tf()
    tf.keras.utils.set_random_seed(20)
    x, y = _regression(20)
    init = tf.keras.initializers.VarianceScaling(1.0 / 3.0, "fan_in", "uniform")  # U[-1/sqrt(n), 1/sqrt(n)]
    model = _mlp("mlp", [64] * 10, "sigmoid", init, 16)
    _, norms, _ = custom_loop(
        run_dir, model, tf.keras.losses.MeanSquaredError(), _batches(x, y, 64, 200, 20), tf.keras.optimizers.SGD(0.1)
    )
    kernels = norms[:, 0::2]
    orders = float(np.log10(np.median(kernels[:, -1]) / np.median(kernels[:, 0])))
    return {"output_over_input_orders": orders}, [("input layer 3+ orders below the output layer", orders >= 3.0)]


def _rnn(run_dir, activation, gain, lr, seed):
    tf = _tf()
    L = tf.keras.layers
    tf.keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(512, 30, 4)).astype(np.float32)
    y = x[:, :, 0].sum(axis=1, keepdims=True).astype(np.float32) / 5.0
    model = tf.keras.Sequential(
        [
            tf.keras.Input((30, 4)),
            L.SimpleRNN(
                32, activation=activation, recurrent_initializer=tf.keras.initializers.Orthogonal(gain=gain), name="rnn"
            ),
            L.Dense(1, name="out"),
        ],
        name="rnn",
    )
    _, norms, first_bad = custom_loop(
        run_dir, model, tf.keras.losses.MeanSquaredError(), _batches(x, y, 32, 60, seed), tf.keras.optimizers.SGD(lr)
    )
    total = np.sqrt((norms**2).sum(axis=1))
    end = first_bad if first_bad is not None else len(total)
    with np.errstate(over="ignore"):
        rise = float(np.log10(np.max(total[:end]) / np.median(total[:end]))) if end > 1 else 0.0
    return {"first_nonfinite_step": first_bad, "rise_orders_before": rise}, [
        ("the gradient rose 2+ orders above its median", rise >= 2.0),
        ("then went non-finite", first_bad is not None),
    ]


@scenario(
    Expect("exploding", (RNN,), allowed=r"rnn/out", before="first_nonfinite_step", severity="error"),
    Expect("non_finite", (RNN,), allowed=r"rnn/out", at="first_nonfinite_step", severity="error"),
)
def rnn_relu_gain(run_dir):
    """A ReLU SimpleRNN with recurrent gain 1.4 over 30 steps (1.4**30 ~ 2e4): each update raises the gain further and the gradient overflows within a few steps (Pascanu et al. 2013)."""
    return _rnn(run_dir, "relu", 1.4, 0.01, 21)


@scenario(
    Expect("exploding", (RNN,), allowed=r"rnn/out", before="first_nonfinite_step", severity="error"),
    Expect("non_finite", (RNN,), allowed=r"rnn/out", at="first_nonfinite_step", severity="error"),
    # Once the weights have exploded, tanh saturates: its derivative
    # rounds to exactly 0 in float32, and a saturated unit gets exactly
    # zero gradient on the whole batch, as a dead one does. True, so allowed.
    Expect("dead", (), allowed=RNN, before="first_nonfinite_step"),
)
def rnn_tanh_gain(run_dir):
    """A tanh SimpleRNN with recurrent gain 3 and a large step: backpropagation through time explodes (Pascanu et al. 2013), the weights follow, then NaN."""
    return _rnn(run_dir, "tanh", 3.0, 0.5, 21)


def _diverge(run_dir, every_n_steps):
    tf = _tf()
    tf.keras.utils.set_random_seed(23)
    x, y = _regression(23)
    model = _mlp("mlp", [32, 32], "relu", "he_normal", 16)
    _, norms, first_bad = custom_loop(
        run_dir,
        model,
        tf.keras.losses.MeanSquaredError(),
        _batches(x, y * 10, 64, 40, 23),
        tf.keras.optimizers.SGD(0.5),
        every_n_steps=every_n_steps,
    )
    total = np.sqrt((norms**2).sum(axis=1))
    end = first_bad if first_bad is not None else len(total)
    rise = float(np.log10(np.nanmax(total[:end]) / total[0]))
    return {"first_nonfinite_step": first_bad, "rise_orders_before": rise}, [
        ("NaN within 10 steps", first_bad is not None and first_bad < 10),
        ("after a rise of 3+ orders", rise >= 3.0),
    ]


_DIVERGE = (
    Expect("non_finite", ("mlp/dense_0", "mlp/dense_1", "mlp/out"), at="first_nonfinite_step", severity="error"),
    Expect("exploding", ("mlp/out",), allowed=r"mlp/dense_[01]", before="first_nonfinite_step", severity="error"),
)


@scenario(*_DIVERGE)
def lr_diverges(run_dir):
    """SGD with a learning rate far above 2 / (largest Hessian eigenvalue): the loss and gradients grow geometrically, then overflow to NaN."""
    return _diverge(run_dir, 1)


@scenario(*_DIVERGE)
def lr_diverges_every_10(run_dir):
    """The same divergence written with ``every_n_steps=10``: the window must keep the true first NaN step and the explosion before it."""
    return _diverge(run_dir, 10)


def _dead_share(model, layer, x):
    """Share of a ReLU layer's units that are zero on every example of ``x``."""
    return float(silent_units(model, layer, x).mean())


@scenario(Expect("dead", ("mlp/dense_1",), severity="warning"))
def dead_negative_bias(run_dir):
    """ReLU units whose bias starts far below any pre-activation never fire and never recover (the "dying ReLU" of Lu et al. 2019): nearly the whole layer, so (almost) no gradient passes it."""
    tf = _tf()
    tf.keras.utils.set_random_seed(24)
    x, y = _regression(24)
    bias = np.zeros(64, np.float32)
    bias[:60] = -20.0  # 60 of 64 units, 94%
    model = _mlp("mlp", [64, 64, 64], "relu", "he_normal", 16)
    model.get_layer("dense_1").bias.assign(bias)
    custom_loop(
        run_dir, model, tf.keras.losses.MeanSquaredError(), _batches(x, y, 64, 200, 24), tf.keras.optimizers.Adam(1e-3)
    )
    share, after = _dead_share(model, "dense_1", x), _dead_share(model, "dense_2", x)
    return {"dead_share_dense_1": share, "dead_share_dense_2": after}, [
        # 60 of 64 can never fire: a bias of -20 against pre-activations of a few units.
        ("90% or more of dense_1 is dead", share >= 0.9),
        ("dense_2 still has live units", after < 0.75),
    ]


@scenario(Expect("dead", ("mlp/dense_1", "mlp/dense_2"), severity="warning"))
def dead_high_adam_lr(run_dir):
    """A too-high Adam rate knocks ReLU units into the region where they never fire again (Lu et al. 2019)."""
    tf = _tf()
    tf.keras.utils.set_random_seed(25)
    x, y = _regression(25)
    model = _mlp("mlp", [64, 64, 64], "relu", "he_normal", 16)
    custom_loop(
        run_dir, model, tf.keras.losses.MeanSquaredError(), _batches(x, y, 64, 200, 25), tf.keras.optimizers.Adam(0.1)
    )
    shares = {f"dead_share_dense_{i}": _dead_share(model, f"dense_{i}", x) for i in range(3)}
    return shares, [
        ("dense_0 is alive", shares["dead_share_dense_0"] < 0.1),
        ("85% or more of dense_1 is dead", shares["dead_share_dense_1"] >= 0.85),
        ("50-85% of dense_2 is dead", 0.5 <= shares["dead_share_dense_2"] <= 0.85),
    ]


@scenario(Expect("exploding", ("mlp/dense_0", "mlp/dense_1", "mlp/out"), steps=(125, 150), severity="warning"))
def spike_every_25(run_dir):
    """One corrupted batch (a loss 10**6 too large) at step 137, written with ``every_n_steps=25``, clipped before the update as careful loops do."""
    tf = _tf()
    tf.keras.utils.set_random_seed(26)
    x, y = _regression(26)
    model = _mlp("mlp", [32, 32], "relu", "he_normal", 16)
    optimizer = tf.keras.optimizers.SGD(0.01, clipnorm=1.0)
    _, norms, _ = custom_loop(
        run_dir,
        model,
        tf.keras.losses.MeanSquaredError(),
        _batches(x, y, 64, 300, 26),
        optimizer,
        every_n_steps=25,
        scale={SPIKE_STEP: 1e6},
    )
    total = np.sqrt((norms**2).sum(axis=1))
    others = np.delete(total, SPIKE_STEP)
    orders = float(np.log10(total[SPIKE_STEP] / np.median(others)))
    return {"spike_orders": orders}, [("the spike is 4+ orders above the median step", orders >= 4.0)]


@scenario(Expect("check_failure", ("scaled",), severity="error"))
def wrong_custom_gradient(run_dir):
    """A layer whose ``tf.custom_gradient`` returns twice the true gradient, found by the in-loop check (``check_gradients`` + ``write_check``)."""
    tf = _tf()
    from tb_gradcheck import GradientWriter
    from tb_gradcheck import check_gradients

    tf.keras.utils.set_random_seed(27)
    x, y = _regression(27, n=64)

    @tf.custom_gradient
    def wrong_matmul(a, w):
        def grad(g):
            return tf.matmul(g, w, transpose_b=True), 2.0 * tf.matmul(a, g, transpose_a=True)  # 2x: the bug

        return tf.matmul(a, w), grad

    class Scaled(tf.keras.layers.Layer):
        def build(self, shape):
            self.w = self.add_weight(shape=(shape[-1], 16), initializer="glorot_uniform", name="kernel")

        def call(self, a):
            return wrong_matmul(a, tf.convert_to_tensor(self.w))

    inputs = tf.keras.Input((16,))
    h = tf.keras.layers.Dense(16, activation="tanh", name="dense")(inputs)
    h = Scaled(name="scaled")(h)
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(1, name="out")(h), name="model")
    optimizer = tf.keras.optimizers.SGD(0.01)
    mse = tf.keras.losses.MeanSquaredError()
    variables = model.trainable_variables
    failed = []
    with GradientWriter(run_dir) as writer:
        for step in range(30):
            with tf.GradientTape() as tape:
                loss = mse(y, model(x))
            grads = tape.gradient(loss, variables)
            writer.write(grads, variables, step)
            if step % 10 == 0:
                report = check_gradients(lambda: mse(y, model(x)), variables, seed=step)
                writer.write_check(report, step)
                failed.append(step)
            optimizer.apply_gradients(zip(grads, variables))
    # The premise: the layer's gradient really is twice the true one.
    scaled = model.get_layer("scaled")
    with tf.GradientTape() as tape:
        wrong = tf.reduce_sum(scaled(x))
    with tf.GradientTape() as tape2:
        true = tf.reduce_sum(tf.matmul(x, scaled.w))
    ratio = float(tf.norm(tape.gradient(wrong, scaled.w)) / tf.norm(tape2.gradient(true, scaled.w)))
    return {"wrong_over_true": ratio, "checks_at": failed}, [
        ("the custom gradient is 2x the true one", abs(ratio - 2) < 1e-3)
    ]
