"""Probes of the gradient check: directions, steps and loss evaluations along them; numpy over an Evaluator."""

import dataclasses
import math

import numpy as np

from tb_gradcheck import check_verdict
from tb_gradcheck.check_report import GRADIENT, INCONCLUSIVE, MISMATCH, RANDOM


# The step h is chosen so that the expected rounding error of the central
# difference, sigma / (sqrt(2) h), is sqrt(u) of |<g, d>| (u: unit roundoff;
# float32 2.4e-4, float64 1.5e-8). For a loss of relative noise u this puts
# the relative step near sqrt(u) too: the perturbation is then ~1/sqrt(u)
# ulps of each parameter (its own rounding is a sqrt(u) effect, and is
# measured exactly anyway), truncation is O(h^2) ~ u, and the error bar E,
# ~14x the rounding error (see check_verdict.error_bound), is 0.3% of the derivative in
# float32 and 2e-7 in float64: inside DEFAULT_TOLERANCE either way. The
# central-difference optimum u^(1/3) would be larger still; a smaller step
# makes ReLU kinks inside it rarer, which matters more here.
def _target_noise(unit):
    return math.sqrt(unit)


# Rounding noise is measured, not guessed: the loss is evaluated at this many
# points that differ from theta by a few units in the last place of every
# parameter (see _measure_noise). 8 points give 7 degrees of freedom: the
# estimate falls below a third of the true sigma with probability ~1e-4.
_NOISE_SAMPLES = 8
# Relative size of those perturbations, in units of the parameter dtype's
# roundoff: enough to change the low bits of every product that follows.
_NOISE_ULPS = 16.0
# Bounds on the step, relative to the row's scale (the norm of its
# parameters; see RowParams): at least
# 2**10 units of roundoff, so that theta + h d differs from theta in most
# elements (the perturbation actually applied is measured exactly anyway), and
# at most 1%, beyond which a "derivative" says little about the point.
_MIN_STEP_ULPS = 2.0**10
_MAX_RELATIVE_STEP = 1e-2

# A random probe's mismatch is re-measured at h / _CONFIRM_RATIO (see confirm).
_CONFIRM_RATIO = 8.0


def measure_noise(evaluator, checked, theta, grads, units, f0, rng):
    """The rounding noise sigma of one loss evaluation, measured.

    Every parameter is moved by +-_NOISE_ULPS units of roundoff (random
    signs), _NOISE_SAMPLES times. That changes the low bits of every product
    downstream, so each evaluation carries fresh rounding error, while the
    loss itself moves only by <g, delta> (known; second order is ~u^2) and a
    ReLU kink can only matter for a pre-activation within ~1e-6 of zero,
    where its effect is far below one rounding. So f(theta + delta) - <g,
    delta> is f(theta) plus independent noise, and its sample standard
    deviation estimates sigma. (The fourth differences of the probes measure
    noise too, but a kink anywhere in a ReLU net inflates them.)
    """
    values = []
    try:
        for _ in range(_NOISE_SAMPLES):
            linear = 0.0
            for v, t, g, u in zip(checked, theta, grads, units):
                signs = rng.integers(0, 2, size=t.shape) * 2.0 - 1.0
                value = (t * (1.0 + signs * (_NOISE_ULPS * u))).astype(v.dtype.as_numpy_dtype)
                v.assign(value)
                if g is not None:
                    linear += float(np.sum(g * (value.astype(np.float64) - t)))
            values.append(evaluator.loss() - linear)
    finally:
        for v in checked:
            evaluator.reset(v)
    values = np.array(values)
    if not np.all(np.isfinite(values)):
        return 0.0
    return float(np.std(values, ddof=1))


class RowParams:
    """The variables of one row, their saved values and analytic gradients (float64)."""

    def __init__(self, variables, theta, grads, typical):
        self.variables = variables
        self.theta = theta
        self.missing = [g is None for g in grads]
        self.grads = [np.zeros_like(t) if g is None else g for t, g in zip(theta, grads)]
        self.size = int(sum(t.size for t in theta))
        self.grad_norm = math.sqrt(sum(float(np.sum(g * g)) for g in self.grads))
        norm = math.sqrt(sum(float(np.sum(t * t)) for t in theta))
        # The step bounds are relative to this. A bias that happens to be near
        # zero (or a fresh one, all zeros) has no scale of its own: it borrows
        # the typical magnitude of the model's parameters.
        self.scale = max(norm, math.sqrt(self.size) * typical)

    def direction(self, k, rng):
        """Probe k's unit direction: the analytic gradient for k == 0 (when usable), else Gaussian."""
        if k == 0 and self.grad_norm > 0 and math.isfinite(self.grad_norm):
            return [g / self.grad_norm for g in self.grads], GRADIENT
        d = [rng.standard_normal(t.shape) for t in self.theta]
        norm = math.sqrt(sum(float(np.sum(x * x)) for x in d))
        return [x / norm for x in d], RANDOM

    def dot(self, vectors):
        return sum(float(np.sum(g * v)) for g, v in zip(self.grads, vectors))

    def restore(self, evaluator):
        for v in self.variables:
            evaluator.reset(v)


def measure(evaluator, row, direction, kind, f0, sigma, unit, epsilon, step=None):
    """Evaluates the loss at -2h, -h, +h, +2h along ``direction``; returns the raw numbers."""
    a_prior = row.dot(direction)
    h_min = _MIN_STEP_ULPS * unit * row.scale
    h_max = _MAX_RELATIVE_STEP * row.scale
    if step is not None:
        h = step
    elif epsilon is not None:
        h = epsilon * row.scale
    elif a_prior != 0 and math.isfinite(a_prior):
        # Expected rounding error of the central difference: sigma / (sqrt(2) h)
        # (two independent errors of sigma, divided by 2h). Setting it to
        # sqrt(u) * |a| gives the smallest step that resolves the
        # derivative to that precision: truncation (~h^2) and the chance of a
        # kink within the step (~h) are then as small as the noise allows.
        h = sigma / (math.sqrt(2.0) * _target_noise(unit) * abs(a_prior))
        h = min(max(h, h_min), h_max)
    else:
        h = h_max
    f, deltas = {}, {}
    for t in (1, -1, 2, -2):
        deltas[t] = evaluator.perturb(row.variables, row.theta, direction, t * h)
        f[t] = evaluator.loss()
    values = [f0, f[1], f[-1], f[2], f[-2]]
    finite = all(math.isfinite(x) for x in values)

    def diff(p, m):
        return [dp - dm for dp, dm in zip(deltas[p], deltas[m])]

    # The perturbation actually applied is fl(theta + t h d) - theta, not
    # t h d: float32 rounds each element. Using the applied perturbations in
    # the analytic side removes that error exactly (the subtraction is exact
    # in float64), so the comparison is between f(theta + delta+) -
    # f(theta + delta-) and <g, delta+ - delta->.
    a1 = row.dot(diff(1, -1)) / (2 * h)
    a2 = row.dot(diff(2, -2)) / (4 * h)
    n1 = (f[1] - f[-1]) / (2 * h) if finite else math.nan
    n2 = (f[2] - f[-2]) / (4 * h) if finite else math.nan
    # Odd residual: for a smooth loss D(h) = a + c h^2 + O(h^4), so
    # D(2h) - D(h) = 3 c h^2: the truncation of D(h) is a third of it. Each
    # side subtracts its own analytic value, so an error in g cancels here.
    odd = (n2 - a2) - (n1 - a1)
    # Even residual: the fourth difference f(2h) - 4f(h) + 6f(0) - 4f(-h) +
    # f(-2h) is h^4 f'''' for a smooth loss (negligible at these steps), so
    # what remains is rounding noise (70 sigma^2 in variance) or a kink. The
    # applied perturbations are not exactly collinear; their first-order
    # effect is removed with g (a rounding-sized term, so an error in g
    # changes it by a rounding-sized fraction of itself).
    combo = [d2 + dm2 - 4 * (d1 + dm1) for d2, dm2, d1, dm1 in zip(deltas[2], deltas[-2], deltas[1], deltas[-1])]
    even = (f[2] + f[-2] - 4 * (f[1] + f[-1]) + 6 * f0 - row.dot(combo)) if finite else math.nan
    unmoved = finite and all(x == f0 for x in values[1:])
    return {
        "direction": kind,
        "h": h,
        "a": a1,
        "n": n1,
        "odd": odd,
        "even": even,
        "finite": finite,
        "unmoved": unmoved,
        "no_gradient": all(row.missing) or row.grad_norm == 0,
        "gradient_finite": math.isfinite(row.grad_norm),
    }




def confirm(evaluator, row, direction, probe, f0, sigma, unit, tolerance):
    """Re-measures a random probe's mismatch at step h/8; it stands only if it convicts there too.

    Along a random direction of a wide ReLU layer the directional derivative
    is an incoherent sum (~|g|/sqrt(n)) and a handful of kinks within the
    step moves the central difference by percents while D(h) and D(2h) still
    agree: no residual-based bound holds there (in float64, without any
    rounding, 3-8% of such probes break it). Kinks within h/8 are a small
    subset of those within h, so requiring the verdict at both steps cuts
    that to ~0.3%, and check_verdict.row_verdict asks for two such random convictions.
    """
    again = check_verdict.judge(measure(evaluator, row, direction, RANDOM, f0, sigma, unit, None, step=probe.step / _CONFIRM_RATIO),
                   sigma, tolerance)
    if again.status == MISMATCH:
        return dataclasses.replace(probe, reason=f"confirmed at step h/{_CONFIRM_RATIO:g}")
    return dataclasses.replace(
        probe, status=INCONCLUSIVE,
        reason=f"disagrees at step h but not at h/{_CONFIRM_RATIO:g}: the loss is not smooth on the scale of the step",
    )

