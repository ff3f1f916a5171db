"""check_verdict: the rules that decide ok / mismatch / inconclusive, as tables of measured numbers (no loss evaluated)."""

import math
import sys

import pytest

from tb_gradcheck.check import report
from tb_gradcheck.check import verdict
from tb_gradcheck.check.report import BLOCK
from tb_gradcheck.check.report import GRADIENT
from tb_gradcheck.check.report import RANDOM
from tb_gradcheck.check.report import ZERO_SET

SIGMA = 1e-7  # rounding noise of one loss evaluation, as in a float32 loss of ~1
H = 1e-3
# The rounding part of the error bar at this step: 6 sigma / (sqrt(2) h).
NOISE = 6 * SIGMA / (math.sqrt(2) * H)


def m(a, n, direction=GRADIENT, odd=0.0, even=0.0, h=H, finite=True, unmoved=False, gradient_finite=True):
    return {
        "direction": direction,
        "h": h,
        "a": a,
        "n": n,
        "odd": odd,
        "even": even,
        "finite": finite,
        "unmoved": unmoved,
        "no_gradient": a == 0,
        "gradient_finite": gradient_finite,
    }


# Each case: measurement, tolerance, reference, expected status, a word the reason must hold ("" for none).
JUDGE_CASES = [
    # Resolved and within the tolerance.
    (m(1.0, 1.001), 0.01, 0.0, "ok", ""),
    # 3% off with an error bar of 4e-4: a mismatch.
    (m(1.03, 1.0), 0.01, 0.0, "mismatch", ""),
    # Sign flipped.
    (m(-1.0, 1.0), 0.01, 0.0, "mismatch", ""),
    # 3% off, but a fourth difference far above its noise: a kink may explain it.
    (m(1.03, 1.0, even=1e-3), 0.01, 0.0, "inconclusive", "kink"),
    # The odd residual (curvature) makes the bar 2 * 0.02 = 4%: undecided, and it says curvature.
    (m(1.03, 1.0, odd=0.02), 0.01, 0.0, "inconclusive", "curvature"),
    # Both derivatives below the rounding part of the bar: the noise floor.
    (m(1e-5, 2e-5), 0.01, 0.0, "inconclusive", "noise floor"),
    # Resolved (2.4e-1 against a rounding bar of 4.2e-3 at a step of 1e-4)
    # but the bar is over 1% of it: the error bound is the cause, not noise.
    (m(0.237, 0.2368, h=1e-4), 0.01, 0.0, "inconclusive", "exceeds the tolerance"),
    # A narrow bar (4e-4) but a difference of 1.0% against a 1% tolerance:
    # the error is about the tolerance's size, not the bar too wide.
    (m(1.0101, 1.0), 0.01, 0.0, "inconclusive", "either side"),
    # A blind-spot probe (zero analytic derivative by construction): a
    # resolved numeric derivative is a mismatch, however small against the reference...
    (m(1e-9, 2e-3, direction=BLOCK), 0.01, 1.0, "mismatch", ""),
    # ...and one within its bar is ok against the reference.
    (m(1e-9, 1e-4, direction=ZERO_SET), 0.01, 1.0, "ok", ""),
    # Nothing moved, nothing predicted: no dependence.
    (m(0.0, 0.0, direction=ZERO_SET, unmoved=True), 0.01, 1.0, "ok", "no dependence"),
    # A non-finite loss at a perturbed point decides nothing.
    (m(1.0, math.nan, finite=False), 0.01, 0.0, "inconclusive", "not finite"),
    # A non-finite analytic gradient of a finite loss is wrong.
    (m(math.nan, 1.0, gradient_finite=False), 0.01, 0.0, "mismatch", "not finite"),
]


@pytest.mark.parametrize("measured, tolerance, reference, status, word", JUDGE_CASES)
def test_judge_decides_each_case_of_the_table(measured, tolerance, reference, status, word):
    probe = verdict.judge(measured, SIGMA, tolerance, reference)
    assert probe.status == status, probe
    assert word in probe.reason, probe.reason


def test_judge_never_says_noise_floor_for_a_derivative_far_above_it():
    # The small_init/output/bias: derivative 2.37e-1, floor 3.24e-3.
    probe = verdict.judge(m(0.237, 0.2368, h=1e-4), SIGMA, 0.01)
    assert probe.status == "inconclusive" and probe.error_bound > 0.01 * 0.237
    assert "noise floor" not in probe.reason and "error bound" in probe.reason


# A fourth difference of 1e-5 is 2.4x the kink threshold (5 sqrt(70) sigma)
# and adds only 5e-3 to the bar: the 3% disagreement would convict without it.
@pytest.mark.parametrize("even, expected", [(0.0, False), (1e-5, True)])
def test_blocked_by_kink_only_when_the_fourth_difference_alone_holds_back_a_conviction(even, expected):
    assert verdict.blocked_by_kink(m(1.03, 1.0, even=even), SIGMA, 0.01) is expected
    # A probe that agrees is not "blocked", kink or not.
    assert verdict.blocked_by_kink(m(1.0, 1.0, even=even), SIGMA, 0.01) is False


def test_error_bound_grows_with_each_residual_and_shrinks_with_the_step():
    base, _, _ = verdict.error_bound(m(1.0, 1.0), SIGMA)
    assert base == pytest.approx(NOISE)
    assert verdict.error_bound(m(1.0, 1.0, odd=1e-3), SIGMA)[0] == pytest.approx(NOISE + 2e-3)
    assert verdict.error_bound(m(1.0, 1.0, even=1e-6), SIGMA)[0] == pytest.approx(NOISE + 0.5e-6 / H)
    assert verdict.error_bound(m(1.0, 1.0, h=2 * H), SIGMA)[0] == pytest.approx(NOISE / 2)


def probe(direction, status, a=1.0, n=1.0, bound=1e-3, reason=""):
    rel = abs(a - n) / max(abs(a), abs(n), bound)
    return report.Probe(direction, H, a, n, bound, rel, status, reason)


ROW_CASES = [
    # The gradient probe decides on its own, either way.
    ([probe(GRADIENT, "ok"), probe(RANDOM, "inconclusive")], "ok"),
    ([probe(GRADIENT, "mismatch", a=1.1), probe(RANDOM, "ok")], "mismatch"),
    # One confirmed random disagreement: conflicting evidence.
    ([probe(GRADIENT, "ok"), probe(RANDOM, "mismatch", a=1.1)], "inconclusive"),
    # Two: a mismatch.
    ([probe(GRADIENT, "ok"), probe(RANDOM, "mismatch", a=1.1), probe(RANDOM, "mismatch", a=0.9)], "mismatch"),
    # A blind-spot probe arrives as a mismatch only when confirmed twice over: it convicts.
    ([probe(GRADIENT, "ok"), probe(BLOCK, "mismatch", a=0.0, n=1e-3)], "mismatch"),
    ([probe(GRADIENT, "ok"), probe(ZERO_SET, "mismatch", a=0.0, n=1e-3)], "mismatch"),
    # An undecided blind spot does not stop "ok" (dead ReLU units revived by the step).
    ([probe(GRADIENT, "ok"), probe(ZERO_SET, "inconclusive", a=0.0, n=1e-3)], "ok"),
    # The gradient probe hesitating: inconclusive, whatever the random ones say.
    ([probe(GRADIENT, "inconclusive"), probe(RANDOM, "ok")], "inconclusive"),
    # No gradient probe (a zero gradient): ok only if every probe is.
    ([probe(RANDOM, "ok"), probe(ZERO_SET, "ok")], "ok"),
    ([probe(RANDOM, "ok"), probe(ZERO_SET, "inconclusive")], "inconclusive"),
]


@pytest.mark.parametrize("probes, status", ROW_CASES)
def test_row_verdict_decides_each_case_of_the_table(probes, status):
    row = verdict.row_verdict("layer", "layer", 10, probes, 0.01, location="layer/kernel[1, 2]")
    assert row.status == status
    # The location is reported for mismatches only.
    assert row.location == ("layer/kernel[1, 2]" if status == "mismatch" else "")


def test_power_is_the_smallest_gradient_error_that_convicts_whatever_the_rounding():
    truth = 0.2
    measured = verdict.judge(m(truth, truth), SIGMA, 0.01)  # its bar is the rounding part, NOISE
    row = verdict.row_verdict("r", "layer", 4, [measured], 0.01)
    r = row.min_detectable_error
    assert r == pytest.approx((0.01 + 2 * NOISE / truth) / 0.99)
    # A gradient too large by a fraction just above r convicts for every
    # numeric error the bar allows; at 60% of r some such error hides it.
    for error in (-0.999 * NOISE, 0.0, 0.999 * NOISE):
        assert verdict.judge(m(truth * (1 + 1.01 * r), truth + error), SIGMA, 0.01).status == "mismatch"
    assert verdict.judge(m(truth * (1 + 0.6 * r), truth + 0.999 * NOISE), SIGMA, 0.01).status != "mismatch"
    no_gradient = verdict.row_verdict("r", "layer", 4, [probe(RANDOM, "ok")], 0.01)
    assert no_gradient.min_detectable_error == math.inf


SPLIT_CASES = [
    # D = 1 measured wholly in the part, then wholly in the rest, then half and half.
    (1.0, 1.0, 0.01, 0.5, 0.5, "part"),
    (1.0, 0.0, 0.01, 0.5, 0.5, "rest"),
    (1.0, 0.5, 0.01, 0.5, 0.5, "both"),
    # An error bar over a quarter of D cannot tell.
    (1.0, 1.0, 0.3, 0.5, 0.5, None),
    # A share within the tolerance of its side's own derivative is no fault there.
    (1.0, 0.995, 0.001, 0.5, 40.0, "part"),
]


@pytest.mark.parametrize("discrepancy, part, error, a_part, a_rest, side", SPLIT_CASES)
def test_split_tells_which_half_holds_the_discrepancy(discrepancy, part, error, a_part, a_rest, side):
    assert verdict.split(discrepancy, part, error, a_part, a_rest, 0.01) == side


def test_report_types_and_decisions_import_no_tensorflow():
    # The report types and the decisions are plain data and arithmetic: the
    # tab's side and these table tests need no TensorFlow.
    assert "tensorflow" not in report.__dict__ and "tensorflow" not in verdict.__dict__
    for module in (report, verdict):
        with open(module.__file__) as f:
            source = f.read()
        assert "import tensorflow" not in source, module.__name__


def test_default_tolerance_keeps_three_error_bars_in_float64():
    from tb_gradcheck.tensorflow.check import DEFAULT_TOLERANCE
    from tb_gradcheck.tensorflow.check import default_tolerance

    assert default_tolerance(2.0**-24) == DEFAULT_TOLERANCE
    assert default_tolerance(2.0**-53) == pytest.approx(DEFAULT_TOLERANCE * 2.0**-14.5)
    assert default_tolerance(2.0**-11) == DEFAULT_TOLERANCE  # float16: never looser
    assert "tensorflow" in sys.modules  # checks itself does import it
