"""The decisions of the gradient check: error bar, probe verdict, row verdict; pure numbers, no TensorFlow.

Everything here takes measured numbers (derivatives, residuals, noise) and
returns a verdict, so the rules that decide ok / mismatch / inconclusive can
be tested as tables without evaluating a loss.
"""

import math

from tb_gradcheck.check_report import (
    GRADIENT,
    INCONCLUSIVE,
    MISMATCH,
    OK,
    STATUSES,
    CheckRow,
    Probe,
)

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


def judge(m, sigma, tolerance):
    a, n = m["a"], m["n"]
    if not m["finite"]:
        return Probe(m["direction"], m["h"], a, n, math.inf, math.nan, INCONCLUSIVE,
                     "the loss is not finite at a perturbed point")
    if not m["gradient_finite"]:
        return Probe(m["direction"], m["h"], math.nan, n, math.nan, math.nan, MISMATCH,
                     "the analytic gradient is not finite where the loss is")
    if m["unmoved"] and m["no_gradient"]:
        # No evaluation moved the loss by a single bit and the analytic
        # gradient is exactly zero: both sides agree that the loss does not
        # depend on this row (at float precision).
        return Probe(m["direction"], m["h"], a, n, 0.0, 0.0, OK, "no dependence: gradient and differences are zero")
    bound, noise, shape = error_bound(m, sigma)
    scale = max(abs(a), abs(n))
    diff = abs(a - n)
    denom = max(scale, bound)
    rel = diff / denom if denom > 0 else 0.0
    # Not smooth within the step: the single-kink bound in `bound` no longer
    # holds when many kinks add up, so such a probe may confirm but never
    # convict.
    kinked = abs(m["even"]) > _KINK_SIGMAS * _EVEN_NOISE_GAIN * sigma
    # Interval logic: the true derivative lies within `bound` of n.
    if diff + bound <= tolerance * scale:
        status, reason = OK, ""
    elif diff > bound + tolerance * scale and not kinked:
        status, reason = MISMATCH, ""
    else:
        status = INCONCLUSIVE
        # The residuals carry noise too (std 0.79 sigma / h for the odd one):
        # call it a kink only when one of them stands 5 sigma above that.
        odd_noise = 0.79 * sigma / m["h"]
        if kinked or abs(m["odd"]) > _KINK_SIGMAS * odd_noise:
            reason = "the loss has a kink or strong curvature within the step"
        else:
            reason = "the directional derivative is below the finite-difference noise floor"
    return Probe(m["direction"], m["h"], a, n, bound, rel, status, reason)


def row_verdict(name, granularity, size, judged):
    by_status = {s: [p for p in judged if p.status == s] for s in STATUSES}
    # Convicting: the gradient probe (robust, see check_probes.confirm) on its own, or
    # two random probes each confirmed at two steps. One confirmed random
    # disagreement with nothing else convicting is conflicting evidence.
    convicting = [p for p in by_status[MISMATCH] if p.direction == GRADIENT or not math.isfinite(p.analytic)]
    random_hits = [p for p in by_status[MISMATCH] if not any(p is c for c in convicting)]
    if convicting or len(random_hits) >= _RANDOM_CONVICTIONS:
        status, pick = MISMATCH, max(convicting or random_hits, key=_severity)
    elif random_hits:
        pick = random_hits[0]
        return CheckRow(name, granularity, size, pick.analytic, pick.numeric, pick.relative_error, pick.error_bound,
                        INCONCLUSIVE, "only one random direction disagrees (confirmed at two steps)", tuple(judged))
    elif by_status[OK] and all(p.status == OK for p in judged if p.direction == GRADIENT):
        # "ok" needs the most sensitive probe, the one along the gradient,
        # to confirm: a random direction agreeing while it hesitates is not
        # a confirmation (it may weigh the part of the row that is right).
        status, pick = OK, max(by_status[OK], key=lambda p: p.relative_error)
    else:
        # Show the undecided probe that came closest to deciding (the
        # tightest error bar relative to its derivative), with its reason.
        status = INCONCLUSIVE
        undecided = by_status[INCONCLUSIVE] or judged
        pick = min(undecided, key=lambda p: p.error_bound / max(abs(p.analytic), abs(p.numeric), 1e-300)
                   if math.isfinite(p.error_bound) else math.inf)
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
    )


def _severity(p):
    return math.inf if math.isnan(p.relative_error) else p.relative_error

