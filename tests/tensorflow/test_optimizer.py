"""The optimizer view: update_norm, update_to_weight and grad_norm_before_clip, against hand-computed twins."""

import keras
import numpy as np
import optimizer_job
import pytest
import tensorflow as tf

from conftest import get_json
from conftest import make_app
from conftest import read_events
from conftest import stats_content
from conftest import wait_for_steps
from tb_gradcheck.keras import GradientCallback
from tb_gradcheck.tensorflow import statistics
from tb_gradcheck.tensorflow.writer import GradientWriter
from tests.tensorflow.test_keras import HAND_RTOL
from tests.tensorflow.test_keras import WeightRecorder
from tests.tensorflow.test_keras import data
from tests.tensorflow.test_keras import layer_norms
from tests.tensorflow.test_keras import mlp_gradients
from tests.tensorflow.test_keras import tanh_mlp

LAST = 0


def columns(run_dir, granularity="variable"):
    """``[(step, {column: values of the last slab})]`` of one run, columns by the layout's names."""
    names = stats_content(run_dir)["columns"]
    return [
        (s, {c: arr[LAST, :, i] for i, c in enumerate(names)})
        for s, arr, _ in read_events(run_dir, granularity=granularity)
    ]


def variable_norms(tensors):
    return [float(np.linalg.norm(np.asarray(t, np.float64))) for t in tensors]


def diff(after, before):
    return [np.asarray(a, np.float64) - np.asarray(b, np.float64) for a, b in zip(after, before)]


# The update is the difference of two float32 weight tensors, each rounded to
# half an ulp of the weight (|w| up to ~1): an absolute error near 6e-8 per
# element, against updates of 1e-3..1e-2 per element here, so 1e-4 relative
# is safe by two orders and still far below any real mistake (lr applied
# twice, a step off by one, the wrong weights read: all >= 10%).
UPDATE_RTOL = 1e-4


def test_sgd_update_is_lr_times_applied_gradient(tmp_path):
    x, y = data()
    model = tanh_mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    recorder = WeightRecorder()
    model.fit(x, y, batch_size=len(x), epochs=4, verbose=0, callbacks=[recorder, GradientCallback(tmp_path)])
    written = columns(tmp_path / "train")
    assert [s for s, _ in written] == [1, 2, 3, 4]
    assert "grad_norm_before_clip" not in stats_content(tmp_path / "train")["columns"]  # nothing clips
    for (_, col), before in zip(written, recorder.before):
        grads = mlp_gradients(before, x, y)
        expected = [0.1 * n for n in variable_norms(grads)]
        np.testing.assert_allclose(col["update_norm"], expected, rtol=UPDATE_RTOL)
        weights = np.array(variable_norms(before))
        # A fresh bias (all zeros at step 1) has no ratio: MISSING (-1), not Inf.
        ratio = np.where(weights > 0, np.array(expected) / np.where(weights > 0, weights, 1), -1.0)
        np.testing.assert_allclose(col["update_to_weight"], ratio, rtol=UPDATE_RTOL)
        np.testing.assert_allclose(col["weight_norm"], variable_norms(before), rtol=1e-6)
    layers = columns(tmp_path / "train", "layer")
    for (_, col), before in zip(layers, recorder.before):
        grads = mlp_gradients(before, x, y)
        np.testing.assert_allclose(col["update_norm"], [0.1 * n for n in layer_norms(grads)], rtol=UPDATE_RTOL)


@pytest.mark.parametrize("every_n_steps", [1, 3])
def test_adam_update_is_the_weights_change(tmp_path, every_n_steps):
    x, y = data()
    model = tanh_mlp()
    model.compile(optimizer=keras.optimizers.AdamW(0.01, weight_decay=0.1), loss="mse")
    recorder = WeightRecorder()
    model.fit(
        x,
        y,
        batch_size=4,
        epochs=2,
        shuffle=False,
        verbose=0,
        callbacks=[recorder, GradientCallback(tmp_path, every_n_steps=every_n_steps)],
    )
    written = columns(tmp_path / "train")
    assert [s for s, _ in written] == list(range(every_n_steps, 9, every_n_steps)) + ([8] if every_n_steps == 3 else [])
    for step, col in written:
        if every_n_steps == 3 and step == 8:
            # The partial window written at close: no update was bracketed.
            assert (col["update_norm"] == -1).all()
            continue
        before, after = recorder.before[step - 1], recorder.after[step - 1]
        np.testing.assert_allclose(col["update_norm"], variable_norms(diff(after, before)), rtol=UPDATE_RTOL)
        np.testing.assert_allclose(col["weight_norm"], variable_norms(before), rtol=1e-6)


@pytest.mark.parametrize(
    "clip",
    [{"global_clipnorm": 0.05}, {"clipnorm": 0.02}, {"clipvalue": 1e-3}],
    ids=["global_clipnorm", "clipnorm", "clipvalue"],
)
def test_grad_norm_before_clip_is_the_unclipped_gradient(tmp_path, clip):
    x, y = data()
    model = tanh_mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1, **clip), loss="mse")
    recorder = WeightRecorder()
    model.fit(x, y, batch_size=len(x), epochs=3, verbose=0, callbacks=[recorder, GradientCallback(tmp_path)])
    for (_, col), before in zip(columns(tmp_path / "train"), recorder.before):
        # The unclipped gradient, taken with a separate tape at the same weights.
        twin = tanh_mlp(name="tape")
        twin.set_weights(before)
        with tf.GradientTape() as tape:
            loss = keras.losses.mean_squared_error(y, twin(x))
            loss = tf.reduce_mean(loss)
        raw = variable_norms([g.numpy() for g in tape.gradient(loss, twin.trainable_variables)])
        np.testing.assert_allclose(col["grad_norm_before_clip"], raw, rtol=HAND_RTOL)
        assert (col["grad_norm"] < col["grad_norm_before_clip"] * 0.99).all()  # clipping fired, visibly
        np.testing.assert_allclose(col["update_norm"], 0.1 * col["grad_norm"], rtol=UPDATE_RTOL)


def test_refused_mixed_precision_steps_have_zero_update_and_halve_the_loss_scale(tmp_path, policy):
    policy("mixed_float16")
    x, y = data(n=24)
    x[16, 0] = 1e30  # float16 overflow in the forward pass: the third batch's gradient is non-finite
    model = tanh_mlp()
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1), initial_scale=1024.0)
    model.compile(optimizer=optimizer, loss="mse")
    recorder = WeightRecorder()
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[recorder, GradientCallback(tmp_path)])
    written = columns(tmp_path / "train")
    assert [s for s, _ in written] == [1, 2, 3, 4, 5, 6]
    refused = [3, 6]
    scale = 1024.0
    for (step, col), before, after in zip(written, recorder.before, recorder.after):
        moved = variable_norms(diff(after, before))
        assert (col["loss_scale"] == scale).all()
        if step in refused:
            assert moved == [0, 0, 0, 0] and (col["grad_nonfinite"] > 0).any()
            assert (col["update_norm"] == 0).all() and (col["update_to_weight"] == 0).all()
            assert (col["refused_steps"] == 1).all()
            # Read by the refused step itself: the writer leaves weight_norm to the update.
            np.testing.assert_allclose(col["weight_norm"], variable_norms(before), rtol=1e-6)
            scale /= 2  # the next step's gradient is made with half the scale
        else:
            np.testing.assert_allclose(col["update_norm"], moved, rtol=UPDATE_RTOL)
            assert (col["refused_steps"] == 0).all()

    # Served: the new metrics are in the run's list (no before-clip: nothing
    # clips), the loss scale is a per-step series aligned with the heatmap's
    # steps, and export and compare take the new metrics like any other.
    client, _ = make_app(tmp_path, "python")
    run = wait_for_steps(client, "train", 6)
    assert {"update_norm", "update_to_weight", "loss_scale", "refused_steps"} <= set(run["metrics"])
    assert "grad_norm_before_clip" not in run["metrics"] and "clip_ratio" not in run["metrics"]
    heat = get_json(client, "/data/plugin/gradients/heatmap?run=train&metric=loss_scale")
    grad = get_json(client, "/data/plugin/gradients/heatmap?run=train&metric=grad_norm")
    assert heat["steps"] == grad["steps"] == [1, 2, 3, 4, 5, 6]
    assert [row[0] for row in heat["values"]] == [1024.0, 1024.0, 1024.0, 512.0, 512.0, 512.0]
    refused_heat = get_json(client, "/data/plugin/gradients/heatmap?run=train&metric=refused_steps")
    assert [row[0] for row in refused_heat["values"]] == [0, 0, 1, 0, 0, 1]
    csv = client.get("/data/plugin/gradients/export?run=train&metric=update_norm&granularity=variable&format=csv")
    assert csv.status_code == 200 and b"twin/hidden/kernel" in csv.data
    same = get_json(client, "/data/plugin/gradients/compare?run=train&other=train&metric=update_to_weight")
    assert same["steps"] == [1, 2, 3, 4, 5, 6]


def test_refused_steps_of_a_window_are_counted_at_its_write(tmp_path, policy):
    policy("mixed_float16")
    x, y = data(n=24)
    x[16, 0] = 1e30
    model = tanh_mlp()
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    model.fit(
        x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[GradientCallback(tmp_path, every_n_steps=4)]
    )
    written = columns(tmp_path / "train")
    assert [s for s, _ in written] == [4, 6]  # the partial window at the end has no optimizer values
    assert (written[0][1]["refused_steps"] == 1).all() and (written[1][1]["refused_steps"] == -1).all()


def custom_loop(writer, model, optimizer, x, y, steps, strategy=None):
    variables = model.trainable_variables

    def replica_step(step):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.mean_squared_error(y, model(x)))
        grads = tape.gradient(loss, variables)
        clipped, _ = tf.clip_by_global_norm(grads, 0.05)
        with writer.applying(variables, step) as update:
            optimizer.apply_gradients(zip(clipped, variables))
        writer.write(clipped, variables, step, gradients_before_clip=grads, update=update)

    @tf.function
    def train_step(step):
        if strategy is None:
            replica_step(step)
        else:
            strategy.run(replica_step, args=(step,))

    befores, afters = [], []
    for s in range(1, steps + 1):
        befores.append([v.numpy() for v in variables])
        train_step(tf.constant(s, tf.int64))
        afters.append([v.numpy() for v in variables])
    writer.close()
    return befores, afters


def test_custom_loop_bracket_inside_tf_function(tmp_path):
    x, y = data()
    model = tanh_mlp()
    befores, afters = custom_loop(
        GradientWriter(tmp_path, every_n_steps=2), model, keras.optimizers.Adam(0.01), x, y, steps=4
    )
    written = columns(tmp_path)
    assert [s for s, _ in written] == [2, 4]
    for step, col in written:
        before, after = befores[step - 1], afters[step - 1]
        np.testing.assert_allclose(col["update_norm"], variable_norms(diff(after, before)), rtol=UPDATE_RTOL)
        np.testing.assert_allclose(
            col["grad_norm_before_clip"], variable_norms(mlp_gradients(before, x, y)), rtol=HAND_RTOL
        )


def test_bracket_given_another_step_than_write_stores_no_update_and_says_why(tmp_path, capfd):
    """``optimizer.iterations`` passed to both: applying() reads it before the update, write() after it.

    With a window the two then disagree on which steps are written. The
    writer must not store the skipped bracket's placeholder as a zero update
    (real-looking data): update columns are MISSING, weight_norm is still the
    weights' norm, and a warning names the fix.
    """
    x, y = data()
    model = tanh_mlp()
    optimizer = keras.optimizers.SGD(0.01)
    writer = GradientWriter(tmp_path, every_n_steps=2)

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x) - y) ** 2)
        grads = tape.gradient(loss, model.trainable_variables)
        with writer.applying(model.trainable_variables, optimizer.iterations) as update:
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
        writer.write(grads, model.trainable_variables, optimizer.iterations, update=update)

    for _ in range(4):
        step()
    writer.close()
    written = columns(tmp_path)
    assert [s for s, _ in written] == [2, 4]
    for _, col in written:
        assert (col["update_norm"] == statistics.MISSING).all()
        assert (col["update_to_weight"] == statistics.MISSING).all()
    np.testing.assert_allclose(written[-1][1]["weight_norm"], variable_norms(model.trainable_variables), rtol=1e-6)
    assert "pass applying() and write() the same step value" in capfd.readouterr().err


def test_update_and_before_clip_under_mirrored_strategy(tmp_path):
    """A custom loop (writer.applying inside strategy.run) and model.fit, each on two replicas."""
    import json
    import os
    import subprocess
    import sys

    from conftest import ROOT

    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    done = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "optimizer_job.py"), str(tmp_path)],
        check=False,
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-5000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    x, y = optimizer_job.arrays()
    for name, run_dir in (("custom", tmp_path / "custom"), ("fit", tmp_path / "fit" / "train")):
        written = columns(run_dir)
        befores, afters = result[name]["before"], result[name]["after"]
        assert [s for s, _ in written] == list(range(1, optimizer_job.STEPS + 1))
        for (_step, col), before, after in zip(written, befores, afters):
            # The sum over both replicas of the gradient before clipping: the global batch's gradient.
            np.testing.assert_allclose(
                col["grad_norm_before_clip"], variable_norms(mlp_gradients(before, x, y)), rtol=HAND_RTOL, err_msg=name
            )
            np.testing.assert_allclose(
                col["update_norm"], variable_norms(diff(after, before)), rtol=UPDATE_RTOL, err_msg=name
            )


def test_write_refuses_an_update_that_is_not_a_bracket(tmp_path):
    v = tf.Variable([1.0, 2.0])
    with GradientWriter(tmp_path) as writer:
        with pytest.raises(TypeError, match="Expected `update` to be the bracket"):
            writer.write([tf.constant([0.1, 0.1])], [v], 1, update="not a bracket")
        with pytest.raises(ValueError, match="Expected"):
            writer.write([tf.constant([0.1, 0.1])], [v], 1, gradients_before_clip=[tf.constant([0.1, 0.1])] * 2)


def test_eager_bracket_with_no_write_step_reads_nothing_and_writes_missing_at_close(tmp_path):
    v = tf.Variable([3.0, 4.0])
    writer = GradientWriter(tmp_path, every_n_steps=5)
    for step in (1, 2):
        with writer.applying([v], step) as update:
            v.assign_sub([0.3, 0.4])
        assert [b.shape.as_list() for b in update._before] == [[0]]  # not a write step: the weights not read
        writer.write([tf.constant([1.0, 1.0])], [v], step, update=update)
    writer.close()
    ((_, col),) = columns(tmp_path)
    assert col["update_norm"][0] == -1 and col["weight_norm"][0] == pytest.approx(4.0, rel=1e-6)


def test_tab_draws_the_loss_scale_track_under_the_heatmap(tmp_path, policy, browser):
    """Real Chromium over a real `tensorboard`: the track is there, column-aligned, and not a heatmap metric."""
    from conftest import TensorBoardProcess
    from tests.test_browser import Tab

    policy("mixed_float16")
    x, y = data(n=24)
    x[16, 0] = 1e30  # the third step of each epoch is refused
    model = tanh_mlp()
    model.compile(optimizer=keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)), loss="mse")
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0, callbacks=[GradientCallback(tmp_path)])
    proc = TensorBoardProcess(tmp_path)
    try:
        proc.wait_for_steps("train", 6)
        tab = Tab(browser, proc.url)
        try:
            tab.select("#run-select", "train")
            tab.frame.wait_for_selector("canvas.loss-scale-track", timeout=15000)
            options = tab.frame.eval_on_selector_all("#metric-select option", "els => els.map((e) => e.value)")
            assert "update_to_weight" in options and "loss_scale" not in options and "refused_steps" not in options
            # The two refused steps (3 and 6) are marked in their heatmap columns, in the track's red.
            red = tab.frame.evaluate("""() => {
                const c = document.querySelector('canvas.loss-scale-track');
                const d = c.getContext('2d').getImageData(0, 0, c.width, 1).data;
                const xs = [];
                for (let x = 0; x < c.width; x++) if (d[4 * x] > 150 && d[4 * x + 2] < 100) xs.push(x);
                return {width: c.width, xs};
            }""")
            columns = [int(x * 6 / red["width"]) for x in red["xs"]]
            assert sorted(set(columns)) == [2, 5], red
        finally:
            tab.close()
    finally:
        proc.close()


def test_clip_ratio_is_served_and_drawn_on_the_diverging_scale(tmp_path, browser):
    """before-clip / applied: served as a ratio of the stored columns, drawn around 1 with both ends named."""
    from conftest import TensorBoardProcess
    from tests.test_browser import Tab

    x, y = data()
    model = tanh_mlp()
    model.compile(optimizer=keras.optimizers.SGD(0.1, global_clipnorm=0.05), loss="mse")
    model.fit(x, y, batch_size=len(x), epochs=3, verbose=0, callbacks=[GradientCallback(tmp_path)])
    written = columns(tmp_path / "train", granularity="layer")
    proc = TensorBoardProcess(tmp_path)
    try:
        run = proc.wait_for_steps("train", 3)
        assert "clip_ratio" in run["metrics"]
        heat = proc.get_json("/data/plugin/gradients/heatmap?run=train&metric=clip_ratio")
        expected = [col["grad_norm_before_clip"] / col["grad_norm"] for _, col in written]
        np.testing.assert_allclose(heat["values"], expected, rtol=1e-6)
        assert (np.asarray(heat["values"]) > 1.01).all()  # the global norm was clipped at every step
        tab = Tab(browser, proc.url)
        try:
            tab.select("#run-select", "train")
            tab.select("#metric-select", "clip_ratio")
            legend = tab.frame.locator("#legend").inner_text()
            assert "1\u00d7" in legend and "clipped (before-clip larger)" in legend
            assert tab.frame.locator("#scale button[data-value=linear]").is_disabled()
            assert not tab.errors
        finally:
            tab.close()
    finally:
        proc.close()
