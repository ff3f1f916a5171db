"""Planted gradient bugs the check must find (and locate), and correct models it must never convict, in every mode.

A few seeds each, to stay fast; benchmarks/check_power.py runs the same
models over many seeds and docs/gradient_check.md ("Limits") quotes it.
"""

import warnings

import numpy as np
import pytest
import tensorflow as tf

import check_models
from conftest import read_events
from tb_gradcheck import check_gradients
from tb_gradcheck.core import metadata
from tb_gradcheck.keras import GradientCallback
from tb_gradcheck.keras import float64_twin
from tb_gradcheck.keras import sync_twin

SEEDS = range(3)

# What each mode is built to catch in float32 (see docs/gradient_check.md,
# "Limits"): the default's gradient probe sees errors along the gradient and
# its zero-set probe cut paths; a single element, an averaged bias or an
# input-dependent slope need thorough mode's per-variable and block probes.
DEFAULT_CATCHES = ("scale", "sign", "transpose", "row", "column", "stop_gradient", "layer_norm", "attention")
THOROUGH_ONLY = ("element", "bias_mean", "leaky_relu")


def check(case, seed, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing here writes state or needs eager fallback
        return check_gradients(case.loss, case.variables, seed=seed, **kwargs)


def assert_found(report, wrong):
    """The wrong layers (at least one of them) mismatch, and no other layer does."""
    status = {r.name: r.status for r in report.layers}
    assert any(status[name] == "mismatch" for name in wrong), status
    assert all(s != "mismatch" for name, s in status.items() if name not in wrong), status


@pytest.mark.parametrize("kind", DEFAULT_CATCHES)
def test_default_mode_catches_bugs_along_the_gradient_and_cut_paths_in_float32(kind):
    case, wrong = check_models.planted(kind)
    for seed in SEEDS:
        assert_found(check(case.reseed(seed), seed), wrong)


@pytest.mark.parametrize("kind", THOROUGH_ONLY + DEFAULT_CATCHES[:3])
def test_thorough_mode_catches_localized_bugs_in_float32(kind):
    case, wrong = check_models.planted(kind)
    for seed in SEEDS:
        assert_found(check(case.reseed(seed), seed, thorough=True), wrong)


def test_one_wrong_element_in_a_4096_parameter_kernel_is_caught_and_located_in_thorough_mode():
    case, wrong = check_models.planted("element", width=64)  # dense_1's kernel is 64 x 64
    assert case.model.get_layer("dense_1").kernel.shape == (64, 64)
    for seed in SEEDS:
        report = check(case.reseed(seed), seed, thorough=True)
        assert_found(report, wrong)
        assert report.layers[1].location == "dense_1/kernel[1, 2]"
        # The default mode cannot see it in float32, and says so through its
        # power: the element's share of the gradient is far below what it catches.
        default = check(case, seed).layers[1]
        assert default.status != "mismatch" and default.min_detectable_error > 0.01


@pytest.mark.parametrize("kind", check_models.PLANTED_KINDS)
def test_float64_twin_catches_every_planted_kind_at_the_default_cost(kind):
    case32, wrong = check_models.planted(kind)
    twin = float64_twin(case32.model)
    case64 = check_models.Case(twin, 16)
    for seed in SEEDS[:2]:
        case32.reseed(seed)
        sync_twin(case32.model, twin)  # the float32 model's weights, in float64
        case64.x.assign(tf.cast(case32.x, tf.float64))
        case64.y.assign(tf.cast(case32.y, tf.float64))
        report = check(case64, seed)
        assert report.dtype == "float64" and report.tolerance < 1e-6
        assert_found(report, wrong)
        assert report.evaluations < 150  # no thorough probes: 9 + 12 per layer, plus confirmations and bisection


@pytest.mark.parametrize(
    "kind, location",
    [
        ("element", "dense_1/kernel[1, 2]"),
        ("row", "dense_1/kernel[1, :]"),
        ("column", "dense_1/kernel[:, 2]"),
        ("stop_gradient", "dense_1/kernel[:, 8:16]"),
        ("bias_mean", "dense_1/bias"),
    ],
)
def test_a_mismatch_is_located_by_bisection_within_a_few_dozen_evaluations(kind, location):
    case, _ = check_models.planted(kind, dtype="float64")
    located = check(case.reseed(0), 0)
    unlocated = check(case, 0, probes=3)
    row = located.layers[1]
    assert row.status == "mismatch" and row.location == location
    assert f"(at {location})" in str(located) and located.to_dict()["layers"][1]["location"] == location
    # The same seed and state: the only extra evaluations are the bisection's
    # (the two runs are identical, so compare against the probes' own count).
    probing = (
        1
        + 8
        + sum(
            4 * (1 + (p.reason.startswith("confirmed") or p.reason.startswith("smooth")))
            for r in unlocated.layers
            for p in r.probes
        )
    )
    assert located.evaluations - probing <= 64, (located.evaluations, probing)


@pytest.mark.parametrize("kind", check_models.CLEAN_KINDS)
def test_correct_models_never_mismatch_in_any_mode(kind):
    dtypes = ("float32",) if kind == "float16" else ("float32", "float64")
    for dtype in dtypes:
        case = check_models.clean(kind, dtype=dtype)
        for seed in SEEDS[:2]:
            for thorough in (False, True):
                report = check(case.reseed(seed), seed, thorough=thorough, granularity="variable")
                assert report.ok, (dtype, thorough, [(r.name, r.relative_error, r.probes) for r in report.failures])
    if kind != "float16":
        # Correct is also confirmed, not just never convicted: most rows ok.
        assert sum(r.status == "ok" for r in report.rows) >= len(report.rows) // 2, str(report)


@pytest.mark.parametrize("kind", ("relu_padded", "max_pool_ties"))
def test_a_correct_gradient_at_exact_kinks_is_never_a_mismatch(kind):
    """Many elements exactly at a kink: TensorFlow's convention there is no one-sided slope, and not a bug.

    Zero biases with zero-padded rows (every ReLU input at 0) and max-pool
    windows of equal values: before the check read a conviction again a step
    to either side, 5 or more of these 30 seeds of each convicted a correct layer in float32.
    """
    case = check_models.clean(kind)
    convicted, excused = [], []
    for seed in range(30):
        report = check(case.reseed(seed), seed)
        convicted += [(seed, r.name, r.relative_error) for r in report.failures]
        excused += [
            seed for r in report.rows for p in r.probes if p.reason.startswith("the loss is not differentiable")
        ]
    assert not convicted, convicted
    # And it is that reading which spared them, not a luckier draw.
    assert excused


def test_power_is_in_the_table_the_dict_and_the_stored_check_column(tmp_path):
    case, _ = check_models.planted("element")
    report = check(case.reseed(0), 0)
    for row in report.layers:
        assert 0.01 < row.min_detectable_error < 1  # tolerance plus two error bars, a few percent in float32
        assert row.to_dict()["min_detectable_error"] == row.min_detectable_error
    assert "catches >=" in str(report) and f"{100 * report.layers[0].min_detectable_error:.3g}%" in str(report)
    from tb_gradcheck import GradientWriter

    with GradientWriter(tmp_path) as writer:
        writer.write_check(report, 0)
    ((_, stored, _),) = read_events(tmp_path, kind="check")
    column = metadata.CHECK_COLUMNS.index("min_detectable_error")
    np.testing.assert_allclose(stored[:, column], [r.min_detectable_error for r in report.layers], rtol=1e-6)


def test_a_zero_analytic_derivative_takes_a_step_from_the_rows_gradient_not_the_cap():
    # stop_gradient zeroes half the kernel's gradient: the zero-set probe's
    # analytic derivative is 0, and its step must resolve the true one
    # (the old rule sent it to 1% of the parameters, where float64
    # curvature read as a kink and nothing was ever convicted).
    case, _ = check_models.planted("stop_gradient", dtype="float64")
    row = check(case.reseed(0), 0, granularity="variable").variables[2]  # dense_1/kernel
    zero_set = [p for p in row.probes if p.direction == "zero_set"]
    assert row.status == "mismatch" and zero_set and zero_set[0].status == "mismatch"
    kernel = case.model.get_layer("dense_1").kernel.numpy()
    assert zero_set[0].step < 1e-3 * np.linalg.norm(kernel)


def test_callback_checks_a_float64_twin_and_leaves_the_model_as_plain_training_does(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 8)).astype(np.float32), rng.normal(size=(32, 1)).astype(np.float32)

    def fit(callbacks):
        case, _ = check_models.planted("element")
        case.reseed(0)
        case.model.compile(optimizer="sgd", loss="mse")
        case.model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
        return case.model

    plain = fit([])
    callback = GradientCallback(tmp_path, check_every_n_steps=2, check_data=(x[:16], y[:16]), check_dtype="float64")
    checked = fit([callback])
    for a, b in zip(plain.variables, checked.variables):
        assert a.dtype == b.dtype and np.array_equal(np.asarray(a), np.asarray(b))  # live model untouched
    records = read_events(tmp_path / "train", kind="check")
    assert [s for s, _, _ in records] == [2, 4]
    status = metadata.CHECK_STATUSES
    column = metadata.CHECK_COLUMNS.index("status")
    # Rows in the writer's order: dense_0, dense_1, head. float64 sees the
    # one doubled element of dense_1 at every check; nothing else is wrong.
    for _, matrix, _ in records:
        assert [status[int(s)] for s in matrix[:, column]][1] == "mismatch"
        assert "mismatch" not in [status[int(s)] for j, s in enumerate(matrix[:, column]) if j != 1]
    with pytest.raises(
        ValueError, match=r"`check_dtype` to be one of \[None, 'float32', 'float64'\]. Received: 'float16'"
    ):
        GradientCallback(tmp_path, check_dtype="float16")


def test_callback_by_default_convicts_on_the_float64_twin_what_float32_leaves_open_or_calls_ok(tmp_path):
    case, _ = check_models.planted("bias_mean")
    case.reseed(0)
    x, y = case.x.numpy(), case.y.numpy()
    # No step moves the weights: each check sees the same model and batch.
    # The callback draws a fresh seed for each check; float32 alone convicts
    # dense_1 at about three quarters of seeds and leaves it open or calls it
    # ok (a bias gradient n times too small is ~0.5% along the gradient at
    # some seeds, under float32's 1% tolerance) at the others, while the
    # float64 twin convicts it at every seed (docs/gradient_check.md,
    # "Limits"): so every check must convict it, on either side.
    case.model.compile(optimizer=tf.keras.optimizers.SGD(learning_rate=0.0), loss="mse")
    before = [v.numpy().copy() for v in case.model.variables]
    callback = GradientCallback(tmp_path, check_every_n_steps=1, check_data=(x, y))
    case.model.fit(x, y, batch_size=8, epochs=4, shuffle=False, verbose=0, callbacks=[callback])  # 2 steps an epoch
    assert all(np.array_equal(a, b.numpy()) for a, b in zip(before, case.model.variables))
    status, recheck = (metadata.CHECK_COLUMNS.index(c) for c in ("status", "float64_recheck"))
    records = read_events(tmp_path / "train", kind="check")
    verdicts = [[metadata.CHECK_STATUSES[int(c)] for c in matrix[:, status]] for _, matrix, _ in records]
    sources = [[metadata.CHECK_RECHECKS[int(c)] for c in matrix[:, recheck]] for _, matrix, _ in records]
    assert len(records) == 8
    assert all(v == ["ok", "mismatch", "ok"] for v in verdicts), verdicts  # rows: dense_0, dense_1, head
    # The correct rows' ok is the twin's; dense_1 is the twin's wherever float32 did not convict it.
    assert all(s[0] == s[2] == "float64" for s in sources), sources


def test_check_gradients_without_a_twin_leaves_open_rows_open_and_with_one_settles_them():
    case, _ = check_models.planted("bias_mean")
    case.reseed(0)
    alone = check(case, 0)
    assert alone.layers[1].status == "inconclusive" and alone.layers[1].float64_recheck == "unavailable"
    assert "pass twin=" in alone.layers[1].reason
    twin = case.float64()
    sync_twin(case.model, twin.model)
    twin.x.assign(tf.cast(case.x, tf.float64))
    twin.y.assign(tf.cast(case.y, tf.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settled = check_gradients(case.loss, case.variables, seed=0, twin=(twin.loss, twin.variables))
    assert settled.layers[1].status == "mismatch" and settled.layers[1].float64_recheck == "float64"
    assert [r.status for r in settled.layers if r.name != "dense_1"] == ["ok", "ok"]
    assert check(case, 0, dtype="float32").layers[1].float64_recheck == "none"


def test_float64_twin_rejects_what_it_cannot_clone():
    with pytest.raises(TypeError, match="Expected a keras.Model. Received: int"):
        float64_twin(3)

    class Subclassed(tf.keras.Model):
        def call(self, x):
            return x

    with pytest.raises(TypeError, match="Sequential or functional"):
        float64_twin(Subclassed())


class NaiveLogSumExp(tf.keras.layers.Layer):
    """logsumexp over groups of 4 of 50 x, stable forward, backward exp(z) / sum exp(z) as written.

    Right in exact arithmetic and in float64; in float32 exp overflows once
    z > 88 and the gradient is Inf / Inf = NaN: a bug of float32 only.
    """

    def call(self, x):
        z = 50.0 * tf.reshape(x, [-1, x.shape[-1] // 4, 4])

        @tf.custom_gradient
        def lse(z):
            def grad(dy):
                e = tf.exp(z)
                return dy[..., None] * e / tf.reduce_sum(e, -1, keepdims=True)

            return tf.reduce_logsumexp(z, axis=-1), grad

        return lse(z)


class CancellingNorm(tf.keras.layers.Layer):
    """Normalises x + 4000 over its last axis; the backward pass takes the variance as E[x^2] - E[x]^2.

    Exact in float64; in float32 the two terms (~1.6e7, an ulp of 2) cancel
    to a variance of a few with an error of about one, and the gradient is
    tens of percents off.
    """

    def call(self, x):
        x = x + 4000.0

        @tf.custom_gradient
        def norm(x):
            mean = tf.reduce_mean(x, -1, keepdims=True)
            inv = tf.math.rsqrt(tf.reduce_mean(tf.square(x - mean), -1, keepdims=True) + 1e-3)

            def grad(dy):
                var = tf.reduce_mean(tf.square(x), -1, keepdims=True) - tf.square(mean)
                inv_b = tf.math.rsqrt(tf.maximum(var, 0.0) + 1e-3)
                xh = (x - mean) * inv_b
                return inv_b * (
                    dy - tf.reduce_mean(dy, -1, keepdims=True) - xh * tf.reduce_mean(dy * xh, -1, keepdims=True)
                )

            return (x - mean) * inv, grad

        return norm(x)


def _with(layer, seed=0):
    tf.keras.utils.set_random_seed(seed)
    inputs = tf.keras.Input((8,))
    hidden = layer(tf.keras.layers.Dense(16, name="dense_0")(inputs))
    return tf.keras.Model(inputs, tf.keras.layers.Dense(1, name="head")(tf.keras.layers.Activation("tanh")(hidden)))


@pytest.mark.parametrize("layer", [CancellingNorm, NaiveLogSumExp])
def test_a_bug_of_float32_arithmetic_is_a_mismatch_of_the_twin_check_too(layer):
    """The twin's check alone is right about the function and blind to float32: float32_gap holds the two gradients."""
    from tb_gradcheck.keras import float32_gap

    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 8)).astype(np.float32) * 3.0  # NaiveLogSumExp: z = 50 h passes 88 somewhere
    y = rng.normal(size=(16, 1)).astype(np.float32)
    model = _with(layer(name="layer"))
    twin = float64_twin(model)
    sync_twin(model, twin)
    x64, y64 = tf.cast(x, tf.float64), tf.cast(y, tf.float64)

    def twin_loss():
        return tf.reduce_mean(tf.square(twin(x64, training=False) - y64))

    def model_loss():
        return tf.reduce_mean(tf.square(model(x, training=False) - y))

    report = check_gradients(twin_loss, twin.trainable_variables, seed=0)
    assert report.ok, str(report)  # right in float64
    gapped = float32_gap(report, model_loss, model.trainable_variables, twin_loss, twin.trainable_variables)
    rows = {r.name: r for r in gapped.layers}
    assert rows["dense_0"].status == "mismatch", str(gapped)
    assert "the float64 twin's" in rows["dense_0"].reason and rows["dense_0"].relative_error > 0.05
    assert rows["head"] == {r.name: r for r in report.layers}["head"]  # its gradient does not pass through the layer


def test_callback_twin_check_holds_the_models_own_gradient_against_float64(tmp_path):
    """Trained on small inputs (finite gradients), checked on large ones: the float32 gradient overflows, float64 not."""
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 8)).astype(np.float32), rng.normal(size=(32, 1)).astype(np.float32)
    model = _with(NaiveLogSumExp(name="lse"))
    model.compile(optimizer="sgd", loss="mse")
    check_data = (x[:16] * 3.0, y[:16])
    callback = GradientCallback(tmp_path, check_every_n_steps=2, check_data=check_data, check_dtype="float64")
    model.fit(x * 0.01, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    assert all(np.isfinite(w).all() for w in model.get_weights())
    records = read_events(tmp_path / "train", kind="check")
    assert [s for s, _, _ in records] == [2, 4]
    status, column = metadata.CHECK_STATUSES, metadata.CHECK_COLUMNS.index("status")
    for _, matrix, _ in records:
        dense_0, head = (status[int(s)] for s in matrix[:, column])
        assert dense_0 == "mismatch" and head != "mismatch"


class MaskForgottenInBackward(tf.keras.layers.Layer):
    """In training, multiplies by a fixed 0/2 mask whose backward pass forgets it (passes dy through); identity otherwise.

    The inference-mode gradient is right, so a check with training=False
    cannot see the bug that every training step applies.
    """

    def call(self, x, training=False):
        if not training:
            return x
        mask = tf.constant(np.tile([0.0, 2.0], x.shape[-1] // 2), x.dtype)

        @tf.custom_gradient
        def masked(x):
            return x * mask, lambda dy: dy

        return masked(x)


@pytest.mark.parametrize("check_training", [False, True])
def test_callback_checks_the_training_mode_gradient_when_asked(tmp_path, check_training):
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(32, 8)).astype(np.float32), rng.normal(size=(32, 1)).astype(np.float32)
    model = _with(MaskForgottenInBackward(name="mask"))
    model.compile(optimizer="sgd", loss="mse")
    callback = GradientCallback(
        tmp_path, check_every_n_steps=2, check_data=(x[:16], y[:16]), check_training=check_training
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # restoring the state each evaluation writes is not news here
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    status, column = metadata.CHECK_STATUSES, metadata.CHECK_COLUMNS.index("status")
    for _, matrix, _ in read_events(tmp_path / "train", kind="check"):
        dense_0, head = (status[int(s)] for s in matrix[:, column])
        assert (dense_0 == "mismatch") is check_training and head != "mismatch"
    with pytest.raises(TypeError, match="Expected `check_training` to be True or False. Received: str 'yes'"):
        GradientCallback(tmp_path, check_training="yes")


def test_training_mode_check_of_a_correct_model_with_dropout_and_batch_norm_never_mismatches(tmp_path):
    """Dropout draws the same masks at every evaluation (its seed is put back), BatchNorm's batch statistics are exact."""
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=(32, 8)).astype(np.float32), rng.normal(size=(32, 1)).astype(np.float32)
    tf.keras.utils.set_random_seed(1)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((8,)),
            tf.keras.layers.Dense(16, activation="tanh", name="dense_0"),
            tf.keras.layers.BatchNormalization(name="bn"),
            tf.keras.layers.Dropout(0.3),
            tf.keras.layers.Dense(1, name="head"),
        ]
    )
    model.compile(optimizer="sgd", loss="mse")
    callback = GradientCallback(tmp_path, check_every_n_steps=1, check_data=(x[:16], y[:16]), check_training=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[callback])
    status, column = metadata.CHECK_STATUSES, metadata.CHECK_COLUMNS.index("status")
    records = read_events(tmp_path / "train", kind="check")
    assert len(records) == 4
    for _, matrix, _ in records:
        statuses = [status[int(s)] for s in matrix[:, column]]
        assert "mismatch" not in statuses and "ok" in statuses, statuses
