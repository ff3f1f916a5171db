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
from tb_gradcheck import metadata
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
    with pytest.raises(ValueError, match=r"`check_dtype` to be one of \[None, 'float64'\]. Received: 'float16'"):
        GradientCallback(tmp_path, check_dtype="float16")


def test_float64_twin_rejects_what_it_cannot_clone():
    with pytest.raises(TypeError, match="Expected a keras.Model. Received: int"):
        float64_twin(3)

    class Subclassed(tf.keras.Model):
        def call(self, x):
            return x

    with pytest.raises(TypeError, match="Sequential or functional"):
        float64_twin(Subclassed())
