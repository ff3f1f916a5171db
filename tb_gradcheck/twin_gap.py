"""What a float64 twin cannot see: the model's own float32 gradient, against the twin's float64 one.

A check of the float64 twin resolves a derivative of the model's function to
~1e-7, but in float64 only. A backward pass that is right in exact arithmetic
and wrong in float32 (a variance taken as E[x^2] - E[x]^2 of large values
cancels; a hand-written exp overflows to Inf, then NaN) is right in the twin
and wrong where the model trains, and the twin's check says ok. One backward
pass of each, at the same weights on the same batch, shows it: float32
rounding, accumulated through a healthy network, keeps its gradient within
~1e-5 of the float64 one, where such a bug is percents off or not finite.
A row whose float32 gradient is further from the float64 one than the
float32 check's own tolerance (1%) is a mismatch, as the float32 check of the
model would have made it.

``gap`` is that comparison on gradients already computed, for any framework
(no TensorFlow import); ``float32_gap`` computes them with TensorFlow, which
it imports when called.
"""

import dataclasses
import math

import numpy as np

from tb_gradcheck import check_run
from tb_gradcheck.check_report import MISMATCH

# The float32 check's tolerance (checks.DEFAULT_TOLERANCE): a gap it would
# have convicted.
FLOAT32_TOLERANCE = 0.01


def float32_gap(report, loss_fn, variables, twin_loss_fn, twin_variables, tolerance=FLOAT32_TOLERANCE):
    """``report`` (the twin's check) with each row's float32 gradient held against the twin's float64 one.

    Args:
      report: The ``GradientCheckReport`` of ``check_gradients(twin_loss_fn, twin_variables)``.
      loss_fn: The model's loss in its own precision, reading ``variables``;
        any state it writes is put back (as ``check_gradients`` does).
      variables: The model's variables, position by position the twin's.
      twin_loss_fn: The twin's loss, as checked.
      twin_variables: The twin's variables, as checked.
      tolerance: The relative gap ||g - g64|| / ||g64|| above which a row
        is a mismatch.

    Returns:
      The report, with every row that the twin's check did not already
      convict and whose gradient is more than ``tolerance`` off the float64
      one, or not finite where that one is, made a mismatch; its reason
      says so, its ``analytic`` and ``numeric`` are the two gradients along
      the float64 one and its ``relative_error`` the gap.

    Raises:
      ValueError: The two variable lists do not match in count and shapes.
    """
    variables, twin_variables = list(variables), list(twin_variables)
    if len(variables) != len(twin_variables) or any(
        tuple(a.shape) != tuple(b.shape) for a, b in zip(variables, twin_variables)
    ):
        raise ValueError(
            "Expected the model's variables and the twin's, in the same order and shapes. Received: "
            f"{len(variables)} and {len(twin_variables)} variables"
        )
    from tb_gradcheck import grouping

    model = _gradients(loss_fn, variables)
    twin = _gradients(twin_loss_fn, twin_variables)
    return gap(report, model, twin, grouping.Rows(twin_variables), tolerance)


def gap(report, gradients, references, rows, tolerance=FLOAT32_TOLERANCE):
    """``report`` with each row's gradient held against a reference (the float64 twin's), gradients given.

    Args:
      report: The twin's ``GradientCheckReport``.
      gradients: The model's gradient per variable (numpy, or None), in the twin's variable order.
      references: The twin's gradient per variable (numpy, or None).
      rows: The twin's rows (``check_run.Layout`` or ``grouping.Rows``).
      tolerance: The relative gap above which a row is a mismatch.

    Returns:
      The report, rows changed as ``float32_gap`` says.
    """
    members = check_run.layer_members(rows)
    layers = tuple(
        _row(r, [gradients[i] for i in m], [references[i] for i in m], tolerance)
        for r, m in zip(report.layers, members)
    )
    per_variable = None
    if report.variables is not None:
        per_variable = tuple(_row(r, [g], [t], tolerance) for r, g, t in zip(report.variables, gradients, references))
    return dataclasses.replace(report, layers=layers, variables=per_variable)


def _gradients(loss_fn, variables):
    from tb_gradcheck import check_state

    evaluator = check_state.Evaluator(loss_fn, [check_state.tf_variable(v) for v in variables])
    try:
        return [None if g is None else np.asarray(g, np.float64) for g in evaluator.gradients()]
    finally:
        evaluator.restore_all()


def _row(row, gradients, references, tolerance):
    """One row, a mismatch if its gradient is too far from the reference (the twin's)."""
    if row.status == MISMATCH:
        return row  # the function's own gradient is wrong: that verdict says more
    pairs = [(g, r) for g, r in zip(gradients, references) if r is not None]
    if not pairs:
        return row
    reference = math.sqrt(sum(float(np.sum(r * r)) for _, r in pairs))
    if not math.isfinite(reference):
        return row  # the float64 gradient itself is not finite: the twin's check speaks to that
    zero = [np.zeros_like(r) for _, r in pairs]
    gradients = [z if g is None else g for (g, _), z in zip(pairs, zero)]
    distance = math.sqrt(sum(float(np.sum((g - r) ** 2)) for g, (_, r) in zip(gradients, pairs)))
    finite = math.isfinite(distance)
    if finite and distance <= tolerance * reference:
        return row
    direction = [r / reference for _, r in pairs] if reference > 0 else zero
    along = sum(float(np.sum(g * d)) for g, d in zip(gradients, direction))
    if finite:
        relative = distance / reference if reference > 0 else math.inf
        reason = (
            f"the model's own gradient is {relative:.2g} off the float64 twin's: its backward pass loses "
            "precision in the model's dtype (cancellation, a sum of large terms)"
        )
    else:
        relative = math.inf
        reason = "the model's own gradient is not finite where the float64 twin's is: it overflows in the model's dtype"
    return dataclasses.replace(
        row, analytic=along, numeric=reference, relative_error=relative, status=MISMATCH, reason=reason
    )
