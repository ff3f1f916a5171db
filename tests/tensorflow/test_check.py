"""check_gradients: detection over 25 seeds, agreement with tf.test.compute_gradient, state, errors, report."""

import json
import warnings

import numpy as np
import pytest
import tensorflow as tf

import check_models
from tb_gradcheck import check_gradients

# 25 seeds keep this file near a minute; benchmarks/check_power.py runs many more.
SEEDS = range(25)
MOST = 0.95 * len(SEEDS)


def statuses(report, granularity="layer"):
    rows = report.layers if granularity == "layer" else report.variables
    return {r.name: r.status for r in rows}


def run_seeds(case, granularity="layer", **kwargs):
    """Checks ``case`` redrawn at every seed; returns ``{row name: [status per seed]}``."""
    out = {}
    for seed in SEEDS:
        report = check_gradients(case.reseed(seed).loss, case.variables, seed=seed, granularity=granularity, **kwargs)
        for row in report.rows:
            out.setdefault(row.name, []).append(row.status)
    # One trace for the whole loop: the loop costs evaluations, not tracing.
    assert case.loss.experimental_get_tracing_count() == 1
    return out


# -- the acceptance: detection and no false alarms over many seeds ----------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_layer_gradient_wrong_by_3_percent_is_the_only_mismatch_for_every_seed(dtype):
    case = check_models.mlp((8, 16, 16, 1), dtype=dtype, wrong_layer=1, factor=1.03)
    found = run_seeds(case)
    assert found["mlp/dense_1"] == ["mismatch"] * len(SEEDS)
    for name in ("mlp/dense_0", "mlp/dense_2"):
        assert "mismatch" not in found[name], name
        # The correct layers are confirmed, not merely not convicted: a check
        # that answered "inconclusive" everywhere would pass the line above.
        assert found[name].count("ok") >= MOST, (name, found[name].count("ok"))


@pytest.mark.parametrize(
    "make",
    [lambda: check_models.mlp((8, 16, 16, 1)), lambda: check_models.cnn()],
    ids=["tanh_mlp", "small_cnn"],
)
def test_correct_smooth_models_never_mismatch_over_the_seeds_in_float32(make):
    found = run_seeds(make())
    for name, seen in found.items():
        assert "mismatch" not in seen, name
        assert seen.count("ok") >= MOST, (name, seen.count("ok"))


@pytest.mark.parametrize(
    "sizes, batch",
    [((10, 10, 10, 1), 32), ((10, 1000, 1), 32)],
    ids=["relu_10_10_10_1", "relu_10_1000_1"],
)
def test_relu_networks_give_no_false_mismatch_over_the_seeds(sizes, batch):
    case = check_models.mlp(sizes, activation="relu", batch=batch, bias_scale=0.0)
    found = run_seeds(case, granularity="variable")
    for name, seen in found.items():
        assert "mismatch" not in seen, name
    # Kinks make some rows inconclusive; most must still be decided.
    total = sum(len(s) for s in found.values())
    assert sum(s.count("ok") for s in found.values()) >= 0.8 * total


def test_relu_network_with_a_wrong_layer_flags_that_layer_only():
    case = check_models.mlp((10, 10, 10, 1), activation="relu", batch=32, wrong_layer=1, factor=1.03)
    found = run_seeds(case)
    assert found["mlp/dense_1"].count("mismatch") >= MOST
    assert "mismatch" not in found["mlp/dense_0"] + found["mlp/dense_2"]


def test_inconclusive_rows_say_why():
    case = check_models.mlp((10, 10, 10, 1), activation="relu", batch=32, bias_scale=0.0)
    reasons = set()
    for seed in range(30):
        report = check_gradients(case.reseed(seed).loss, case.variables, seed=seed, granularity="variable")
        reasons.update(r.reason for r in report.inconclusive)
        for row in report.rows:
            if row.status != "inconclusive":
                assert row.reason == "" or row.status == "ok", row
    causes = (
        "kink",
        "noise floor",
        "random direction",
        "exceeds the tolerance",
        "second one does not",
        "not differentiable",
    )
    assert reasons and all(any(c in r for c in causes) for r in reasons), reasons


# -- agreement with tf.test.compute_gradient --------------------------------------


def _tiny(dtype, factor):
    """A 3 -> 2 tanh layer as a function of (kernel, bias), kernel gradient scaled by ``factor``."""
    rng = np.random.default_rng(7)
    x = tf.constant(rng.normal(size=(5, 3)), dtype)
    c = tf.constant(rng.normal(size=(5, 2)), dtype)

    def f(kernel, bias):
        @tf.custom_gradient
        def matmul(a, w):
            def grad(dy):
                return tf.matmul(dy, w, transpose_b=True), factor * tf.matmul(a, dy, transpose_a=True)

            return tf.matmul(a, w), grad

        return tf.reduce_sum(tf.tanh(matmul(x, kernel) + bias) * c)

    layer = tf.keras.layers.Dense(2, name="tiny", dtype=dtype)
    layer.build((None, 3))
    layer.kernel.assign(rng.normal(size=(3, 2)))
    layer.bias.assign(rng.normal(size=(2,)) * 0.1)
    return f, layer


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("factor", [1.0, 1.03], ids=["correct", "wrong_by_3_percent"])
def test_agrees_with_tf_test_compute_gradient_on_a_tiny_layer(dtype, factor):
    f, layer = _tiny(dtype, factor)
    theoretical, numerical = tf.test.compute_gradient(f, [layer.kernel.numpy(), layer.bias.numpy()])
    j_t = np.concatenate([j.ravel() for j in theoretical]).astype(np.float64)
    j_n = np.concatenate([j.ravel() for j in numerical]).astype(np.float64)

    report = check_gradients(
        lambda: f(tf.convert_to_tensor(layer.kernel), tf.convert_to_tensor(layer.bias)),
        layer.trainable_variables,
        seed=0,
    )
    (row,) = report.layers
    probe = row.probes[0]
    assert probe.direction == "gradient"  # along g = J_t / |J_t|, so both sides are known exactly
    # The analytic side is the same backward pass, taken along the applied
    # perturbation fl(theta + h d) - theta, which differs from h d by one
    # rounding of each parameter: relative u / (relative step) ~ sqrt(u), i.e.
    # 1.5e-8 in float64 and 2.4e-4 in float32 (averaging down over elements).
    exact = 1e-7 if dtype == "float64" else 1e-3
    assert probe.analytic == pytest.approx(np.linalg.norm(j_t), rel=exact)
    # The numeric side against compute_gradient's full numeric Jacobian along
    # the same direction. compute_gradient's fixed step 2**-10 has truncation
    # ~1e-7 relative here; in float32 its rounding error is ~1e-7 / 1e-3 per
    # element. So: 1e-5 relative in float64, and our own error bound plus
    # compute_gradient's rounding in float32.
    theirs = j_n @ (j_t / np.linalg.norm(j_t))
    if dtype == "float64":
        assert probe.numeric == pytest.approx(theirs, rel=1e-5)
    else:
        assert abs(probe.numeric - theirs) <= probe.error_bound + 1e-3 * abs(theirs)
    their_error = np.max(np.abs(j_t - j_n)) / np.max(np.abs(j_t))
    if factor == 1.0:
        assert their_error < 1e-3 and row.status == "ok"
    else:
        assert their_error > 0.01 and row.status == "mismatch"
        # Along g, |a - n| / a = 1 - <J_n, J_t> / |J_t|^2: the same number both ways.
        expected = 1 - (j_n @ j_t) / (j_t @ j_t)
        assert probe.relative_error == pytest.approx(expected, rel=0.05 if dtype == "float32" else 1e-3)


# -- nothing is lost ----------------------------------------------------------------


def _bn_model():
    tf.keras.utils.set_random_seed(3)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((4,)),
            tf.keras.layers.Dense(8, activation="tanh", name="dense"),
            tf.keras.layers.BatchNormalization(name="bn"),
            tf.keras.layers.Dense(1, name="out"),
        ],
        name="net",
    )
    x = tf.random.stateless_normal((16, 4), seed=[1, 2])
    y = tf.random.stateless_normal((16, 1), seed=[3, 4])
    # Non-default moving statistics, so restoring "to the initial values" by
    # accident would show.
    model.get_layer("bn").moving_mean.assign(tf.fill([8], 0.25))
    return model, x, y


def _bits(variables):
    return [np.array(v.numpy()).tobytes() for v in variables]


def test_every_variable_is_bit_identical_after_a_check_and_nothing_warns_in_inference_mode():
    model, x, y = _bn_model()
    before = _bits(model.variables)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        report = check_gradients(
            lambda: tf.reduce_mean((model(x, training=False) - y) ** 2),
            model.trainable_variables,
            seed=0,
            granularity="variable",
        )
    assert _bits(model.variables) == before
    assert [r.name for r in report.layers] == ["net/dense", "net/bn", "net/out"]


def test_batchnorm_in_training_mode_is_undone_and_warned_at_the_callers_line():
    model, x, y = _bn_model()
    before = _bits(model.variables)
    with pytest.warns(UserWarning, match="moving_mean.*moving_variance.*restored them bit for bit") as record:
        report = check_gradients(
            lambda: tf.reduce_mean((model(x, training=True) - y) ** 2), model.trainable_variables, seed=0
        )
    assert record[0].filename == __file__  # stacklevel=2: the warning points at this call
    assert _bits(model.variables) == before
    # Each evaluation saw the same moving statistics (they are put back after
    # every one), so the check is a check of one function: no mismatch.
    assert report.ok


def test_a_loss_fn_that_raises_half_way_leaves_every_variable_bit_identical():
    model, x, y = _bn_model()
    before = _bits(model.variables)
    calls = []

    def count():  # runs on every evaluation, outside the trace
        calls.append(1)
        if len(calls) == 20:
            raise RuntimeError("boom at evaluation 20")
        return np.float32(0)

    @tf.function
    def loss():
        side = tf.py_function(count, [], tf.float32)
        return tf.reduce_mean((model(x, training=True) - y) ** 2) + side

    with pytest.raises(Exception, match="boom at evaluation 20"):
        check_gradients(loss, model.trainable_variables, seed=0)
    assert len(calls) == 20  # stopped in the middle of the probes (a full check makes 45+)
    assert _bits(model.variables) == before


def test_an_untraceable_loss_fn_runs_eagerly_and_is_restored_when_it_raises():
    v = tf.Variable(np.linspace(-1, 1, 6).astype(np.float32), name="w")
    before = _bits([v])
    calls = []

    def loss():
        calls.append(1)
        value = tf.reduce_sum(tf.sin(v) ** 2)
        if float(value.numpy()) < -1 or len(calls) == 15:  # .numpy(): not traceable
            raise ValueError("stop at call 15")
        return value

    with pytest.warns(UserWarning, match="could not be traced"):
        with pytest.raises(ValueError, match="stop at call 15"):
            check_gradients(loss, [v], seed=0)
    assert _bits([v]) == before

    calls.clear()
    calls.extend([1] * 100)  # past 15: this time it does not raise
    with pytest.warns(UserWarning, match="evaluating it eagerly"):
        report = check_gradients(loss, [v], seed=0)
    assert report.layers[0].status == "ok" and _bits([v]) == before


def test_tensorfloat32_is_off_during_every_evaluation_and_restored_after():
    # TF32 rounds matmul inputs to 10 mantissa bits, coarser than the float32
    # step, on GPUs that have it; the flag is honoured (as a flag) everywhere.
    seen = []
    v = tf.Variable([0.5, -1.5], name="v")

    def flag():
        seen.append(tf.config.experimental.tensor_float_32_execution_enabled())
        return np.float32(0)

    loss = tf.function(lambda: tf.reduce_sum(tf.tanh(v)) + tf.py_function(flag, [], tf.float32))
    for before in (True, False):
        tf.config.experimental.enable_tensor_float_32_execution(before)
        seen.clear()
        check_gradients(loss, [v], seed=0)
        assert seen and not any(seen)
        assert tf.config.experimental.tensor_float_32_execution_enabled() is before
    tf.config.experimental.enable_tensor_float_32_execution(True)
    with pytest.raises(TypeError):
        check_gradients(tf.function(lambda: tf.constant(1)), [v])
    assert tf.config.experimental.tensor_float_32_execution_enabled() is True


# -- cost, determinism, the report -----------------------------------------------------


def test_cost_is_a_fixed_number_of_evaluations_per_layer_whatever_the_width():
    counts = []
    for width in (4, 400):
        case = check_models.mlp((8, width, 1)).reseed(0)
        report = check_gradients(case.loss, case.variables, seed=0, probes=3)
        assert report.ok
        counts.append(report.evaluations)
    # f(theta), 8 noise points, 4 points per probe (no confirmations on a correct model).
    assert counts == [1 + 8 + 4 * 3 * 2] * 2


def test_same_seed_same_report_and_another_seed_other_directions():
    case = check_models.mlp((8, 16, 1)).reseed(1)
    a = check_gradients(case.loss, case.variables, seed=5).to_dict()
    b = check_gradients(case.loss, case.variables, seed=5).to_dict()
    c = check_gradients(case.loss, case.variables, seed=6).to_dict()
    assert a == b
    assert a["layers"][0]["probes"][1] != c["layers"][0]["probes"][1]  # random probe
    assert a["layers"][0]["probes"][0] == c["layers"][0]["probes"][0]  # gradient probe: no randomness
    drawn = check_gradients(case.loss, case.variables)
    assert isinstance(drawn.seed, int) and drawn.seed >= 0  # recorded, so the run can be repeated


def test_report_table_dict_and_failures():
    case = check_models.mlp((4, 6, 1), wrong_layer=0, factor=1.1).reseed(0)
    report = check_gradients(case.loss, case.variables, seed=0, granularity="variable")
    assert not report.ok
    assert [r.name for r in report.failures] == ["mlp/dense_0", "mlp/dense_0/kernel", "mlp/dense_0/bias"]
    text = str(report)
    lines = text.splitlines()
    counts = {s: sum(r.status == s for r in report.rows) for s in ("ok", "inconclusive", "mismatch")}
    assert counts["mismatch"] == 3 and counts["ok"] >= 2
    verdict = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    assert lines[0].startswith("Gradient check: loss ") and lines[0].endswith(": " + verdict)
    for row in report.rows:
        line = next(line for line in lines if line.startswith(row.name + " "))
        assert line.split()[-1] == row.status or row.reason in line
        assert f"{row.relative_error:.2e}" in line
    data = json.loads(json.dumps(report.to_dict()))
    assert data["ok"] is False and len(data["layers"]) == 2 and len(data["variables"]) == 4
    assert [r["name"] for r in data["variables"]] == [r.name for r in report.variables]
    assert data["evaluations"] == report.evaluations and data["layers"][0]["status"] == "mismatch"
    assert {p["direction"] for p in data["layers"][0]["probes"]} == {"gradient", "random"}


def test_rows_follow_the_writers_grouping_and_order():
    from tb_gradcheck.tensorflow.variables import Rows

    case = check_models.cnn().reseed(0)
    report = check_gradients(case.loss, case.variables, seed=0, granularity="variable")
    rows = Rows(case.variables)
    assert [r.name for r in report.layers] == rows.layer_names
    assert [r.name for r in report.variables] == rows.variable_names
    assert [r.size for r in report.layers] == rows.layer_sizes


def test_epsilon_sets_the_step_relative_to_the_rows_scale():
    case = check_models.mlp((4, 6, 1)).reseed(0)
    case.model.layers[1].bias.assign([0.0])  # a row far smaller than the rest: it borrows their scale
    report = check_gradients(case.loss, case.variables, seed=0, epsilon=1e-3, granularity="variable")
    values = [v.numpy().astype(np.float64) for v in case.variables]
    typical = np.sqrt(sum(np.sum(x**2) for x in values) / sum(x.size for x in values))
    for row, x in zip(report.variables, values):
        scale = max(np.linalg.norm(x), np.sqrt(x.size) * typical)
        assert all(p.step == pytest.approx(1e-3 * scale, rel=1e-12) for p in row.probes), row.name
    assert report.variables[3].probes[0].step == pytest.approx(1e-3 * typical, rel=1e-12)


# -- special values ---------------------------------------------------------------------


def test_variable_the_loss_does_not_read_is_ok_with_zero_on_both_sides():
    used = tf.Variable([1.0, 2.0], name="used")
    unused = tf.Variable([3.0], name="unused")
    report = check_gradients(tf.function(lambda: tf.reduce_sum(used**2)), [used, unused], seed=0)
    row = report.layers[1]
    assert row.name == "unused" and row.status == "ok" and row.analytic == 0 and row.numeric == 0
    assert "no dependence" in row.reason


def test_non_finite_loss_makes_every_row_inconclusive_after_one_evaluation():
    v = tf.Variable([1.0, -1.0], name="v")
    report = check_gradients(tf.function(lambda: tf.reduce_sum(tf.math.log(v))), [v], seed=0)
    assert report.evaluations == 1 and report.layers[0].status == "inconclusive"
    assert "not finite" in report.layers[0].reason


def test_nan_gradient_of_a_finite_loss_is_a_mismatch():
    v = tf.Variable([0.5, 2.0], name="v")

    @tf.custom_gradient
    def broken(x):
        return tf.reduce_sum(x**2), lambda dy: dy * np.nan * x

    report = check_gradients(tf.function(lambda: broken(v)), [v], seed=0)
    assert report.layers[0].status == "mismatch" and not report.ok


def test_nondeterministic_loss_is_never_a_mismatch():
    # Dropout in training mode draws a new mask at every evaluation: the
    # "noise" is enormous, so the check must say it cannot tell.
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((4,)),
            tf.keras.layers.Dense(8, activation="tanh"),
            tf.keras.layers.Dropout(0.5),
            tf.keras.layers.Dense(1),
        ]
    )
    x = tf.random.stateless_normal((16, 4), seed=[0, 1])
    loss = tf.function(lambda: tf.reduce_mean(model(x, training=True) ** 2))
    for seed in range(5):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the seed generator's state is restored and warned about
            report = check_gradients(loss, model.trainable_variables, seed=seed)
        assert report.ok, report


# -- bad input ------------------------------------------------------------------------------


def test_bad_arguments_raise_clear_errors():
    v = tf.Variable([1.0, 2.0], name="v")
    good = tf.function(lambda: tf.reduce_sum(v**2))
    cases = [
        (dict(loss_fn=3, variables=[v]), TypeError, r"zero-argument callable. Received: int"),
        (dict(loss_fn=good, variables=v), TypeError, r"`variables` to be a list. Received: ResourceVariable"),
        (dict(loss_fn=good, variables=[]), ValueError, r"non-empty list of variables"),
        (dict(loss_fn=good, variables=[v, v]), ValueError, r"each variable once"),
        (dict(loss_fn=good, variables=[tf.constant(1.0)]), TypeError, r"variables\[0\] of type EagerTensor"),
        (dict(loss_fn=good, variables=[v], probes=0), ValueError, r"`probes` to be a positive integer. Received: 0"),
        (dict(loss_fn=good, variables=[v], probes=True), ValueError, r"Received: True"),
        (dict(loss_fn=good, variables=[v], epsilon=2.0), ValueError, r"`epsilon` to be between 0 and 1"),
        (dict(loss_fn=good, variables=[v], epsilon="small"), TypeError, r"`epsilon` to be a number. Received: str"),
        (dict(loss_fn=good, variables=[v], tolerance=0.0), ValueError, r"`tolerance`.*Received: 0.0"),
        (dict(loss_fn=good, variables=[v], seed=-1), ValueError, r"`seed`.*Received: -1"),
        (dict(loss_fn=good, variables=[v], seed=1.5), ValueError, r"`seed`.*Received: 1.5"),
        (dict(loss_fn=good, variables=[v], granularity="neuron"), ValueError, r"'neuron'"),
        (dict(loss_fn=tf.function(lambda: v * 2), variables=[v]), ValueError, r"scalar loss. Received: shape \(2,\)"),
        (
            dict(loss_fn=tf.function(lambda: tf.constant(3)), variables=[v]),
            TypeError,
            r"floating-point loss. Received: dtype int32",
        ),
        (dict(loss_fn=tf.function(lambda: (v[0], v[1])), variables=[v]), TypeError, r"Received: tuple"),
    ]
    for kwargs, error, message in cases:
        with pytest.raises(error, match=message):
            check_gradients(kwargs.pop("loss_fn"), kwargs.pop("variables"), **kwargs)
    with pytest.raises(ValueError, match="called eagerly, outside tf.function"):
        tf.function(lambda: check_gradients(good, [v]))()
    assert v.numpy().tolist() == [1.0, 2.0]
