"""The vanishing rule: a gradient that decays toward the input, as a profile over depth, read by each row's kind; numpy only.

Vanishing is the backward signal shrinking layer after layer on its way to
the input, so the rule looks for a *point* in the depth order below which
every row is orders of magnitude below the largest row above it (the chain:
a small row in the middle of a network whose input side learns is local to
that row, not a decay), and below most rows above it (one large row above
is a step: a classifier that has learned its task holds most of the
gradient in its head). One small row is not a profile: a row is only as
small as its role makes it when a row of the same *kind* above the point
is as small. Attention's query and key projections are the case in point:
while the softmax is near uniform (at initialisation, and until attention
learns to pick) their gradient is orders below the value projection's in
every layer, so layer 0's query sits far below the layers after it and
just where layer 1's query does. A decay across depth shows in each kind
it crosses: the rows of that kind above the point are larger.

A row's kind is its role, read from the stored layout, not from any
library's names: its name with every block index taken out (each run of
digits: ``encoder.layer.0.attention.self.query`` and ``...layer.1...``,
``blocks.3.mlp``, ``dense_4``) and the shapes of its parameters (a
LayerNorm and a projection in one block differ; so do a block's two
feed-forward layers). Rows that share both sit at the same place in
repeated blocks, or are same-shaped layers of one stack.
"""

import re

import numpy as np

from tb_gradcheck.findings import finding
from tb_gradcheck.findings import rules
from tb_gradcheck.findings import windows

_DIGITS = re.compile(r"\d+")


def kinds(rows, shapes=None):
    """int ``[L]``: each row's kind, an id shared by rows whose names differ only in their numbers and whose shapes are equal.

    Args:
      rows: Row names, in depth order.
      shapes: Optional ``{row: shapes}`` (any hashable value, e.g. each
        parameter's shape as a tuple; the element count where the layout
        has no shapes). A row without one is keyed on its name alone.

    Returns:
      An int array, one id per row.
    """
    shapes = shapes or {}
    ids = {}
    return np.array([ids.setdefault((_DIGITS.sub("#", r), shapes.get(r)), len(ids)) for r in rows], np.int64)


def decay_points(level, kind, t):
    """``(point [S], top [S])``: at each write, how many rows lie below the highest point the gradient decays across.

    A point ``p`` (rows ``0 .. p-1`` below it, ``p ..`` above) is a decay at
    a write when

    - every row below it with a gradient there is ``vanishing_orders`` below
      the largest row above it, and
    - no kind is as small above it as below it: for every kind with rows on
      both sides, its rows above include one at least ``kind_orders`` above
      its largest row below, and
    - at least half of the rows above it with a gradient there are
      ``kind_orders`` above every row below it (``_below_most_rows_above``).

    Args:
      level: ``[S, L]`` log10 gradient norms, NaN where a row has no
        gradient (those rows are passed over).
      kind: ``[L]`` kind ids (``kinds``).
      t: ``diagnose.Thresholds``.

    Returns:
      ``point``: ``[S]`` int, the largest decay point (0: none), so the rows
      below it are ``0 .. point-1``; ``top``: ``[S]`` the log10 of the
      largest norm above it (NaN where there is none).
    """
    s, n = level.shape
    if n < 2 or s == 0:
        return np.zeros(s, np.int64), np.full(s, np.nan)
    filled = np.where(np.isnan(level), -np.inf, level)
    below = np.maximum.accumulate(filled, axis=1)  # [:, i]: the largest of rows 0 .. i
    above = np.flip(np.maximum.accumulate(np.flip(filled, axis=1), axis=1), axis=1)  # rows i ..
    lower, upper = below[:, :-1], above[:, 1:]  # column p - 1: the two sides of point p
    with np.errstate(invalid="ignore"):
        valid = np.isfinite(lower) & np.isfinite(upper) & (lower <= upper - t.vanishing_orders)
    # Points where a kind is as small above as below: for consecutive rows
    # r_a < r_b of one kind, every point in (r_a, r_b] has rows r_1 .. r_a of
    # it below and r_b .. above.
    shared = np.zeros((s, n + 1), np.int32)
    for k in np.unique(kind):
        members = np.flatnonzero(kind == k)
        if len(members) < 2:
            continue
        x = filled[:, members]
        lo = np.maximum.accumulate(x, axis=1)[:, :-1]
        hi = np.flip(np.maximum.accumulate(np.flip(x, axis=1), axis=1), axis=1)[:, 1:]
        with np.errstate(invalid="ignore"):
            same = (np.isfinite(lo) & np.isfinite(hi) & (lo > hi - t.kind_orders)).astype(np.int32)
        shared[:, members[:-1] + 1] += same
        shared[:, members[1:] + 1] -= same
    valid &= np.cumsum(shared, axis=1)[:, 1:n] == 0
    valid &= _below_most_rows_above(filled, lower, valid, t)
    found = valid.any(axis=1)
    point = np.where(found, (n - 1) - np.argmax(valid[:, ::-1], axis=1), 0)
    top = np.where(found, above[np.arange(s), np.minimum(point, n - 1)], np.nan)
    return point.astype(np.int64), top


def _below_most_rows_above(filled, lower, valid, t):
    """bool ``[S, L-1]``: at each candidate point, at least half the rows above it are ``kind_orders`` above every row below.

    A decay across depth lowers what lies below the point beneath the rows
    above it, not beneath one row: near convergence a classifier head can
    take most of the gradient (its loss term is near zero, and each trunk
    row gets a small share of it), so the input side is orders below the
    head while as large as the trunk rows just above it. That is the head's
    step, which makes its own point (the whole body below the head) where it
    is ``vanishing_orders`` deep. Rows below a point are at most ``lower``,
    so counting every row over ``lower + kind_orders`` counts rows above it.
    """
    out = np.zeros_like(valid)
    finite_above = np.flip(np.cumsum(np.flip(np.isfinite(filled), axis=1), axis=1), axis=1)[:, 1:]  # rows p ..
    ordered = np.sort(filled, axis=1)
    for i in np.flatnonzero(valid.any(axis=1)):  # only writes with a candidate point: few in most runs
        over = filled.shape[1] - np.searchsorted(ordered[i], lower[i] + t.kind_orders, side="right")
        out[i] = 2 * over >= finite_above[i]
    return out


def _still_while_others_move(update, t):
    """bool ``[S, L]``: the layer's measured update sits ``not_learning_orders`` below the other layers' median there.

    An update under float32's floor says its gradient rounds away only
    while the optimizer moves the rest of the network: where every layer
    slows (a learning rate decayed toward 0 at a schedule's end, a refused
    step), one under the floor says nothing about its own gradient. A
    converged fine-tune's norm scales, whose gradients sit at float32's
    half-ulp of their weights, cross the floor in the last writes of a
    linear decay, two orders below the median layer as all along.
    """
    measured = np.isfinite(update)
    with np.errstate(divide="ignore", invalid="ignore"):
        level = np.log10(update)  # no update at all: -inf, below any pace and no part of the others' median
        still = level < windows.median_of_others(level) - t.not_learning_orders  # NaN (no other moved): False
    # Where no other layer's update is measured, the floor alone speaks, as before.
    judged = measured & (measured.sum(axis=1, keepdims=True) - measured > 0)
    return np.where(judged, still, True)


def vanishing(v, t, exclude=(), shapes=None):
    """Layers in a decay toward the input (``decay_points``), or too small to move their weights, persistently.

    A layer is vanishing at a write when it lies below the point the
    gradient decays across there (``decay_points``: it, and every row below
    it, ``vanishing_orders`` below the largest row above, and no kind of
    row as small above the point as below it), or its ``grad_to_weight`` is
    below ``vanishing_ratio`` and its measured update (``update_to_weight``,
    where the run has it) is below ``not_learning_floor``; and that held in
    at least ``persistence`` of the trailing window's writes. The finding
    starts where the unbroken run of such writes that made it sure began
    (``first_step``; ``confirmed_at_step`` where the window made it sure).

    Args:
      v: A ``rules.StatsView``.
      t: ``diagnose.Thresholds``.
      exclude: Names of layers another rule speaks for (dead).
      shapes: Optional ``{row: shapes}`` for ``kinds``.

    Returns:
      A ``rules.Verdict``; each layer's evidence names the lowest row above
      its decay point (``decays_below``), the one most of its writes had.
    """
    s, n_rows = v.norm.shape
    # A gradient of exactly 0 is not a small one: no unit gets any (the dead
    # rule's case), or the weights are NaN and ReLU(NaN) gave 0 (non_finite's).
    # Such a write is passed over, like a write without a gradient.
    finite = v.present & np.isfinite(v.norm) & (v.norm > 0)
    norm = np.where(finite, v.norm, np.nan)
    level = windows.log_level(norm, finite)
    point, top = decay_points(level, kinds(v.rows, shapes), t)
    decayed = finite & (np.arange(n_rows)[None, :] < point[:, None])
    gap = top[:, None] - level  # orders below the largest row above the point
    with np.errstate(invalid="ignore"):
        tiny = finite & (v.ratio < t.vanishing_ratio) if v.ratio is not None else np.zeros((s, n_rows), bool)
        if v.update is not None:
            # "Too small to move its weights" is a claim about an SGD step,
            # lr * g. Where the run measured the step the optimizer took,
            # that claim is tested directly: an adaptive optimizer (Adam)
            # scales the step to about lr per element whatever |g| is, so a
            # gradient under float32's half-ulp of the weights can still move
            # them. A measured update at or above not_learning_floor (what
            # moves float32 weights) refutes it at that write.
            tiny &= ~(v.update >= t.not_learning_floor)
            tiny &= _still_while_others_move(v.update, t)
    excluded = np.array([name in exclude for name in v.rows])
    sick = (decayed | tiny) & ~excluded[None, :]
    flags = windows.persistent(sick, finite, t)
    evidence = {}
    for j in rules.flagged_columns(flags):
        name = v.rows[j]
        f = flags[:, j]
        steps = v.steps[f]
        # The rule is sure once the trailing window holds enough sick writes;
        # the finding starts where that unbroken run of sick writes began, as
        # dead's does (writes without a gradient are passed over, not breaks).
        confirmed = int(np.argmax(f))
        onset = windows.run_start(sick[:, j] | ~finite[:, j], confirmed)
        onset += int(np.argmax(finite[onset : confirmed + 1, j]))  # the first of them with a gradient
        by_decay = f & decayed[:, j]
        d = gap[by_decay, j]
        d = d[np.isfinite(d)]
        points = point[by_decay]
        evidence[name] = {
            "median_norm": float(np.median(norm[f, j])),
            "median_orders_below_later_layers": float(np.median(d)) if len(d) else None,
            "fraction_of_steps": float(f.sum() / finite[:, j].sum()),
            "first_step": int(v.steps[onset]),
            "confirmed_at_step": int(steps[0]),
            "last_step": int(steps[-1]),
            "reason": "decays across depth"
            if by_decay.sum() >= (f & tiny[:, j]).sum()
            else "too small to move its weights",
        }
        if len(points):
            evidence[name]["decays_below"] = v.rows[int(np.bincount(points).argmax())]
    return rules.Verdict(flags, {name: "warning" for name in evidence}, evidence, v.typical)


def describe(found, quote):
    """The sentence of a ``vanishing`` finding, names passed through ``quote`` (``diagnose.describe``)."""
    e = found.evidence
    orders = [x["median_orders_below_later_layers"] for x in e.values()]
    orders = [x for x in orders if x is not None]
    detail = (
        f"{min(orders):.1f}-{max(orders):.1f} orders of magnitude below the layers after them"
        if orders
        else "too small against its weights to change them in float32"
    )
    names = finding.name_list(found.layers, quote)
    return f"Vanishing gradients in {names}: gradient norm {detail}, steps {found.steps[0]}-{found.steps[1]}."
