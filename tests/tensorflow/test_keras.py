"""GradientCallback through real model.fit: the applied gradients, steps, mixed precision, cleanup, misuse."""

import glob
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

from conftest import get_json
from conftest import make_app
from conftest import read_events
from conftest import stats_content
from conftest import wait_for_steps
from tb_gradcheck import GradientWriter
from tb_gradcheck.core import metadata
from tb_gradcheck.keras import GradientCallback
from tb_gradcheck.tensorflow import compiled

COL = {c: i for i, c in enumerate(metadata.STORED_STAT_COLUMNS)}
LAST = 0  # the "last" slab: every step is written


class WeightRecorder(keras.callbacks.Callback):
    """Keeps the trainable weights (as numpy) before and after every training batch."""

    def __init__(self):
        super().__init__()
        self.before, self.after = [], []

    def on_train_batch_begin(self, batch, logs=None):
        self.before.append([v.numpy() for v in self.model.trainable_variables])

    def on_train_batch_end(self, batch, logs=None):
        self.after.append([v.numpy() for v in self.model.trainable_variables])


def data(n=16, features=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, features)).astype(np.float32), rng.normal(size=(n, 1)).astype(np.float32)


def tanh_mlp(seed=1, name="twin"):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4, activation="tanh", name="hidden"),
            keras.layers.Dense(1, name="out", dtype="float32"),
        ],
        name=name,
    )


def mlp_gradients(weights, x, y):
    """The MSE gradient of ``tanh_mlp`` by hand, in float64: what the optimizer should receive."""
    w1, b1, w2, b2 = (np.asarray(w, np.float64) for w in weights)
    x, y = x.astype(np.float64), y.astype(np.float64)
    h = np.tanh(x @ w1 + b1)
    d_out = 2.0 * (h @ w2 + b2 - y) / len(x)  # keras "mse": mean over the batch of the squared error
    dz = (d_out @ w2.T) * (1.0 - h**2)
    return [x.T @ dz, dz.sum(0), h.T @ d_out, d_out.sum(0)]


def layer_norms(tensors):
    """Per-layer L2 norms of (kernel, bias) pairs."""
    return [np.sqrt(sum(np.sum(np.square(t, dtype=np.float64)) for t in tensors[i : i + 2])) for i in (0, 2)]


# float32 forward and backward passes over 16 samples and 4 hidden units round
# each gradient element to a few ulp (float32 eps is 1.2e-7); 1e-5 relative
# leaves an order of magnitude for that, and is 10^4 below any real mistake
# (a missing unscale, a second replica counted, a step off by one).
HAND_RTOL = 1e-5


@pytest.mark.parametrize("run_eagerly", [False, True], ids=["compiled", "eager"])
def test_logged_norms_are_the_hand_computed_gradients_sgd_applied(tmp_path, run_eagerly):
    x, y = data()
    model = tanh_mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", run_eagerly=run_eagerly)
    recorder = WeightRecorder()
    # One fixed batch, five steps: the gradient changes only through the weights.
    model.fit(x, y, batch_size=len(x), epochs=5, verbose=0, callbacks=[recorder, GradientCallback(tmp_path)])

    layers = read_events(tmp_path / "train", granularity="layer")
    variables = read_events(tmp_path / "train", granularity="variable")
    assert [s for s, _, _ in layers] == [1, 2, 3, 4, 5]  # optimizer.iterations after each update
    for (_, layer, _), (_, var, _), before, after in zip(layers, variables, recorder.before, recorder.after):
        grads = mlp_gradients(before, x, y)
        np.testing.assert_allclose(layer[LAST, :, COL["grad_norm"]], layer_norms(grads), rtol=HAND_RTOL)
        np.testing.assert_allclose(var[LAST, :, COL["grad_max_abs"]], [np.abs(g).max() for g in grads], rtol=HAND_RTOL)
        # Weight columns are of the weights the gradient was taken at.
        np.testing.assert_allclose(layer[LAST, :, COL["weight_norm"]], layer_norms(before), rtol=1e-6)
        # And it is what SGD applied: w_after = w_before - 0.1 * g.
        np.testing.assert_allclose([a - 0.1 * g for a, g in zip(before[0], grads[0])], after[0], rtol=1e-5, atol=1e-7)


def test_clipped_gradients_are_recorded_as_applied(tmp_path):
    x, y = data()
    model = tanh_mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1, clipnorm=0.02), loss="mse")
    recorder = WeightRecorder()
    model.fit(x, y, batch_size=len(x), epochs=2, verbose=0, callbacks=[recorder, GradientCallback(tmp_path)])
    for (_, var, _), before in zip(read_events(tmp_path / "train", granularity="variable"), recorder.before):
        raw = [np.linalg.norm(g) for g in mlp_gradients(before, x, y)]
        assert min(raw) > 0.02  # every tensor is clipped, so the test can tell
        # clipnorm scales each tensor to norm 0.02; float32 rounding of that.
        np.testing.assert_allclose(var[LAST, :, COL["grad_norm"]], 0.02, rtol=1e-6)


def test_gradient_accumulation_records_one_step_per_update(tmp_path):
    x, y = data(n=32)
    model = tanh_mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1, gradient_accumulation_steps=2), loss="mse")
    recorder = WeightRecorder()
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[recorder, GradientCallback(tmp_path)])
    layers = read_events(tmp_path / "train")
    assert [s for s, _, _ in layers] == [1, 2]  # 4 batches, 2 updates
    for k, (_, layer, _) in enumerate(layers):
        before = recorder.before[2 * k]  # both micro-batches are taken at these weights
        micro = [mlp_gradients(before, x[i * 8 : (i + 1) * 8], y[i * 8 : (i + 1) * 8]) for i in (2 * k, 2 * k + 1)]
        mean = [(a + b) / 2 for a, b in zip(*micro)]
        np.testing.assert_allclose(layer[LAST, :, COL["grad_norm"]], layer_norms(mean), rtol=HAND_RTOL)


def sparse_model(seed=3):
    keras.utils.set_random_seed(seed)
    tokens = keras.Input((5,), dtype="int32")
    h = keras.layers.Flatten()(keras.layers.Embedding(20, 4, name="embed")(tokens))
    h = keras.layers.Dense(8, name="dense")(h)
    h = keras.layers.BatchNormalization(name="norm")(h)
    h = keras.layers.Activation("relu")(h)
    h = keras.layers.Dropout(0.3, name="drop")(h)
    return keras.Model(tokens, keras.layers.Dense(1, name="out")(h), name="sparse")


def test_the_callback_only_reads_bit_identical_batch_norm_once_sums_are_not_reordered(tmp_path):
    """Batch-2 BatchNormalization amplifies any rounding; with the arithmetic optimizer off, nothing differs at all.

    With it on, the extra reads can make TensorFlow's graph optimizer order
    one gradient sum differently (an ulp of gamma, grown to ~1e-4 by 60
    chaotic steps): docs/tensorflow.md, "Cost and side effects".
    """
    rng = np.random.default_rng(10)
    x = rng.normal(size=(120, 16)).astype(np.float32)
    y = np.tanh(x @ rng.normal(size=(16, 1)) / 3).astype(np.float32)

    def fit(callbacks):
        keras.utils.set_random_seed(10)
        model = keras.Sequential(
            [keras.Input((16,)), keras.layers.Dense(64), keras.layers.BatchNormalization(), keras.layers.ReLU()]
            + [keras.layers.Dense(1)]
        )
        model.compile(keras.optimizers.SGD(0.01, momentum=0.9), "mse")
        model.fit(x, y, batch_size=2, epochs=1, verbose=0, shuffle=False, callbacks=callbacks)
        return [v.numpy() for v in model.weights]

    saved = tf.config.optimizer.get_experimental_options()
    tf.config.optimizer.set_experimental_options({"arithmetic_optimization": False})
    try:
        plain, recorded = fit([]), fit([GradientCallback(tmp_path)])
    finally:
        tf.config.optimizer.set_experimental_options(
            {"arithmetic_optimization": saved.get("arithmetic_optimization", True)}
        )
    assert all(np.array_equal(a, b) for a, b in zip(plain, recorded))


def test_fit_with_callback_is_bit_identical_and_steps_per_execution_records_every_step(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 20, size=(56, 5)).astype(np.int32)
    y = rng.normal(size=(56, 1)).astype(np.float32)

    def fit(callbacks, steps_per_execution=1):
        model = sparse_model()
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse", steps_per_execution=steps_per_execution)
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
        return model

    plain = fit([])
    hooked = fit([GradientCallback(tmp_path / "spe1")])
    chunked = fit([GradientCallback(tmp_path / "spe3")], steps_per_execution=3)
    for model in (hooked, chunked):
        for a, b in zip(plain.variables, model.variables):  # weights, BN statistics, seed state
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(plain.optimizer.variables, model.optimizer.variables):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

    one = read_events(tmp_path / "spe1" / "train", granularity="variable")
    three = read_events(tmp_path / "spe3" / "train", granularity="variable")
    assert [s for s, _, _ in one] == [s for s, _, _ in three] == list(range(1, 15))
    for (_, a, _), (_, b, _) in zip(one, three):
        np.testing.assert_array_equal(a, b)  # the same gradients, recorded inside the while loop
    # The Embedding gradient is sparse (IndexedSlices): rows no token touched are exact zeros.
    embed = stats_content(tmp_path / "spe1" / "train")["variable"]["rows"].index("embed/embeddings")
    for step, value, _ in one:
        batch = x[((step - 1) % 7) * 8 : ((step - 1) % 7 + 1) * 8]
        untouched = 20 - len(np.unique(batch))
        assert value[LAST, embed, COL["grad_zero_fraction"]] == pytest.approx(untouched / 20)


def test_tensorboard_callback_and_gradient_callback_make_one_run_with_aligned_steps(tmp_path):
    x, y = data(n=48)
    model = tanh_mlp()
    model.compile(optimizer="sgd", loss="mse")
    # update_freq=2: TensorBoard wraps training in a record_if that is fixed
    # when the step is traced (at batch 1, so False); the gradient records
    # must not inherit it.
    callbacks = [keras.callbacks.TensorBoard(tmp_path, update_freq=2), GradientCallback(tmp_path)]
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)

    client, _ = make_app(tmp_path, "python")
    entry = wait_for_steps(client, "train", 6)
    assert entry["granularities"]["layer"]["first_step"] == 1
    assert entry["granularities"]["layer"]["last_step"] == 6
    scalars = get_json(client, "/data/plugin/scalars/scalars?run=train&tag=batch_loss")
    assert [s[1] for s in scalars] == [2, 4, 6]  # TensorBoard's batch steps are the optimizer's
    heat = get_json(client, "/data/plugin/gradients/heatmap?run=train&metric=grad_norm")
    assert heat["steps"] == [1, 2, 3, 4, 5, 6]


def mixed_model():
    """Linear float16 hidden layer, float32 output layer: an overflow can be partial."""
    keras.utils.set_random_seed(3)
    return keras.Sequential(
        [
            keras.Input((3,)),
            keras.layers.Dense(4, name="hidden"),
            keras.layers.Dense(1, name="out", dtype="float32"),
        ],
        name="mixed",
    )


def overflowing_data():
    """32 samples; the third batch of 4 makes the scaled float16 backward pass overflow.

    3e4 is finite in float16 (max 65504), so the forward pass and the
    float32 output layer's gradient stay finite; the hidden layer's scaled
    gradient (about 1e8 * 2**15 / 4) overflows float16 and the
    LossScaleOptimizer skips the step.
    """
    x, y = data(n=32)
    x[9] = 3e4
    return x, y


def out_layer_gradient(weights, x, y):
    """Hand-computed (float64) norms of the output layer's kernel and bias gradients."""
    w1, b1, w2, b2 = (np.asarray(w, np.float64) for w in weights)
    h = x.astype(np.float64) @ w1 + b1
    d_out = 2.0 * (h @ w2 + b2 - y) / len(x)
    return [np.linalg.norm(h.T @ d_out), np.abs(d_out.sum())]


# float16 forward pass: each activation carries a relative error up to 2**-11
# (4.9e-4); 1e-2 leaves 20x for it. A still-scaled gradient is 2**15 off.
FLOAT16_RTOL = 1e-2


def check_skipped_record(value, before, x, y):
    """The refused step: non-finite hidden gradient, finite and unscaled output gradient."""
    assert (value[LAST, :2, COL["grad_nonfinite"]] == [12, 4]).all()
    assert not np.isfinite(value[LAST, :2, COL["grad_norm"]]).any()
    assert (value[LAST, 2:, COL["grad_nonfinite"]] == 0).all()
    np.testing.assert_allclose(value[LAST, 2:, COL["grad_norm"]], out_layer_gradient(before, x, y), rtol=FLOAT16_RTOL)


def test_mixed_precision_records_unscaled_gradients_and_the_skipped_step(tmp_path, policy):
    policy("mixed_float16")
    x, y = overflowing_data()
    model = mixed_model()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    recorder = WeightRecorder()
    model.fit(x, y, batch_size=4, shuffle=False, verbose=0, callbacks=[recorder, GradientCallback(tmp_path)])
    assert int(model.optimizer.iterations) == 7  # 8 batches, one skipped
    assert float(model.optimizer.dynamic_scale) == 2.0**14  # halved once

    variables = read_events(tmp_path / "train", granularity="variable")
    assert [s for s, _, _ in variables] == list(range(1, 9))  # every batch has its own step
    for k, (_step, value, _) in enumerate(variables):
        before, after = recorder.before[k], recorder.after[k]
        if k == 2:
            assert all(np.array_equal(a, b) for a, b in zip(before, after))  # nothing applied
            check_skipped_record(value, before, x[8:12], y[8:12])
            continue
        assert (value[LAST, :, COL["grad_nonfinite"]] == 0).all()
        # The gradient SGD applied, from the update itself: (before - after) / lr.
        # Recovering it from float32 weights costs ~eps*|w|/|dw| ~ 1e-5; a
        # scaled gradient would be off by 2**14 or more.
        implied = [np.linalg.norm((b.astype(np.float64) - a) / 0.1) for b, a in zip(before, after)]
        np.testing.assert_allclose(value[LAST, :, COL["grad_norm"]], implied, rtol=1e-4)

    # A second fit (a new callback) continues the axis after the skipped step.
    model.fit(x[:8], y[:8], batch_size=4, shuffle=False, verbose=0, callbacks=[GradientCallback(tmp_path)])
    assert [s for s, _, _ in read_events(tmp_path / "train")][-2:] == [9, 10]


def test_custom_loop_with_loss_scale_optimizer_as_documented(tmp_path, policy):
    """The custom-loop recipe of docs/distributed.md, mixed-precision part."""

    policy("mixed_float16")
    x, y = overflowing_data()
    model = mixed_model()
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    optimizer.build(model.trainable_variables)
    loss_fn = keras.losses.MeanSquaredError()
    train_steps = tf.Variable(0, dtype=tf.int64)
    writer = GradientWriter(tmp_path)

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
            scaled = optimizer.scale_loss(loss)
        grads = tape.gradient(scaled, model.trainable_variables)
        # Unscale with the scale these gradients were made with, before
        # apply() changes it; count every step, skipped or not.
        unscaled = [g / optimizer.dynamic_scale for g in grads]
        writer.write(unscaled, model.trainable_variables, train_steps.assign_add(1))
        optimizer.apply(grads, model.trainable_variables)

    before = []
    for i in range(0, 32, 4):
        before.append([v.numpy() for v in model.trainable_variables])
        train_step(x[i : i + 4], y[i : i + 4])
    writer.close()
    before.append([v.numpy() for v in model.trainable_variables])

    variables = read_events(tmp_path, granularity="variable")
    assert [s for s, _, _ in variables] == list(range(1, 9))
    check_skipped_record(variables[2][1], before[2], x[8:12], y[8:12])
    implied = [np.linalg.norm((b.astype(np.float64) - a) / 0.1) for b, a in zip(before[0], before[1])]
    np.testing.assert_allclose(variables[0][1][LAST, :, COL["grad_norm"]], implied, rtol=1e-4)


class NaNGuard(keras.layers.Layer):
    """Fails the training step on a non-finite input, like tf.debugging in a user's model."""

    def call(self, inputs):
        return tf.debugging.check_numerics(inputs, "bad input")


def test_error_in_the_training_step_detaches_the_callback(tmp_path):
    x, y = data(n=32)
    x[20] = np.nan
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((3,)), NaNGuard(), keras.layers.Dense(1, name="out")], name="guarded")
    model.compile(optimizer="sgd", loss="mse")
    with pytest.raises(tf.errors.InvalidArgumentError, match="bad input"):
        model.fit(x, y, batch_size=8, shuffle=False, verbose=0, callbacks=[GradientCallback(tmp_path)])
    assert "_all_reduce_sum_gradients" not in vars(model.optimizer)
    assert model.train_function is None
    assert [s for s, _, _ in read_events(tmp_path / "train")] == [1, 2]  # on disk: the writer was closed

    model.fit(x[:16], y[:16], batch_size=8, verbose=0)  # a plain fit afterwards records nothing
    assert len(read_events(tmp_path / "train")) == 2


def test_a_second_callback_on_one_optimizer_takes_over_and_records_every_step(tmp_path):
    # Two GradientCallbacks in one fit: the second lets the first go before it hooks the optimizer, so its own
    # hooks stay set (the first's restore must not undo them), and the fit leaves the optimizer as it was.
    x, y = data()
    model = tanh_mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    first, second = GradientCallback(tmp_path / "first"), GradientCallback(tmp_path / "second")
    with pytest.warns(UserWarning, match="Another GradientCallback was still attached"):
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[first, second])
    assert [s for s, _, _ in read_events(tmp_path / "second" / "train")] == [1, 2, 3, 4]
    assert read_events(tmp_path / "first" / "train") == []
    assert not {"_all_reduce_sum_gradients", "apply", "_backend_update_step"} & set(vars(model.optimizer))
    assert model.train_function is None


def test_error_in_an_xla_fit_writes_the_steps_stashed_before_it(tmp_path):
    """With XLA a step is written after it, from the stash: a failure must not lose the steps held."""
    x, y = data(n=64)

    def batches():
        for i in range(5):
            if i == 4:
                raise ValueError("bad batch")
            yield x[8 * i : 8 * i + 8], y[8 * i : 8 * i + 8]

    model = tanh_mlp()
    model.compile(optimizer="sgd", loss="mse", jit_compile=True)
    with pytest.raises(Exception, match="bad batch"):
        model.fit(batches(), epochs=1, shuffle=False, verbose=0, callbacks=[GradientCallback(tmp_path)])
    assert model.train_function is None  # detached, the writer closed
    assert [s for s, _, _ in read_events(tmp_path / "train")] == [1, 2, 3, 4]


class Boom(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        raise RuntimeError("boom")


@pytest.mark.parametrize("jit", [False, True], ids=["graph", "xla"])
def test_fit_after_an_error_outside_the_step_runs_without_the_hooks(tmp_path, jit):
    x, y = data(n=16)
    model = tanh_mlp()
    model.compile(optimizer="sgd", loss="mse", jit_compile=jit)
    with pytest.raises(RuntimeError, match="boom"):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[GradientCallback(tmp_path), Boom()])
    # on_train_end never ran, and Keras still caches the hooked train function.
    assert "_all_reduce_sum_gradients" in vars(model.optimizer)
    model.fit(x, y, batch_size=8, verbose=0)  # without the callback: its steps 3, 4 are not recorded
    assert int(model.optimizer.iterations) == 4
    assert "_all_reduce_sum_gradients" not in vars(model.optimizer)
    assert [s for s, _, _ in read_events(tmp_path / "train")] == [1, 2]  # and the file was closed


@pytest.mark.parametrize("every, clipnorm", [(1, None), (3, None), (1, 0.05)])
def test_xla_stays_on_and_records_what_the_uncompiled_fit_records(tmp_path, monkeypatch, every, clipnorm):
    """Statistics are computed inside the XLA-compiled step and written after it, optimizer columns too."""
    x, y = data(n=64)
    weights, records = {}, {}
    calls, between = [], []
    write_compiled = GradientWriter.write_compiled
    monkeypatch.setattr(GradientWriter, "write_compiled", lambda self: calls.append(1) or write_compiled(self))
    between_writes_next = compiled.Schedule.between_writes_next
    monkeypatch.setattr(
        compiled.Schedule, "between_writes_next", lambda self: between.append(between_writes_next(self)) or between[-1]
    )
    for jit, callback in ((True, True), (True, False), (False, True)):
        model = tanh_mlp()
        model.compile(optimizer=keras.optimizers.SGD(clipnorm=clipnorm), loss="mse", jit_compile=jit)
        run = tmp_path / f"{jit}_{callback}"
        callbacks = [GradientCallback(run, every_n_steps=every)] if callback else []
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no "turns XLA off"
            model.fit(x, y, batch_size=8, verbose=0, callbacks=callbacks)
        assert model.jit_compile is jit
        weights[jit, callback] = [w.numpy() for w in model.weights]
        if callback:
            records[jit] = {s: v for s, v, _ in read_events(run / "train")}
            columns = stats_content(run / "train")["columns"]
    assert all((a == b).all() for a, b in zip(weights[True, True], weights[True, False]))  # bit-identical
    expected = [3, 6, 8] if every == 3 else list(range(1, 9))  # 8: the partial window at close
    assert sorted(records[True]) == sorted(records[False]) == expected
    # The host calls the writer after the first step and then only when it
    # must: at write steps (3 and 6 of 8 with a window of 3), or, written
    # every step, when the stash is full (every 8 steps). What is left, the
    # partial window or steps 2-8, is written at close.
    assert len(calls) == (3 if every == 3 else 1)
    # A window's steps that cannot be write steps run the train function
    # compiled for them (the statistics of the window only): with a window
    # of 3, steps 2, 4, 5, 7 and 8 (step 1 comes before any count).
    if every == 3:
        assert [s for s, b in enumerate(between[:8], 1) if b] == [2, 4, 5, 7, 8]
    assert ("grad_norm_before_clip" in columns) == (clipnorm is not None)
    # XLA may fuse and reorder the reductions: float32 rounding, nothing more.
    for step in expected:
        np.testing.assert_allclose(records[True][step], records[False][step], rtol=1e-5, atol=1e-7)


def test_xla_window_over_epochs_and_a_partial_batch_records_what_the_uncompiled_fit_records(tmp_path):
    """Both compiled train functions retrace for the last, smaller batch, each as what it is."""
    x, y = data(n=60)  # 7 batches of 8 and one of 4, twice
    records = {}
    for jit in (True, False):
        model = tanh_mlp()
        model.compile(optimizer="sgd", loss="mse", jit_compile=jit)
        run = tmp_path / str(jit)
        callback = GradientCallback(run, every_n_steps=3)
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[callback])
        records[jit] = {s: v for s, v, _ in read_events(run / "train", granularity="variable")}
    assert sorted(records[True]) == sorted(records[False]) == [3, 6, 9, 12, 15, 16]
    for step in records[True]:
        np.testing.assert_allclose(records[True][step], records[False][step], rtol=1e-5, atol=1e-7)


def test_xla_is_turned_off_when_several_steps_run_per_call(tmp_path):
    x, y = data(n=16)
    model = tanh_mlp()
    model.compile(optimizer="sgd", loss="mse", jit_compile=True, steps_per_execution=2)
    with pytest.warns(UserWarning, match="turns XLA off.*steps_per_execution"):
        model.fit(x, y, batch_size=4, verbose=0, callbacks=[GradientCallback(tmp_path)])
    assert model.jit_compile is True
    assert [s for s, _, _ in read_events(tmp_path / "train")] == [1, 2, 3, 4]


def test_event_file_opens_when_training_begins(tmp_path):
    callback = GradientCallback(tmp_path / "logs")
    x, y = data(n=16)
    model = tanh_mlp()
    model.compile(optimizer="sgd", loss="mse")
    # The run directory is made and checked when the callback is built; its event file when training begins.
    assert (tmp_path / "logs" / "train").is_dir() and not glob.glob(str(tmp_path / "logs/**/events.*"), recursive=True)
    model.fit(x, y, batch_size=8, verbose=0, callbacks=[callback])
    assert len(glob.glob(str(tmp_path / "logs/train/events.out.tfevents.*"))) == 1


def test_window_longer_than_the_fit_warns_and_writes_the_partial_window(tmp_path):
    x, y = data(n=32)
    model = tanh_mlp()
    model.compile(optimizer="sgd", loss="mse")
    with pytest.warns(UserWarning, match="every_n_steps=10.*longer than this fit \\(4 steps\\)"):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[GradientCallback(tmp_path, every_n_steps=10)])
    layers = read_events(tmp_path / "train")
    assert [s for s, _, _ in layers] == [4]
    assert layers[0][1].shape[0] == len(metadata.AGGREGATES)


def test_check_data_without_check_every_n_steps_warns(tmp_path):
    x, y = data(n=16)
    model = tanh_mlp()
    model.compile(optimizer="sgd", loss="mse")
    with pytest.warns(UserWarning, match="no gradient check will run"):
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[GradientCallback(tmp_path, check_data=(x, y))])
    assert len(read_events(tmp_path / "train")) == 2  # still records the gradients


def test_model_without_optimizer_warns_and_records_nothing(tmp_path):
    model = tanh_mlp()  # never compiled: driven by hand, as in a custom loop
    callbacks = keras.callbacks.CallbackList([GradientCallback(tmp_path)], model=model)
    with pytest.warns(UserWarning, match="no optimizer"):
        callbacks.on_train_begin()
    callbacks.on_train_end()
    assert not glob.glob(str(tmp_path / "**" / "events.*"), recursive=True)  # no event file


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"log_dir": 3}, TypeError, "`log_dir` to be a path. Received: int"),
        ({"log_dir": "x", "every_n_steps": 0}, ValueError, "`every_n_steps` to be a positive integer. Received: 0"),
        ({"log_dir": "x", "check_every_n_steps": 5}, ValueError, "Expected `check_data`.*check_data=None"),
        ({"log_dir": "x", "check_every_n_steps": True, "check_data": (1, 2)}, ValueError, "Received: True"),
        ({"log_dir": "x", "check_data": [1]}, TypeError, "Received: list of length 1"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        GradientCallback(**kwargs)


def test_gradient_check_runs_every_n_steps_on_check_data(tmp_path):
    pytest.importorskip(
        "tb_gradcheck.tensorflow.check", reason="tb_gradcheck.tensorflow.check (issue 3) is not on this branch yet"
    )
    x, y = data(n=32)

    def fit(callbacks):
        model = tanh_mlp()
        model.compile(optimizer="sgd", loss="mse")
        model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
        return model

    plain = fit([])
    checked = fit([GradientCallback(tmp_path, check_every_n_steps=3, check_data=(x[:8], y[:8]))])
    for a, b in zip(plain.variables, checked.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    checks = read_events(tmp_path / "train", kind="check")
    assert [s for s, _, _ in checks] == [3, 6]


def test_a_log_dir_that_cannot_hold_the_run_is_refused_when_the_callback_is_built(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="GradientCallback can write its run to. Received: '.*file/train'"):
        GradientCallback(tmp_path / "file")
    assert GradientCallback(tmp_path / "logs").run_dir == str(tmp_path / "logs" / "train")


def test_a_second_fit_with_a_new_optimizer_warns_that_its_steps_hide_the_first(tmp_path):
    """Keras' fine-tuning recipe: fit the head with the base frozen, unfreeze, compile() again, fit again.

    The new optimizer starts at step 1, so the second fit rewrites the first's
    steps and TensorBoard hides them: said when the second fit begins. A second
    fit of the same optimizer goes on from the first and is not warned.
    """
    x, y = data()
    model = tanh_mlp()
    model.layers[0].trainable = False
    model.compile(keras.optimizers.SGD(0.1), "mse")
    callback = GradientCallback(tmp_path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[callback])
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[callback])  # steps 5-6
        assert not [w for w in caught if "went back" in str(w.message)]
        model.layers[0].trainable = True
        model.compile(keras.optimizers.SGD(0.01), "mse")
        model.fit(x, y, batch_size=8, verbose=0, callbacks=[GradientCallback(tmp_path)])
    [warning] = [str(w.message) for w in caught if "went back" in str(w.message)]
    assert f"the steps written to {tmp_path / 'train'} went back, to 1 after 6" in warning
    assert "give it a log_dir of its own" in warning
    assert [s for s, _, _ in read_events(tmp_path / "train")] == [1, 2, 3, 4, 5, 6, 1, 2]
