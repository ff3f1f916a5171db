"""Probes of the gradient check: directions, steps and loss evaluations along them; numpy over an Evaluator."""

import dataclasses
import math

import numpy as np

from tb_gradcheck.check import verdict
from tb_gradcheck.check.report import GRADIENT
from tb_gradcheck.check.report import INCONCLUSIVE
from tb_gradcheck.check.report import MISMATCH
from tb_gradcheck.check.report import RANDOM


# The step h is chosen so that the expected rounding error of the central
# difference, sigma / (sqrt(2) h), is sqrt(u) of |<g, d>| (u: unit roundoff;
# float32 2.4e-4, float64 1.5e-8). For a loss of relative noise u this puts
# the relative step near sqrt(u) too: the perturbation is then ~1/sqrt(u)
# ulps of each parameter (its own rounding is a sqrt(u) effect, and is
# measured exactly anyway), truncation is O(h^2) ~ u, and the error bar E,
# ~14x the rounding error (see verdict.error_bound), is 0.3% of the derivative in
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

# A probe that convicts only when re-measured is re-measured at h / _CONFIRM_RATIO
# (see Prober.confirm).
_CONFIRM_RATIO = 8.0
# Thorough mode cuts every variable into blocks of at most this many elements
# and probes each along a direction orthogonal to its gradient. One element
# whose gradient is off by 100% of itself (|g_i| = z times the block's RMS)
# moves such a probe by z rms / sqrt(b), against an error bar of ~2e-3 rms in
# float32 (see Prober.blind_spot): it convicts for z > ~4e-3 sqrt(b) = 0.03 at
# b = 64, i.e. for 97% of elements if z is like |N(0, 1)|. Larger blocks cost
# less (4 evaluations per block) and see less: 0.06 (95%) at 256.
BLOCK_SIZE = 64
# Blind-spot probes take a step 4x larger than the rule above would for the
# block's RMS gradient: the confirmation at h/8 (see Prober.confirm) must
# still resolve one wrong element there, whose share of the derivative is
# ~z/sqrt(b) of the RMS; at h/8 of the plain rule's step the error bar is
# ~1.6e-2 of the RMS, resolving only z > 0.26. 4x brings that to z > ~0.06
# (95% of elements). The step stays ~1e-3 of the parameters' scale in
# float32, a tenth of its cap, and kinks within it are what the h/8 re-
# measurement and the second direction are for.
_BLIND_RESOLVE = 0.25


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
                value = evaluator.write(v, t * (1.0 + signs * (_NOISE_ULPS * u)))
                if g is not None:
                    linear += float(np.sum(g * (value - t)))
            values.append(evaluator.loss() - linear)
    finally:
        for v in checked:
            evaluator.reset(v)
    values = np.array(values)
    if not np.all(np.isfinite(values)):
        return 0.0
    return float(np.std(values, ddof=1))


class RowParams:
    """The variables of one row, their names, saved values and analytic gradients (float64)."""

    def __init__(self, variables, names, theta, grads, unit, typical, typical_gradient):
        self.variables = variables
        self.names = names
        self.theta = theta
        self.unit = unit
        self.missing = [g is None for g in grads]
        self.grads = [np.zeros_like(t) if g is None else g for t, g in zip(theta, grads)]
        self.size = int(sum(t.size for t in theta))
        self.grad_norm = math.sqrt(sum(float(np.sum(g * g)) for g in self.grads))
        norm = math.sqrt(sum(float(np.sum(t * t)) for t in theta))
        # The step bounds are relative to this. A bias that happens to be near
        # zero (or a fresh one, all zeros) has no scale of its own: it borrows
        # the typical magnitude of the model's parameters.
        self.scale = max(norm, math.sqrt(self.size) * typical)
        # Elements whose analytic gradient is exactly zero (or absent).
        self.zero_masks = [g == 0 for g in self.grads]
        nonzero = self.size - int(sum(int(z.sum()) for z in self.zero_masks))
        # The size a derivative along a random unit direction has here: the
        # RMS of the row's nonzero gradient elements, or the model's when the
        # whole row is zero. Blind-spot probes, whose analytic derivative is
        # zero, take their step from it (not from their own zero derivative,
        # which would send the step to its cap).
        self.rms_gradient = self.grad_norm / math.sqrt(nonzero) if nonzero else typical_gradient

    def direction(self, k, rng):
        """Probe k's unit direction: the analytic gradient for k == 0 (when usable), else Gaussian."""
        if k == 0 and self.grad_norm > 0 and math.isfinite(self.grad_norm):
            return [g / self.grad_norm for g in self.grads], GRADIENT
        return _unit([rng.standard_normal(t.shape) for t in self.theta]), RANDOM

    def variable_directions(self):
        """Thorough mode: the gradient restricted to each variable of a multi-variable row (unit directions).

        A blind-spot probe sees no error parallel to its block's gradient (a
        bias gradient averaged instead of summed is such an error); along the
        variable's own gradient it shows in full, where the row's gradient
        probe sees it only in proportion to the variable's share of |g|^2.
        """
        if len(self.grads) < 2 or not math.isfinite(self.grad_norm):
            return []
        out = []
        for i, g in enumerate(self.grads):
            norm = math.sqrt(float(np.sum(g * g)))
            if norm > 0:
                out.append([x / norm if j == i else np.zeros_like(x) for j, x in enumerate(self.grads)])
        return out

    def has_zero_set(self):
        return math.isfinite(self.grad_norm) and any(z.any() for z in self.zero_masks)

    def blocks(self):
        """Thorough mode's blocks: ``[mask per variable]`` each, contiguous runs of <= BLOCK_SIZE elements."""
        out = []
        for i, t in enumerate(self.theta):
            if t.size < 2:
                continue  # one element has no direction orthogonal to its gradient
            for chunk in np.array_split(np.arange(t.size), math.ceil(t.size / BLOCK_SIZE)):
                masks = [np.zeros(x.shape, bool) for x in self.theta]
                masks[i].reshape(-1)[chunk] = True
                out.append(masks)
        return out

    def blind_direction(self, masks, rng):
        """Random signs over ``masks``, made orthogonal to the gradient there: its analytic derivative is 0."""
        d = [np.where(m, rng.integers(0, 2, size=m.shape) * 2.0 - 1.0, 0.0) for m in masks]
        g = [np.where(m, x, 0.0) for m, x in zip(masks, self.grads)]
        gg = sum(float(np.sum(x * x)) for x in g)
        if gg > 0:
            along = sum(float(np.sum(x * y)) for x, y in zip(g, d)) / gg
            d = [x - along * y for x, y in zip(d, g)]
        return _unit(d)

    def rms_over(self, masks):
        count = sum(int(m.sum()) for m in masks)
        gg = sum(float(np.sum(np.where(m, g, 0.0) ** 2)) for m, g in zip(masks, self.grads))
        rms = math.sqrt(gg / count) if count else 0.0
        return rms if rms > 0 else self.rms_gradient

    def dot(self, vectors):
        return sum(float(np.sum(g * v)) for g, v in zip(self.grads, vectors))

    def restore(self, evaluator):
        for v in self.variables:
            evaluator.reset(v)


def _unit(vectors):
    norm = math.sqrt(sum(float(np.sum(x * x)) for x in vectors))
    return [x / norm for x in vectors] if norm > 0 else vectors


def measure(evaluator, row, direction, kind, f0, sigma, epsilon, step=None, reference=0.0):
    """Evaluates the loss at -2h, -h, +h, +2h along ``direction``; returns the raw numbers.

    ``reference`` is a derivative size to choose the step for when the
    direction's own analytic derivative is smaller (blind-spot probes, whose
    analytic derivative is zero by construction).
    """
    a_prior = row.dot(direction)
    h_min = _MIN_STEP_ULPS * row.unit * row.scale
    h_max = _MAX_RELATIVE_STEP * row.scale
    size = max(abs(a_prior), reference)
    if step is not None:
        h = step
    elif epsilon is not None:
        h = epsilon * row.scale
    elif size > 0 and math.isfinite(size):
        # Expected rounding error of the central difference: sigma / (sqrt(2) h)
        # (two independent errors of sigma, divided by 2h). Setting it to
        # sqrt(u) * |a| gives the smallest step that resolves the
        # derivative to that precision: truncation (~h^2) and the chance of a
        # kink within the step (~h) are then as small as the noise allows.
        h = sigma / (math.sqrt(2.0) * _target_noise(row.unit) * size)
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
        "no_gradient": a1 == 0 and a2 == 0,
        "gradient_finite": math.isfinite(row.grad_norm),
    }


class Prober:
    """Runs and judges the probes of one check: directions, confirmations, blind spots, bisection."""

    def __init__(self, evaluator, f0, sigma, tolerance, epsilon, rng):
        self.evaluator = evaluator
        self.f0 = f0
        self.sigma = sigma
        self.tolerance = tolerance
        self.epsilon = epsilon
        self.rng = rng

    def probe(self, row, direction, kind, reference=0.0, step=None, resolve=1.0):
        """One probe along ``direction``, judged, re-measured at h/8 when its verdict needs it (see confirm).

        ``resolve`` < 1 takes the step for a derivative that much smaller than
        ``reference`` (a larger step, a proportionally smaller error bar).
        """
        m = measure(self.evaluator, row, direction, kind, self.f0, self.sigma, self.epsilon, step, reference * resolve)
        judged = verdict.judge(m, self.sigma, self.tolerance, reference)
        needs = kind != GRADIENT and judged.status == MISMATCH and math.isfinite(judged.analytic)
        if step is None and (needs or verdict.blocked_by_kink(m, self.sigma, self.tolerance)):
            judged = self.confirm(row, direction, judged, reference)
        if judged.status == MISMATCH and math.isfinite(judged.analytic) and math.isfinite(judged.numeric):
            judged = self.off_the_point(row, direction, judged)
        return judged

    def off_the_point(self, row, direction, probe):
        """A conviction read again a step away on each side: a wrong gradient, or a convention where the loss has no derivative.

        Where the loss is not differentiable (a ReLU input exactly at 0, a
        max-pool window with a tie: Keras' zero biases and zero-padded rows
        put many elements there at once), TensorFlow's gradient takes one
        convention per element (relu'(0) = 0, the whole gradient to one of
        the tied inputs). Summed over many such elements with upstream
        gradients of both signs, the directional derivative it gives can lie
        outside both one-sided slopes, and no error bar around the central
        difference covers that; in float32 the fourth difference often
        cannot see the kinks either. One step h to each side the elements
        leave the kink, and the analytic derivatives there are the one-sided
        slopes, whose mean the central difference measures. A wrong gradient
        is wrong on both sides as well, so its conviction stands. Two
        gradient evaluations, paid only by a probe that would convict.
        """
        h = probe.step
        right = self.evaluator.slope_at(row.variables, row.theta, direction, h)
        left = self.evaluator.slope_at(row.variables, row.theta, direction, -h)
        mean, n = (right + left) / 2, probe.numeric
        if not math.isfinite(mean) or abs(mean - n) > probe.error_bound + self.tolerance * max(abs(mean), abs(n)):
            return probe
        return dataclasses.replace(
            probe,
            status=INCONCLUSIVE,
            reason=(
                f"the loss is not differentiable at this point: the analytic derivative is {probe.analytic:.4g} "
                f"here but {left:.4g} and {right:.4g} a step to either side, whose mean the difference "
                f"({n:.4g}) matches"
            ),
        )

    def confirm(self, row, direction, probe, reference):
        """Re-measures a probe at step h/8; a mismatch stands only if it convicts there too.

        Two cases. Along a random or blind-spot direction of a wide ReLU
        layer the directional derivative is an incoherent sum and a handful
        of kinks within the step moves the central difference by percents
        while D(h) and D(2h) still agree: no residual-based bound holds there
        (in float64, without any rounding, 3-8% of such probes break it).
        Kinks within h/8 are a small subset of those within h, so requiring
        the verdict at both steps cuts that to ~0.3%; row_verdict then asks
        for a second such direction. And a probe held back only by its fourth
        difference is either at a kink (which stays within h/8, or leaves)
        or at smooth curvature (which shrinks 4096-fold at h/8): the verdict
        at h/8 tells them apart (verdict.blocked_by_kink).
        """
        m = measure(
            self.evaluator, row, direction, probe.direction, self.f0, self.sigma, None, probe.step / _CONFIRM_RATIO
        )
        again = verdict.judge(m, self.sigma, self.tolerance, reference)
        if again.status == MISMATCH:
            why = "smooth at h/8: curvature, not a kink" if probe.status != MISMATCH else "confirmed at step h/8"
            return dataclasses.replace(probe, status=MISMATCH, reason=why)
        if probe.status != MISMATCH:
            return probe
        return dataclasses.replace(
            probe,
            status=INCONCLUSIVE,
            reason=f"disagrees at step h but not at h/{_CONFIRM_RATIO:g}: the loss is not smooth on the scale of the step",
        )

    def blind_spot(self, row, masks, kind):
        """Probes over ``masks`` along directions with zero analytic derivative; ``[(probe, direction)]``.

        The analytic derivative there is zero (exactly, for the zero set; by
        construction, for a block made orthogonal to its gradient), so any
        numeric derivative the error bar resolves is a mismatch. The step is
        chosen for the RMS gradient of those elements (the derivative a wrong
        element would typically show), which puts the error bar near 2e-3 of
        it in float32 (see measure). A conviction stands only when confirmed
        at h/8 and then along a second, independent direction over the same
        elements: kinks (a dead ReLU unit revived by the step) may fool one
        direction, rarely two.
        """
        reference = row.rms_over(masks)
        first_direction = row.blind_direction(masks, self.rng)
        first = self.probe(row, first_direction, kind, reference, resolve=_BLIND_RESOLVE)
        if first.status != MISMATCH:
            return [(first, first_direction)]
        second_direction = row.blind_direction(masks, self.rng)
        second = self.probe(row, second_direction, kind, reference, resolve=_BLIND_RESOLVE)
        if second.status == MISMATCH:
            first = dataclasses.replace(first, reason="confirmed at step h/8 and along a second direction")
        else:
            first = dataclasses.replace(
                first, status=INCONCLUSIVE, reason="one direction over these elements disagrees, a second one does not"
            )
        return [(first, first_direction), (second, second_direction)]
