"""Locating a gradient check's mismatch: bisection over a row's elements along the direction that convicted."""

import math

import numpy as np

from tb_gradcheck.check import probes
from tb_gradcheck.check import verdict


def locate(prober, row, direction, probe):
    """Bisects the row along ``direction`` to the variable, rows, columns or element at fault.

    The discrepancy D = a - n along the convicting direction d is a sum
    over elements; restricting d to one half measures that half's share
    and the other half's is D minus it (verdict.split). Each level
    costs one probe (4 evaluations) per axis tried and halves the
    candidate set: across variables, then rows, then columns of a
    variable viewed as a matrix (leading dimensions flattened into rows).
    When the fault is spread over both halves of the rows (a wrong
    column) the columns are tried instead, and the other way round; it
    stops when both axes split it, or when the error bar cannot tell. A
    64 x 64 kernel with its bias takes 13 levels: 52 evaluations, up to
    twice that for a column.

    Returns:
      The location as text, or "" when not narrowed below the whole row.
    """
    discrepancy = probe.analytic - probe.numeric
    region = [(i, 0, _rows(t), 0, _cols(t)) for i, t in enumerate(row.theta)]
    while discrepancy != 0 and math.isfinite(discrepancy):
        for part, rest in _halves(region):
            side, share = _split(prober, row, direction, probe.direction, discrepancy, part)
            if side in ("part", "rest"):
                region, discrepancy = (part, share) if side == "part" else (rest, discrepancy - share)
                break
            if side is None:
                return _describe(row, region)
        else:
            break  # every axis splits it: the fault is spread over this region
    return _describe(row, region)


def _split(prober, row, direction, kind, discrepancy, part):
    """``(side, share of D in part)`` for one candidate split (see verdict.split)."""
    masks = _masks(row.theta, part)
    d_part = [np.where(m, x, 0.0) for m, x in zip(masks, direction)]
    width = math.sqrt(sum(float(np.sum(x * x)) for x in d_part))
    if width == 0:
        return "rest", 0.0  # the direction has no component there: nothing to measure
    if width >= 1.0:
        return "part", discrepancy
    a_part = row.dot(d_part)
    # Step for the share the part would carry if it held all of D.
    m = probes.measure(
        prober.evaluator,
        row,
        [x / width for x in d_part],
        kind,
        prober.f0,
        prober.sigma,
        None,
        reference=abs(discrepancy) / width,
    )
    judged = verdict.judge(m, prober.sigma, prober.tolerance)
    if judged.reason.startswith("the loss has a kink"):
        return None, 0.0
    share = (judged.analytic - judged.numeric) * width
    side = verdict.split(
        discrepancy, share, judged.error_bound * width, a_part, row.dot(direction) - a_part, prober.tolerance
    )
    return side, share


def _rows(t):
    return int(np.prod(t.shape[:-1])) if t.ndim > 1 else int(t.size)


def _cols(t):
    return int(t.shape[-1]) if t.ndim > 1 else 1


def _halves(region):
    """Candidate splits of a region, in order: across variables, else rows then columns; none at one element."""
    if len(region) > 1:
        k = len(region) // 2
        return [(region[:k], region[k:])]
    ((i, r0, r1, c0, c1),) = region
    out = []
    if r1 - r0 > 1:
        mid = (r0 + r1) // 2
        out.append(([(i, r0, mid, c0, c1)], [(i, mid, r1, c0, c1)]))
    if c1 - c0 > 1:
        mid = (c0 + c1) // 2
        out.append(([(i, r0, r1, c0, mid)], [(i, r0, r1, mid, c1)]))
    return out


def _masks(theta, region):
    masks = [np.zeros(t.shape, bool) for t in theta]
    for i, r0, r1, c0, c1 in region:
        view = masks[i].reshape(_rows(theta[i]), _cols(theta[i]))
        view[r0:r1, c0:c1] = True
    return masks


def _describe(row, region):
    whole = [(i, 0, _rows(t), 0, _cols(t)) for i, t in enumerate(row.theta)]
    if region == whole:
        return ""
    if len(region) > 1:
        return ", ".join(row.names[i] for i, *_ in region)
    ((i, r0, r1, c0, c1),) = region
    t = row.theta[i]

    def span(a, b, n):
        return ":" if (a, b) == (0, n) else (str(a) if b - a == 1 else f"{a}:{b}")

    rows = span(r0, r1, _rows(t))
    if t.ndim <= 1:
        return row.names[i] if rows == ":" else f"{row.names[i]}[{rows}]"
    if (r0, r1, c0, c1) == (0, _rows(t), 0, _cols(t)):
        return row.names[i]
    if t.ndim > 2 and r1 - r0 == 1:
        rows = ", ".join(str(int(x)) for x in np.unravel_index(r0, t.shape[:-1]))
    elif t.ndim > 2 and rows != ":":
        rows = f"{rows} of {'x'.join(map(str, t.shape[:-1]))} flattened"
    return f"{row.names[i]}[{rows}, {span(c0, c1, _cols(t))}]"
