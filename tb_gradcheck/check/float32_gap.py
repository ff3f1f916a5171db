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

That holds only while the twin computes the model's function. A loss that
draws random numbers from a fixed key or seed may draw other ones in float64
(JAX's ``random.bernoulli`` under ``jax_enable_x64`` gives another dropout
mask from the same key; torch's ``randn`` other noise from the same seed):
the twin is then another function, its gradient is no reference for the
model's, and every row would be convicted of a precision bug it does not
have. ``own_gap`` therefore first holds the model's loss against the twin's
at the same parameters; when they differ by more than float32 rounding can
explain, it compares no gradients and says so in the report's notes. The
twin's own check stays valid either way: it differences the twin's loss,
which draws the same numbers at every evaluation.

``gap`` is the gradient comparison on gradients already computed;
``own_gap`` computes the model's loss, noise and gradient through a
``Evaluator`` (any framework, no TensorFlow import) and
applies the rule above; ``tb_gradcheck.tensorflow.float64_twin.float32_gap`` does it with TensorFlow, which it
imports when called.
"""

import dataclasses
import math

import numpy as np

from tb_gradcheck.check import algorithm
from tb_gradcheck.check import probes
from tb_gradcheck.check.evaluator import unit_roundoff
from tb_gradcheck.check.report import MISMATCH

# The float32 check's tolerance (checks.DEFAULT_TOLERANCE): a gap it would
# have convicted.
FLOAT32_TOLERANCE = 0.01


def own_gap(report, evaluator, references, rows, tolerance=FLOAT32_TOLERANCE):
    """``report`` with the model's own gradient held against the twin's, if the twin computes the model's loss.

    Args:
      report: The twin's ``GradientCheckReport`` (its ``loss`` is the twin's
        loss at the parameters both share).
      evaluator: A ``Evaluator`` of the model's own loss
        over its checked parameters, in the twin's variable order; it
        evaluates and writes them, and the caller restores them after.
      references: The twin's gradient per variable (numpy, or None).
      rows: The twin's rows (``algorithm.Layout`` or ``variables.Rows``).
      tolerance: The relative gap above which a row is a mismatch.

    Returns:
      ``gap``'s report when the two losses agree within float32 rounding
      (or the model's is not finite: an overflow the twin cannot see, which
      ``gap`` convicts); else ``report`` unchanged but for a note saying the
      twin computes another function and only its own check's verdicts stand.
    """
    loss = evaluator.loss()
    gradients = evaluator.gradients()
    if math.isfinite(loss) and math.isfinite(report.loss):
        difference, allowed = _loss_difference(evaluator, loss, report.loss, gradients, report.seed)
        if difference > allowed:
            note = (
                f"the float64 twin's loss ({report.loss:.9g}) is not the model's ({loss:.9g}; they differ by "
                f"{difference:.2g}, more than the {allowed:.2g} float32 rounding explains): the twin draws other "
                "random numbers (dropout masks, noise from the same key or seed) or the model's forward pass loses "
                "precision in its dtype. The model's own gradient was not held against the twin's; the verdicts "
                "are those of the twin's own check, of the twin's loss."
            )
            return dataclasses.replace(report, notes=report.notes + (note,))
    return gap(report, gradients, references, rows, tolerance)


def _loss_difference(evaluator, loss, twin_loss, gradients, seed):
    """``(|loss - twin_loss|, the most float32 rounding explains)`` at the parameters both share.

    The twin holds the model's parameters exactly (widening to float64 is
    exact) and the same batch, so if it computes the same function the two
    losses differ only by the rounding of the model's forward pass: the
    exact loss plus one rounding error e. Two bounds on |e|:

    - sigma, the measured noise of one evaluation in the model's dtype
      (``probes.measure_noise``, 8 evaluations): e is one draw of it,
      and |e| > 100 sigma has probability below 1e-4 whatever its
      distribution (Chebyshev). This is what covers a loss far smaller than
      its terms (a well-fitted regression), whose rounding is large against
      the loss itself.
    - sqrt(u) |loss| (u: the model's unit roundoff; 2.4e-4 in float32):
      4000 roundings of the loss, for rounding the noise does not show
      because it is the same at every nearby point (a constant in the loss
      rounded once to float32). A healthy float32 forward pass is off by
      1e-7 to 1e-5 of the loss.

    A different random draw (another dropout mask or noise over a share p
    of the units) moves the loss by a share of order p: percents, two
    orders above both bounds.
    """
    unit = unit_roundoff(evaluator.loss_dtype or "float32")
    checked = evaluator.checked
    theta = [evaluator.saved64(v) for v in checked]
    units = [evaluator.unit(v) for v in checked]
    grads = [None if g is None else np.asarray(g, np.float64) for g in gradients]
    sigma = probes.measure_noise(evaluator, checked, theta, grads, units, loss, np.random.default_rng(seed))
    allowed = max(100.0 * sigma, math.sqrt(unit) * max(abs(loss), abs(twin_loss)))
    return abs(loss - twin_loss), allowed


def gap(report, gradients, references, rows, tolerance=FLOAT32_TOLERANCE):
    """``report`` with each row's gradient held against a reference (the float64 twin's), gradients given.

    Args:
      report: The twin's ``GradientCheckReport``.
      gradients: The model's gradient per variable (numpy, or None), in the twin's variable order.
      references: The twin's gradient per variable (numpy, or None).
      rows: The twin's rows (``algorithm.Layout`` or ``variables.Rows``).
      tolerance: The relative gap above which a row is a mismatch.

    Returns:
      The report, rows changed as ``float32_gap`` says.
    """
    # By name: a re-check's report holds only some of the rows (settle).
    members = dict(zip(rows.layer_names, algorithm.layer_members(rows)))
    typical = _typical_gradient(references)
    layers = tuple(
        _row(r, [gradients[i] for i in members[r.name]], [references[i] for i in members[r.name]], tolerance, typical)
        for r in report.layers
    )
    per_variable = None
    if report.variables is not None:
        index = {name: i for i, name in enumerate(rows.variable_names)}
        per_variable = tuple(
            _row(r, [gradients[index[r.name]]], [references[index[r.name]]], tolerance, typical)
            for r in report.variables
        )
    return dataclasses.replace(report, layers=layers, variables=per_variable)


def _typical_gradient(references):
    """The RMS element of the twin's gradient over every variable (0 when none is finite)."""
    finite = [r for r in references if r is not None and np.all(np.isfinite(r))]
    size = sum(r.size for r in finite)
    return math.sqrt(sum(float(np.sum(r * r)) for r in finite) / size) if size else 0.0


def _row(row, gradients, references, tolerance, typical=0.0):
    """One row, a mismatch if its gradient is too far from the reference (the twin's).

    The gap is measured against the row's own float64 gradient, but never
    against less than sqrt(u) (u: float32's unit roundoff, so 4,000
    roundings) of a gradient of the model's typical element size ``typical``
    over the row: a gradient that is zero in exact arithmetic (the bias
    before a BatchNorm, whose batch mean cancels it) is a few roundings in
    float32 and ~1e-17 in float64, a relative gap of 1e8 that is no bug. A
    healthy float32 backward pass is off by ~1e-5 of the model's gradients;
    the precision bugs this is for are percents of them.
    """
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
    floor = math.sqrt(unit_roundoff("float32")) * typical * math.sqrt(sum(r.size for _, r in pairs))
    if finite and distance <= max(tolerance * reference, floor):
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
