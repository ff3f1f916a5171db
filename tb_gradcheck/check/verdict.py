"""The decisions of the gradient check: error bar, probe verdict, row verdict; pure numbers, no TensorFlow.

Everything here takes measured numbers (derivatives, residuals, noise) and
returns a verdict, so the rules that decide ok / mismatch / inconclusive can
be tested as tables without evaluating a loss.
"""

import math

from tb_gradcheck.check.report import BLIND_SPOT
from tb_gradcheck.check.report import GRADIENT
from tb_gradcheck.check.report import INCONCLUSIVE
from tb_gradcheck.check.report import MISMATCH
from tb_gradcheck.check.report import OK
from tb_gradcheck.check.report import STATUSES
from tb_gradcheck.check.report import CheckRow
from tb_gradcheck.check.report import Probe

# Error bar coefficients (see _error_bound for the derivation).
_NOISE_SIGMAS = 6.0
_ODD_WEIGHT = 2.0
_EVEN_WEIGHT = 0.5
# Var(e(2h) + e(-2h) - 4 e(h) - 4 e(-h) + 6 e(0)) = 70 sigma^2 for independent
# rounding errors e of standard deviation sigma.
_EVEN_NOISE_GAIN = math.sqrt(70.0)
# A fourth difference above this many noise sigmas is not noise: the loss is
# not smooth within the step (kinks, jumps). Noise alone passes it with
# probability 6e-7 (Gaussian 5 sigma).
_KINK_SIGMAS = 5.0

# A row needs this many confirmed random mismatches when its gradient probe
# does not convict (see check_probes.confirm).
_RANDOM_CONVICTIONS = 2
# The residuals carry noise too: the odd one, D(2h) - D(h), has standard
# deviation 0.79 sigma / h for independent rounding errors of sigma; a kink
# or curvature is named only when a residual stands _KINK_SIGMAS above it.
_ODD_NOISE_GAIN = 0.79
# Bisection (see split): a side's discrepancy must stand this many of its
# error bars away from zero to hold the fault, and the error bar must be
# below this fraction of the discrepancy being split, or bisection stops.
_SPLIT_SIGNIFICANCE = 2.0
_SPLIT_RESOLUTION = 0.25


def error_bound(m, sigma):
    """E: a bound on |numeric - true directional derivative| for one probe.

    Three terms, each in derivative units:

    - Rounding: the central difference carries sigma / (sqrt(2) h) of
      rounding noise (two independent errors of sigma over 2h); _NOISE_SIGMAS
      of those with the measured sigma (a Gaussian exceeds 6 sigma once in 5e8).
    - Truncation: for a smooth loss the odd residual is 3 c h^2, three times
      the truncation c h^2 of D(h); its weight 2 makes that a 6x margin.
    - Kinks. Take one kink of slope jump J at t* = x h, x in [0, 1) (kinks
      beyond h do not touch D(h)). Then D(h) is off by J (1 - x) / 2, the odd
      residual is J x / 4 and the even residual over h is J (3x - 2). With
      the weights 2 and 1/2: 2 |odd| + |even| / 2h = J (x + |3x - 2|) / 2,
      which is at least twice the error for every x (equality at x = 0, the
      kink exactly at the point, and at x = 2/3). A jump is larger on both
      residuals than on D(h) and is bounded likewise. Many kinks adding up are
      not bounded this way; judge and check_probes.confirm deal with them.
    """
    noise = _NOISE_SIGMAS * sigma / (math.sqrt(2.0) * m["h"])
    shape = _ODD_WEIGHT * abs(m["odd"]) + _EVEN_WEIGHT * abs(m["even"]) / m["h"]
    return noise + shape, noise, shape


def judge(m, sigma, tolerance, reference=0.0):
    """The verdict of one probe from its measurement ``m`` (see check_probes.measure).

    Args:
      m: Dict with ``direction``, ``h``, ``a`` (analytic), ``n`` (numeric),
        ``odd`` and ``even`` residuals, ``finite``, ``unmoved``,
        ``no_gradient`` and ``gradient_finite``.
      sigma: Rounding noise of one loss evaluation.
      tolerance: Relative error above which a resolved difference convicts.
      reference: For blind-spot probes (analytic derivative zero by
        construction), the size a derivative along such a direction typically
        has in this row: "ok" then means the numeric derivative is within
        ``tolerance`` of that size from zero. 0 for the other probes.

    Returns:
      A ``Probe``.
    """
    a, n = m["a"], m["n"]
    if not m["finite"]:
        return Probe(
            m["direction"],
            m["h"],
            a,
            n,
            math.inf,
            math.nan,
            INCONCLUSIVE,
            "the loss is not finite at a perturbed point",
        )
    if not m["gradient_finite"]:
        return Probe(
            m["direction"],
            m["h"],
            math.nan,
            n,
            math.nan,
            math.nan,
            MISMATCH,
            "the analytic gradient is not finite where the loss is",
        )
    if m["unmoved"] and m["no_gradient"]:
        # No evaluation moved the loss by a single bit and the analytic
        # derivative is exactly zero: both sides agree that the loss does not
        # depend on these parameters (at float precision).
        return Probe(m["direction"], m["h"], a, n, 0.0, 0.0, OK, "no dependence: gradient and differences are zero")
    bound, noise, _ = error_bound(m, sigma)
    scale = max(abs(a), abs(n))
    diff = abs(a - n)
    denom = max(scale, bound)
    rel = diff / denom if denom > 0 else 0.0
    kinked = _kinked(m, sigma)
    # Interval logic: the true derivative lies within `bound` of n. The two
    # tests exclude each other unless `reference` widens the first: a
    # blind-spot probe whose numeric derivative is resolved (however small
    # against the reference) contradicts its zero analytic one, and that wins.
    if diff > bound + tolerance * scale and not kinked:
        status, reason = MISMATCH, ""
    elif diff + bound <= tolerance * max(scale, reference):
        status, reason = OK, ""
    else:
        status = INCONCLUSIVE
        if kinked or abs(m["odd"]) > _KINK_SIGMAS * _ODD_NOISE_GAIN * sigma / m["h"]:
            reason = "the loss has a kink or strong curvature within the step"
        elif max(scale, reference) <= noise:
            # Neither derivative rises above the rounding part of the error
            # bar: float precision cannot resolve a change this small.
            reason = "the directional derivative is below the finite-difference noise floor"
        elif bound > tolerance * max(scale, reference):
            # The derivative is resolved, but its error bar is wider than
            # the tolerance allows: a different cause from the one above.
            reason = (
                f"the error bound ({bound / max(scale, reference):.2g} of the derivative) "
                f"exceeds the tolerance ({tolerance:g})"
            )
        else:
            # A narrow error bar, but the difference sits within it of the
            # tolerance: an error of about the tolerance's size.
            reason = (
                f"the difference ({diff / max(scale, reference):.2g} of the derivative) is within its error "
                f"bound ({bound / max(scale, reference):.2g}) of the tolerance ({tolerance:g}): it may be on "
                "either side"
            )
    return Probe(m["direction"], m["h"], a, n, bound, rel, status, reason)


def blocked_by_kink(m, sigma, tolerance):
    """True when the probe would convict but for its fourth difference (a kink, or curvature at a large step).

    Smooth curvature makes the fourth difference h^4 f'''' and a kink at the
    point makes it ~J h: re-measured at h/8 the first shrinks 4096-fold into
    the noise, the second only 8-fold (and a kink between h/8 and h leaves
    the smaller step altogether). So such a probe is measured again at h/8
    (check_probes.confirm), where the verdict stands on its own.
    """
    if not (m["finite"] and m["gradient_finite"]) or not _kinked(m, sigma):
        return False
    bound, _, _ = error_bound(m, sigma)
    return abs(m["a"] - m["n"]) > bound + tolerance * max(abs(m["a"]), abs(m["n"]))


def _kinked(m, sigma):
    # Not smooth within the step: the single-kink bound in error_bound no
    # longer holds when many kinks add up, so such a probe never convicts.
    return abs(m["even"]) > _KINK_SIGMAS * _EVEN_NOISE_GAIN * sigma


def power(probe, tolerance):
    """min_detectable_error of a row from its gradient probe (see CheckRow); inf without one.

    With analytic a = n (1 + r) against the true n, the mismatch rule
    |a - n| > E + tolerance max(|a|, |n|) holds whatever the numeric error
    (at most E) once r |n| - E > E + tolerance |n| (1 + r), that is
    r > (tolerance + 2 E / |n|) / (1 - tolerance); |a| stands for |n|.
    """
    if probe is None or probe.direction != GRADIENT or probe.analytic == 0:
        return math.inf
    if not (math.isfinite(probe.error_bound) and math.isfinite(probe.analytic)):
        return math.inf
    return (tolerance + 2 * probe.error_bound / abs(probe.analytic)) / (1 - tolerance)


def row_verdict(name, granularity, size, judged, tolerance, location=""):
    """The row's ``CheckRow`` from its judged probes.

    Convicting: the gradient probe on its own (robust, see
    check_probes.confirm); a non-finite analytic gradient; two random probes
    each confirmed at two steps; or a blind-spot probe, which check_probes
    marks a mismatch only when two independent directions over the same
    elements both convict at two steps. One confirmed random disagreement
    with nothing else convicting is conflicting evidence: inconclusive.
    """
    by_status = {s: [p for p in judged if p.status == s] for s in STATUSES}
    gradient = next((p for p in judged if p.direction == GRADIENT), None)
    detectable = power(gradient, tolerance)
    convicting = [
        p
        for p in by_status[MISMATCH]
        if p.direction == GRADIENT or p.direction in BLIND_SPOT or not math.isfinite(p.analytic)
    ]
    random_hits = [p for p in by_status[MISMATCH] if not any(p is c for c in convicting)]
    if convicting or len(random_hits) >= _RANDOM_CONVICTIONS:
        status, pick = MISMATCH, max(convicting or random_hits, key=_severity)
    elif random_hits:
        pick = random_hits[0]
        return CheckRow(
            name,
            granularity,
            size,
            pick.analytic,
            pick.numeric,
            pick.relative_error,
            pick.error_bound,
            INCONCLUSIVE,
            "only one random direction disagrees (confirmed at two steps)",
            tuple(judged),
            detectable,
        )
    elif by_status[OK] and (gradient.status == OK if gradient is not None else all(p.status == OK for p in judged)):
        # "ok" needs the most sensitive probe, the one along the gradient,
        # to confirm (every probe, in a row without a usable gradient): a
        # random direction agreeing while it hesitates is not a confirmation
        # (it may weigh the part of the row that is right).
        # Blind-spot probes' relative errors compare two near-zero numbers:
        # the row shows its worst agreeing gradient or random probe.
        shown = [p for p in by_status[OK] if p.direction not in BLIND_SPOT] or by_status[OK]
        status, pick = OK, max(shown, key=lambda p: p.relative_error)
    else:
        # Show the undecided probe that came closest to deciding (the
        # tightest error bar relative to its derivative), with its reason.
        status = INCONCLUSIVE
        undecided = by_status[INCONCLUSIVE] or judged
        pick = min(
            undecided,
            key=lambda p: (
                p.error_bound / max(abs(p.analytic), abs(p.numeric), 1e-300)
                if math.isfinite(p.error_bound)
                else math.inf
            ),
        )
    return CheckRow(
        name=name,
        granularity=granularity,
        size=size,
        analytic=pick.analytic,
        numeric=pick.numeric,
        relative_error=pick.relative_error,
        noise_floor=pick.error_bound,
        status=status,
        reason=pick.reason if status != MISMATCH else "",
        probes=tuple(judged),
        min_detectable_error=detectable,
        location=location if status == MISMATCH else "",
    )


def split(discrepancy, part, part_error, part_analytic, rest_analytic, tolerance):
    """One bisection step: which side of a split holds the discrepancy.

    Along the convicting direction d, the discrepancy D = <g, d> - D_num is a
    sum over elements, so restricted to a part S and the rest it splits as
    D = D_S + D_rest (to first order). One probe along d restricted to S
    measures D_S; D_rest = D - D_S needs no evaluation. A side holds the
    fault when its discrepancy stands _SPLIT_SIGNIFICANCE error bars plus the
    tolerance on its own analytic derivative away from zero.

    Args:
      discrepancy: D of the whole set being split.
      part: D_S, measured, in the units of D.
      part_error: The error bar of D_S (D's own is the parent's, already
        small against it, or the split would not be tried).
      part_analytic, rest_analytic: <g, d> restricted to each side.
      tolerance: The check's tolerance.

    Returns:
      ``"part"`` or ``"rest"`` when exactly one side holds the fault,
      ``"both"`` when it is spread over both, None when the measurement
      cannot tell (its error bar too wide against D, or neither side holds it).
    """
    if not (math.isfinite(part) and math.isfinite(part_error)) or part_error > _SPLIT_RESOLUTION * abs(discrepancy):
        return None
    rest = discrepancy - part
    in_part = abs(part) > _SPLIT_SIGNIFICANCE * part_error + tolerance * abs(part_analytic)
    in_rest = abs(rest) > _SPLIT_SIGNIFICANCE * part_error + tolerance * abs(rest_analytic)
    if in_part and in_rest:
        return "both"
    if in_part:
        return "part"
    if in_rest:
        return "rest"
    return None


def _severity(p):
    return math.inf if math.isnan(p.relative_error) else p.relative_error
