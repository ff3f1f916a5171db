"""The gradient check's algorithm, written once for every framework: rows, noise, probes, verdicts, location.

``run`` compares, for each layer (grouped as the writer groups them) and
optionally each variable, the analytic directional derivative <g, d> from
one backward pass with a numeric one from central differences of the loss
along the same direction d. The cost is a fixed number of loss evaluations
per row, 4 per probe, plus 9 in all and one backward pass: it grows with the
number of layers, not of parameters. It runs on float64 numpy arrays and
reaches the framework only through a ``Evaluator``
(TensorFlow: ``checks.check_gradients``; PyTorch:
``tb_gradcheck.torch.check_gradients``), so both frameworks get the same
rows, probes, steps, error bars, verdicts and report.

The numerics in short (docs/gradient_check.md has the long form):

- Noise. The rounding noise sigma of one loss evaluation is measured first:
  8 evaluations at points a few ulps away from theta (``probes.measure_noise``).
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
  numeric derivative (``verdict.error_bound``).
- Verdict, with tolerance tau and scale = max(|a|, |n|): "ok" if
  |a - n| + E <= tau * scale (the analytic value is within tau of the truth);
  "mismatch" if |a - n| > E + tau * scale (it is off by more than tau even
  granting the numeric value its whole error bar) and the loss is smooth
  within the step; "inconclusive" otherwise: below the noise floor, an error
  bar wider than the tolerance, or a kink. Random directions convict only
  when confirmed at h/8 and by two probes (``probes.Prober.confirm``,
  ``verdict.row_verdict``): in wide ReLU layers they are unreliable.
- Blind spots. Directions with a zero analytic derivative (over the
  elements whose gradient is exactly zero, by default; over 64-element
  blocks, orthogonal to their gradient, with ``thorough=True``) see errors
  confined to part of a row; a resolved numeric derivative there convicts
  once confirmed at h/8 and along a second direction.
- Power and location. Each row states the smallest relative error along its
  gradient it would have convicted (``CheckRow.min_detectable_error``); a
  mismatch is bisected to the variable, rows, columns or element at fault
  (``locate``).

The parts: ``report`` (report types), ``verdict`` (the
decisions), ``probes`` (directions, steps, evaluations),
``locate`` (bisection), ``evaluator`` (what a framework
provides); this module validates the options and runs them. None of them
imports a framework.
"""

import dataclasses
import math

import numpy as np

from tb_gradcheck.check import locate
from tb_gradcheck.check import probes
from tb_gradcheck.check.evaluator import unit_roundoff
from tb_gradcheck.check.report import BLOCK
from tb_gradcheck.check.report import GRADIENT
from tb_gradcheck.check.report import INCONCLUSIVE
from tb_gradcheck.check.report import MISMATCH
from tb_gradcheck.check.report import ZERO_SET
from tb_gradcheck.check.report import CheckRow
from tb_gradcheck.check.report import GradientCheckReport
from tb_gradcheck.check.verdict import row_verdict
from tb_gradcheck.core import metadata
from tb_gradcheck.core import validate

DEFAULT_PROBES = 3
# A directional derivative more than 1% off is reported as a mismatch. Below
# that, float32 checks of real layers cannot separate a wrong gradient from
# rounding and curvature reliably, and a bug of a few percent or more clears
# it with room to spare.
DEFAULT_TOLERANCE = 1e-2


@dataclasses.dataclass(frozen=True)
class Options:
    """The check's options, validated (see ``checks.check_gradients`` for each)."""

    probes: int
    epsilon: float
    seed: int
    granularity: str
    tolerance: float
    thorough: bool


def options(probes, epsilon, seed, granularity, tolerance, thorough):
    """Validates the options every front takes; draws a seed when ``seed`` is None.

    Raises:
      TypeError, ValueError: An option of the wrong kind or out of range.
    """
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
    return Options(probes, epsilon, seed, granularity, tolerance, thorough)


class Layout:
    """The rows of a check: variables named and grouped into layers, layers in order of first appearance.

    ``variables.Rows`` (TensorFlow's variables) has the same three
    attributes and can stand in for it.

    Args:
      variable_names: Unique name of each checked variable, in order.
      owners: The layer each variable belongs to, by name.
    """

    def __init__(self, variable_names, owners):
        self.variable_names = list(variable_names)
        self.layer_names = list(dict.fromkeys(owners))
        index = {name: i for i, name in enumerate(self.layer_names)}
        self.layer_of = [index[o] for o in owners]


def layer_members(rows):
    """For each layer of ``rows`` (a ``Layout`` or ``variables.Rows``), the indices of its variables."""
    return [[i for i, layer in enumerate(rows.layer_of) if layer == j] for j in range(len(rows.layer_names))]


def run(evaluator, layout, opts, only=None):
    """Runs the check with every parameter already snapshot by ``evaluator``; the caller restores them.

    Args:
      evaluator: A ``Evaluator`` over the checked parameters,
        in the order of ``layout.variable_names``.
      layout: A ``Layout`` (or ``variables.Rows``).
      opts: ``Options``.
      only: None (default: every row), or the rows to check as a set of
        ``(granularity, name)`` pairs; the report holds only those (the
        float64 re-check of the rows float32 left open, ``settle``). The
        noise and the gradient are measured once for all rows either way.

    Returns:
      A ``GradientCheckReport``.
    """
    layers, per_variable, f0, sigma, tolerance = _run(evaluator, layout, opts, only)
    return GradientCheckReport(
        layers=tuple(layers),
        variables=None if per_variable is None else tuple(per_variable),
        loss=f0,
        noise=sigma,
        dtype=evaluator.loss_dtype,
        seed=opts.seed,
        probes=opts.probes,
        tolerance=tolerance,
        evaluations=evaluator.evaluations,
        thorough=opts.thorough,
    )


def _run(evaluator, rows, opts, only=None):
    """The check itself; also returns the tolerance used."""

    def wanted(kind, name):
        return only is None or (kind, name) in only

    checked = evaluator.checked
    granularity, tolerance = opts.granularity, opts.tolerance
    f0 = evaluator.loss()
    units = [evaluator.unit(v) for v in checked]
    loss_unit = unit_roundoff(evaluator.loss_dtype)
    if tolerance is None:
        tolerance = default_tolerance(max(units + [loss_unit]))
    members = layer_members(rows)
    if not math.isfinite(f0):
        # Nothing to difference: every row is undecided, at the cost of one evaluation.
        sizes = [int(np.prod(evaluator.saved64(v).shape)) for v in checked]

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
                if wanted(kind, n)
            ]

        layers = undecided(rows.layer_names, "layer", [sum(sizes[i] for i in m) for m in members])
        per_variable = undecided(rows.variable_names, "variable", sizes)
        return layers, (per_variable if granularity == "variable" else None), f0, math.nan, tolerance
    gradients = evaluator.gradients()
    theta = [evaluator.saved64(v) for v in checked]
    grads = [None if g is None else np.asarray(g, np.float64) for g in gradients]
    rng = np.random.default_rng(opts.seed)
    # One rounding of the loss itself is the least noise there can be.
    sigma = max(probes.measure_noise(evaluator, checked, theta, grads, units, f0, rng), loss_unit * abs(f0))
    prober = probes.Prober(evaluator, f0, sigma, tolerance, opts.epsilon, rng)

    groups = [("layer", members, rows.layer_names)]
    if granularity == "variable":
        groups.append(("variable", [[i] for i in range(len(checked))], rows.variable_names))
    sizes = sum(t.size for t in theta)
    typical = math.sqrt(sum(float(np.sum(t * t)) for t in theta) / max(sizes, 1)) or 1.0
    typical_gradient = math.sqrt(sum(float(np.sum(g * g)) for g in grads if g is not None) / max(sizes, 1))
    out = {"layer": [], "variable": []}
    for kind, index_lists, names in groups:
        for index, name in zip(index_lists, names):
            if not wanted(kind, name):
                continue
            row = probes.RowParams(
                [checked[i] for i in index],
                [rows.variable_names[i] for i in index],
                [theta[i] for i in index],
                [grads[i] for i in index],
                max(units[i] for i in index),
                typical,
                typical_gradient,
            )
            try:
                out[kind].append(_check_row(prober, row, name, kind, opts.probes, opts.thorough))
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
    verdict = row_verdict(name, kind, row.size, [p for p, _ in judged], prober.tolerance)
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
    return dataclasses.replace(verdict, location=locate.locate(prober, row, direction, probe))


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
