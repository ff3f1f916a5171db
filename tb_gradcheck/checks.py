"""Numeric-vs-analytic gradient check per layer: directional derivatives by central differences.

``check_gradients`` compares, for each layer (grouped as the writer groups
them, see ``grouping.Rows``) and optionally each variable, the analytic
directional derivative <g, d> from one backward pass with a numeric one from
central differences of the loss along the same direction d. The cost is a
fixed number of loss evaluations per row, 4 per probe, plus 9 in all and one
backward pass: it grows with the number of layers, not of parameters.

The numerics in short (docs/gradient_check.md has the long form):

- Noise. The rounding noise sigma of one loss evaluation is measured first:
  8 evaluations at points a few ulps away from theta (``_measure_noise``).
- Directions. Probe 0 of a row runs along the row's own analytic gradient,
  where the directional derivative is largest (|g|, against ~|g|/sqrt(n) for
  a random direction of an n-parameter row): float32 resolves it even in wide
  layers, and an error with a component along g (wrong scale, sign, a missing
  term, a transposed or permuted gradient) shows there. The other probes run
  along Gaussian random directions and catch errors orthogonal to g when the
  precision allows.
- Step. Central differences have truncation error ~h^2 and rounding error
  sigma / (sqrt(2) h). The step is the smallest h whose rounding error is
  sqrt(u) of the derivative (u: unit roundoff; 2.4e-4 in float32): small
  steps keep truncation negligible and make ReLU kinks inside the step rare.
- Error bar. Each probe evaluates the loss at -2h, -h, +h, +2h (f(0) is
  shared). The odd residual D(2h) - D(h) (Richardson's comparison) measures
  truncation and kinks off the point, the even fourth difference kinks at the
  point; with the measured noise they make a bound E on the error of the
  numeric derivative (``check_verdict.error_bound``).
- Verdict, with tolerance tau and scale = max(|a|, |n|): "ok" if
  |a - n| + E <= tau * scale (the analytic value is within tau of the truth);
  "mismatch" if |a - n| > E + tau * scale (it is off by more than tau even
  granting the numeric value its whole error bar) and the loss is smooth
  within the step; "inconclusive" otherwise: below the noise floor, an error
  bar wider than the tolerance, or a kink. Random directions convict only
  when confirmed at h/8 and by two probes (``check_probes.Prober.confirm``,
  ``check_verdict.row_verdict``): in wide ReLU layers they are unreliable.
- Blind spots. Directions with a zero analytic derivative (over the
  elements whose gradient is exactly zero, by default; over 64-element
  blocks, orthogonal to their gradient, with ``thorough=True``) see errors
  confined to part of a row; a resolved numeric derivative there convicts
  once confirmed at h/8 and along a second direction.
- Power and location. Each row states the smallest relative error along its
  gradient it would have convicted (``CheckRow.min_detectable_error``); a
  mismatch is bisected to the variable, rows, columns or element at fault
  (``check_locate``).

The parts: ``check_report`` (report types, no TensorFlow), ``check_verdict``
(the decisions, no TensorFlow), ``check_probes`` (directions, steps,
evaluations), ``check_locate`` (bisection), ``check_state`` (tracing,
snapshot and restoration); this module validates and runs them.

Nothing is lost: every variable the loss reads is snapshot before the first
evaluation and restored bit for bit in a ``finally``, also when ``loss_fn``
raises. This module does no I/O; ``GradientWriter.write_check`` writes reports.
"""

import dataclasses
import math
import warnings

import numpy as np
import tensorflow as tf

from tb_gradcheck import check_locate
from tb_gradcheck import check_probes
from tb_gradcheck import check_state
from tb_gradcheck import check_verdict
from tb_gradcheck import grouping
from tb_gradcheck import metadata
from tb_gradcheck import validate
from tb_gradcheck.check_report import BLOCK
from tb_gradcheck.check_report import GRADIENT
from tb_gradcheck.check_report import INCONCLUSIVE
from tb_gradcheck.check_report import MISMATCH
from tb_gradcheck.check_report import OK
from tb_gradcheck.check_report import STATUSES
from tb_gradcheck.check_report import ZERO_SET
from tb_gradcheck.check_report import CheckRow
from tb_gradcheck.check_report import GradientCheckReport
from tb_gradcheck.check_report import Probe

__all__ = ["INCONCLUSIVE", "MISMATCH", "OK", "STATUSES", "CheckRow", "GradientCheckReport", "Probe", "check_gradients"]

DEFAULT_PROBES = 3
# A directional derivative more than 1% off is reported as a mismatch. Below
# that, float32 checks of real layers cannot separate a wrong gradient from
# rounding and curvature reliably, and a bug of a few percent or more clears
# it with room to spare.
DEFAULT_TOLERANCE = 1e-2


def check_gradients(
    loss_fn,
    variables,
    *,
    probes=DEFAULT_PROBES,
    epsilon=None,
    seed=None,
    granularity="layer",
    tolerance=None,
    thorough=False,
):
    """Checks the analytic gradient of ``loss_fn`` against central differences, per layer.

    Example:

        report = tb_gradcheck.check_gradients(
            lambda: loss_object(y, model(x, training=False)), model.trainable_variables, seed=0)
        print(report)          # one row per layer
        assert report.ok, report.failures

    Args:
      loss_fn: Zero-argument callable returning a scalar floating-point loss
        that reads ``variables``; a ``tf.function`` is used as it is, any
        other callable is traced with ``tf.function`` for this call (as
        Keras's ``fit`` does), or evaluated eagerly if it cannot be traced.
        It must be deterministic: call Keras models with ``training=False``,
        or fix the seeds of dropout.
      variables: The variables to check (for a Keras model,
        ``model.trainable_variables``), grouped into layers as
        ``GradientWriter`` groups them.
      probes: Int, default 3. Directions per row: the first along the row's
        analytic gradient, the rest random. Each costs 4 loss evaluations.
        A row whose analytic gradient has exact zeros (a cut path, a dead
        unit, an unused embedding row) also gets a probe over those elements,
        where the analytic derivative is zero: a numeric one resolved there
        is a mismatch once confirmed (4 evaluations, 12-16 more when it
        disagrees).
      epsilon: Float or None (default). The finite-difference step as a
        fraction of the row's scale: the norm of its parameters, or sqrt(n)
        times the RMS of all checked parameters if that is larger (so a bias
        near zero is not probed with a vanishing step). None chooses the step
        per probe from the measured noise and the size of the derivative.
      seed: Int or None (default). Seed of the random directions; the same
        seed on the same state gives the same report. None draws one, which
        the report records.
      granularity: ``"layer"`` (default) checks each layer along joint
        directions; ``"variable"`` also checks every variable on its own.
      tolerance: Float or None (default). Relative error above which a
        resolved difference is reported as a mismatch. None: 0.01 when the
        loss or a checked variable is float32 or coarser, 4.3e-7 when all are
        float64 (the same three error bars; see ``default_tolerance``).
      thorough: Bool, default False. Also probe every variable block by
        block (blocks of at most 64 elements), each along a direction
        orthogonal to the block's gradient, so an error confined to a few
        elements is not drowned by the rest of the row: one element of a
        4,096-parameter float32 kernel wrong by 100% is caught at >= 95% of
        seeds. Cost: 4 more loss evaluations per block, i.e. about
        n / 16 for n parameters (compute_gradient makes 2 n), plus 12-16 per
        block that disagrees. No false mismatch was seen over the clean
        models of benchmarks/check_power.py.

    A row that is a mismatch is then narrowed by bisection along the
    convicting direction to the variable, rows, columns or element at fault
    (``CheckRow.location``): 4 evaluations per halving, at most ~4 log2(n).

    TensorFloat-32 execution (on by default on recent NVIDIA GPUs) is turned
    off during the check, so float32 models are checked in float32, and put
    back as it was.

    Returns:
      A ``GradientCheckReport``.

    Raises:
      TypeError: ``loss_fn`` is not callable or does not return a
        floating-point tensor; ``variables`` hold something else than
        floating-point variables; an argument has the wrong type.
      ValueError: An empty or repeated variable list, a non-scalar loss, an
        argument out of range, or a call inside ``tf.function``.
      Anything ``loss_fn`` raises, after every variable has been restored.
    """
    if tf.inside_function():
        raise ValueError(
            "Expected check_gradients to be called eagerly, outside tf.function (it compares concrete loss "
            "values). Received: a call while tracing a tf.function"
        )
    if not callable(loss_fn):
        raise TypeError(f"Expected `loss_fn` to be a zero-argument callable. Received: {type(loss_fn).__name__}")
    variables = validate.variables(variables)  # non-empty, distinct, floating-point variables
    rows = grouping.Rows(variables)
    probes = validate.positive_int(probes, "probes")
    if epsilon is not None:
        epsilon = validate.fraction(epsilon, "epsilon")
    if tolerance is not None:
        tolerance = validate.fraction(tolerance, "tolerance")
    thorough = validate.boolean(thorough, "thorough")
    granularity = validate.one_of(granularity, "granularity", metadata.GRANULARITIES)
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % (2**63))
    seed = validate.non_negative_int(seed, "seed")

    checked = [check_state.tf_variable(v) for v in variables]
    # On Ampere and newer GPUs TensorFlow runs float32 matmuls and
    # convolutions in TensorFloat-32 by default: inputs rounded to 10 mantissa
    # bits (relative 2**-11 = 4.9e-4), coarser than a float32 step of sqrt(u)
    # = 2.4e-4, so most perturbed weights would not change inside the matmul
    # and the difference would not be a derivative at all. That rounding is
    # not a gradient bug: the check runs in true float32 and puts the
    # caller's setting back afterwards (a no-op without such a GPU).
    tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        evaluator = check_state.Evaluator(loss_fn, checked)
        try:
            layers, per_variable, f0, sigma, tolerance = _run(
                evaluator, checked, rows, probes, epsilon, seed, granularity, tolerance, thorough
            )
        finally:
            changed = evaluator.restore_all()
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(tf32)
    if changed:
        warnings.warn(
            "loss_fn changed variables other than the ones checked "
            f"({', '.join(sorted(changed))}), e.g. BatchNormalization moving statistics in training mode; "
            "check_gradients restored them bit for bit. Call the model with training=False in loss_fn "
            "to check the inference-mode gradient without this.",
            stacklevel=2,
        )
    return GradientCheckReport(
        layers=tuple(layers),
        variables=None if per_variable is None else tuple(per_variable),
        loss=f0,
        noise=sigma,
        dtype=evaluator.dtype.name,
        seed=seed,
        probes=probes,
        tolerance=tolerance,
        evaluations=evaluator.evaluations,
        thorough=thorough,
    )


def _run(evaluator, checked, rows, probes, epsilon, seed, granularity, tolerance, thorough):
    """The check itself, with every variable already snapshot by ``evaluator``; also returns the tolerance used."""
    f0 = evaluator.loss()
    units = [check_state.unit_roundoff(v.dtype) for v in checked]
    if tolerance is None:
        tolerance = default_tolerance(max(units + [check_state.unit_roundoff(evaluator.dtype)]))
    if not math.isfinite(f0):
        # Nothing to difference: every row is undecided, at the cost of one evaluation.
        def undecided(names, kind, sizes):
            return [
                CheckRow(
                    n,
                    kind,
                    size,
                    math.nan,
                    math.nan,
                    math.nan,
                    math.nan,
                    INCONCLUSIVE,
                    "the loss is not finite at this point",
                    (),
                )
                for n, size in zip(names, sizes)
            ]

        layers = undecided(rows.layer_names, "layer", rows.layer_sizes)
        per_variable = undecided(rows.variable_names, "variable", rows.variable_sizes)
        return layers, (per_variable if granularity == "variable" else None), f0, math.nan, tolerance
    gradients = evaluator.gradients()
    theta = [evaluator.saved_value(v).astype(np.float64) for v in checked]
    grads = [None if g is None else np.asarray(g, np.float64) for g in gradients]
    rng = np.random.default_rng(seed)
    loss_unit = check_state.unit_roundoff(evaluator.dtype)
    # One rounding of the loss itself is the least noise there can be.
    sigma = max(check_probes.measure_noise(evaluator, checked, theta, grads, units, f0, rng), loss_unit * abs(f0))
    prober = check_probes.Prober(evaluator, f0, sigma, tolerance, epsilon, rng)

    groups = [
        (
            "layer",
            [[i for i, layer in enumerate(rows.layer_of) if layer == j] for j in range(len(rows.layer_names))],
            rows.layer_names,
        )
    ]
    if granularity == "variable":
        groups.append(("variable", [[i] for i in range(len(checked))], rows.variable_names))
    sizes = sum(t.size for t in theta)
    typical = math.sqrt(sum(float(np.sum(t * t)) for t in theta) / max(sizes, 1)) or 1.0
    typical_gradient = math.sqrt(sum(float(np.sum(g * g)) for g in grads if g is not None) / max(sizes, 1))
    out = {"layer": [], "variable": []}
    for kind, members, names in groups:
        for index, name in zip(members, names):
            row = check_probes.RowParams(
                [checked[i] for i in index],
                [rows.variable_names[i] for i in index],
                [theta[i] for i in index],
                [grads[i] for i in index],
                max(units[i] for i in index),
                typical,
                typical_gradient,
            )
            try:
                out[kind].append(_check_row(prober, row, name, kind, probes, thorough))
            finally:
                row.restore(evaluator)
    return out["layer"], (out["variable"] if granularity == "variable" else None), f0, sigma, tolerance


def _check_row(prober, row, name, kind, probes, thorough):
    """Probes one row (see check_gradients for which probes), judges it and, if it is a mismatch, locates the fault."""
    judged = []  # (probe, direction)
    for k in range(probes):
        direction, kind_k = row.direction(k, prober.rng)
        judged.append((prober.probe(row, direction, kind_k), direction))
    if row.has_zero_set():
        judged += prober.blind_spot(row, row.zero_masks, ZERO_SET)
    if thorough:
        for direction in row.variable_directions():
            judged.append((prober.probe(row, direction, GRADIENT), direction))
        for masks in row.blocks():
            judged += prober.blind_spot(row, masks, BLOCK)
    verdict = check_verdict.row_verdict(name, kind, row.size, [p for p, _ in judged], prober.tolerance)
    if verdict.status != MISMATCH:
        return verdict
    # Locate along the convicting probe with the widest margin: the largest
    # resolved discrepancy against its error bar.
    convicted = [(p, d) for p, d in judged if p.status == MISMATCH and math.isfinite(p.analytic)]
    if not convicted:
        return verdict
    probe, direction = max(
        convicted, key=lambda pd: abs(pd[0].analytic - pd[0].numeric) / max(pd[0].error_bound, 1e-300)
    )
    return dataclasses.replace(verdict, location=check_locate.locate(prober, row, direction, probe))


def default_tolerance(unit):
    """The tolerance for a check whose coarsest dtype has unit roundoff ``unit``.

    DEFAULT_TOLERANCE is about three error bars in float32 (the error bar is
    ~14 sqrt(u) = 0.34% of the derivative, see check_probes). The error bar
    scales as sqrt(u), so the same three bars are DEFAULT_TOLERANCE
    sqrt(u / u_float32): 4.3e-7 in float64, where a 1e-6 error in a float64
    gradient is then visible. Coarser dtypes keep DEFAULT_TOLERANCE: they
    resolve little anyway, and a looser tolerance would call percent errors ok.
    """
    return DEFAULT_TOLERANCE * min(1.0, math.sqrt(unit / 2.0**-24))
