"""Numeric-vs-analytic gradient check per layer: directional derivatives by central differences.

``check_gradients`` compares, for each layer (grouped as the writer groups
them, see ``stats.Rows``) and optionally each variable, the analytic
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
  numeric derivative (``_error_bound``).
- Verdict, with tolerance tau and scale = max(|a|, |n|): "ok" if
  |a - n| + E <= tau * scale (the analytic value is within tau of the truth);
  "mismatch" if |a - n| > E + tau * scale (it is off by more than tau even
  granting the numeric value its whole error bar) and the loss is smooth
  within the step; "inconclusive" otherwise: below the noise floor, or a kink.
  Random directions convict only when confirmed at h/8 and by two probes
  (``_confirm``, ``_row``): in wide ReLU layers they are unreliable.

Nothing is lost: every variable the loss reads is snapshot before the first
evaluation and restored bit for bit in a ``finally``, also when ``loss_fn``
raises. This module does no I/O; ``GradientWriter.write_check`` writes reports.
"""

import dataclasses
import math
import numbers
import warnings

import numpy as np
import tensorflow as tf

from tb_gradcheck import metadata
from tb_gradcheck import stats

DEFAULT_PROBES = 3
# A directional derivative more than 1% off is reported as a mismatch. Below
# that, float32 checks of real layers cannot separate a wrong gradient from
# rounding and curvature reliably, and a bug of a few percent or more clears
# it with room to spare.
DEFAULT_TOLERANCE = 1e-2

STATUSES = metadata.CHECK_STATUSES
OK, INCONCLUSIVE, MISMATCH = STATUSES

# The step h is chosen so that the expected rounding error of the central
# difference, sigma / (sqrt(2) h), is sqrt(u) of |<g, d>| (u: unit roundoff;
# float32 2.4e-4, float64 1.5e-8). For a loss of relative noise u this puts
# the relative step near sqrt(u) too: the perturbation is then ~1/sqrt(u)
# ulps of each parameter (its own rounding is a sqrt(u) effect, and is
# measured exactly anyway), truncation is O(h^2) ~ u, and the error bar E,
# ~14x the rounding error (see _error_bound), is 0.3% of the derivative in
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
# parameters; see _RowParams): at least
# 2**10 units of roundoff, so that theta + h d differs from theta in most
# elements (the perturbation actually applied is measured exactly anyway), and
# at most 1%, beyond which a "derivative" says little about the point.
_MIN_STEP_ULPS = 2.0**10
_MAX_RELATIVE_STEP = 1e-2
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

# A random probe's mismatch is re-measured at h / _CONFIRM_RATIO, and a row
# needs _RANDOM_CONVICTIONS confirmed random mismatches when its gradient
# probe does not convict (see _confirm).
_CONFIRM_RATIO = 8.0
_RANDOM_CONVICTIONS = 2

_GRADIENT, _RANDOM = "gradient", "random"


@dataclasses.dataclass(frozen=True)
class Probe:
    """One directional-derivative comparison along one direction.

    Attributes:
      direction: ``"gradient"`` (along the row's analytic gradient) or ``"random"``.
      step: The step h along the unit direction, in parameter units.
      analytic: The analytic directional derivative <g, d>.
      numeric: The central difference (f(+h) - f(-h)) / 2h.
      error_bound: E, the bound on the error of ``numeric``.
      relative_error: |analytic - numeric| / max(|analytic|, |numeric|, E).
      status: ``"ok"``, ``"inconclusive"`` or ``"mismatch"``.
      reason: Why the probe is inconclusive (or why it is ok without a
        comparison); empty otherwise.
    """

    direction: str
    step: float
    analytic: float
    numeric: float
    error_bound: float
    relative_error: float
    status: str
    reason: str = ""

    def to_dict(self):
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class CheckRow:
    """The check of one layer or one variable.

    ``analytic``, ``numeric``, ``relative_error`` and ``noise_floor`` are
    those of the probe that decides the status: the worst mismatching probe,
    the worst agreeing probe of an ``"ok"`` row, or the probe with the tightest
    error bar of an ``"inconclusive"`` one.

    Attributes:
      name: Row name, as the writer names it.
      granularity: ``"layer"`` or ``"variable"``.
      size: Number of parameters in the row.
      analytic: Analytic directional derivative of the deciding probe.
      numeric: Numeric directional derivative of the deciding probe.
      relative_error: |analytic - numeric| / max(|analytic|, |numeric|, noise_floor).
      noise_floor: The deciding probe's error bound E, in the units of
        ``analytic``: the smallest discrepancy this check can resolve.
      status: ``"ok"``, ``"inconclusive"`` or ``"mismatch"``.
      reason: One line on why, for inconclusive rows.
      probes: Every ``Probe`` of the row.
    """

    name: str
    granularity: str
    size: int
    analytic: float
    numeric: float
    relative_error: float
    noise_floor: float
    status: str
    reason: str
    probes: tuple

    def to_dict(self):
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "probes"}
        out["probes"] = [p.to_dict() for p in self.probes]
        return out


@dataclasses.dataclass(frozen=True)
class GradientCheckReport:
    """What ``check_gradients`` found.

    Attributes:
      layers: ``CheckRow`` per layer, in depth order (the writer's order).
      variables: ``CheckRow`` per variable when checked per variable, else None.
      loss: The loss at the unperturbed point.
      noise: The measured rounding noise (standard deviation) of one loss
        evaluation, in loss units.
      dtype: Name of the loss dtype.
      seed: The seed of the random directions (the one drawn when None was given).
      probes: Probes per row.
      tolerance: Relative error above which a resolved difference is a mismatch.
      evaluations: Loss evaluations made (the backward pass not counted).
    """

    layers: tuple
    variables: tuple
    loss: float
    noise: float
    dtype: str
    seed: int
    probes: int
    tolerance: float
    evaluations: int

    @property
    def rows(self):
        """Every row: the layers, then the variables (if checked)."""
        return self.layers + (self.variables or ())

    @property
    def ok(self):
        """True when no row is a mismatch (inconclusive rows are not failures)."""
        return not self.failures

    @property
    def failures(self):
        """The rows (layers, then variables) whose status is ``"mismatch"``."""
        return [r for r in self.rows if r.status == MISMATCH]

    @property
    def inconclusive(self):
        """The rows this check could not decide."""
        return [r for r in self.rows if r.status == INCONCLUSIVE]

    def to_dict(self):
        """A JSON-able dict of the whole report, every probe included."""
        return {
            "loss": self.loss,
            "noise": self.noise,
            "dtype": self.dtype,
            "seed": self.seed,
            "probes": self.probes,
            "tolerance": self.tolerance,
            "evaluations": self.evaluations,
            "ok": self.ok,
            "layers": [r.to_dict() for r in self.layers],
            "variables": None if self.variables is None else [r.to_dict() for r in self.variables],
        }

    def __str__(self):
        groups = [("layer", self.layers)]
        if self.variables is not None:
            groups.append(("variable", self.variables))
        counts = {s: sum(r.status == s for r in self.rows) for s in STATUSES}
        verdict = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        lines = [
            f"Gradient check: loss {self.loss:.6g} ({self.dtype}, noise {self.noise:.1e}), {self.evaluations} loss evaluations, "
            f"{self.probes} probes per row, tolerance {self.tolerance:g}, seed {self.seed}: {verdict}"
        ]
        for title, rows in groups:
            width = max([len(title)] + [len(r.name) for r in rows])
            lines.append("")
            lines.append(
                f"{title:<{width}}  {'analytic':>12}  {'numeric':>12}  {'difference':>10}  "
                f"{'rel. error':>10}  {'noise floor':>11}  status"
            )
            for r in rows:
                note = f" ({r.reason})" if r.reason else ""
                lines.append(
                    f"{r.name:<{width}}  {r.analytic:>12.5e}  {r.numeric:>12.5e}  "
                    f"{abs(r.analytic - r.numeric):>10.2e}  {r.relative_error:>10.2e}  "
                    f"{r.noise_floor:>11.2e}  {r.status}{note}"
                )
        return "\n".join(lines)


def check_gradients(loss_fn, variables, *, probes=DEFAULT_PROBES, epsilon=None, seed=None,
                    granularity="layer", tolerance=DEFAULT_TOLERANCE):
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
      tolerance: Float, default 0.01. Relative error above which a resolved
        difference is reported as a mismatch.

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
    if isinstance(variables, (tf.Tensor, tf.Variable, np.ndarray)) or not hasattr(variables, "__iter__"):
        raise TypeError(f"Expected `variables` to be a list of variables. Received: {type(variables).__name__}")
    variables = list(variables)
    rows = stats.Rows(variables)  # validates: non-empty, unique, floating-point variables
    probes = _positive_int(probes, "probes")
    if epsilon is not None:
        epsilon = _fraction(epsilon, "epsilon")
    tolerance = _fraction(tolerance, "tolerance")
    if granularity not in metadata.GRANULARITIES:
        raise ValueError(
            f"Expected `granularity` to be one of {list(metadata.GRANULARITIES)}. Received: {granularity!r}"
        )
    if seed is None:
        seed = int(np.random.SeedSequence().entropy % (2**63))
    elif isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise ValueError(f"Expected `seed` to be a non-negative integer or None. Received: {seed!r}")
    seed = int(seed)

    checked = [_tf_variable(v) for v in variables]
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
        evaluator = _Evaluator(loss_fn, checked)
        try:
            layers, per_variable, f0, sigma = _run(evaluator, checked, rows, probes, epsilon, seed, granularity,
                                                   tolerance)
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
    )


def _run(evaluator, checked, rows, probes, epsilon, seed, granularity, tolerance):
    """The check itself, with every variable already snapshot by ``evaluator``."""
    f0 = evaluator.loss()
    if not math.isfinite(f0):
        # Nothing to difference: every row is undecided, at the cost of one evaluation.
        def undecided(names, kind, sizes):
            return [CheckRow(n, kind, size, math.nan, math.nan, math.nan, math.nan, INCONCLUSIVE,
                             "the loss is not finite at this point", ()) for n, size in zip(names, sizes)]

        layers = undecided(rows.layer_names, "layer", rows.layer_sizes)
        per_variable = undecided(rows.variable_names, "variable", rows.variable_sizes)
        return layers, (per_variable if granularity == "variable" else None), f0, math.nan
    gradients = evaluator.gradients()
    theta = [evaluator.saved_value(v).astype(np.float64) for v in checked]
    grads = [None if g is None else np.asarray(g, np.float64) for g in gradients]
    units = [_unit_roundoff(v.dtype) for v in checked]
    rng = np.random.default_rng(seed)
    loss_unit = _unit_roundoff(evaluator.dtype)
    # One rounding of the loss itself is the least noise there can be.
    sigma = max(_measure_noise(evaluator, checked, theta, grads, units, f0, rng), loss_unit * abs(f0))

    groups = [("layer", [[i for i, layer in enumerate(rows.layer_of) if layer == j]
                         for j in range(len(rows.layer_names))], rows.layer_names)]
    if granularity == "variable":
        groups.append(("variable", [[i] for i in range(len(checked))], rows.variable_names))
    sizes = sum(t.size for t in theta)
    typical = math.sqrt(sum(float(np.sum(t * t)) for t in theta) / max(sizes, 1)) or 1.0
    out = {"layer": [], "variable": []}
    for kind, members, names in groups:
        for index, name in zip(members, names):
            row = _RowParams([checked[i] for i in index], [theta[i] for i in index], [grads[i] for i in index],
                             typical)
            unit = max(units[i] for i in index)
            judged = []
            try:
                for k in range(probes):
                    direction, kind_k = row.direction(k, rng)
                    m = _measure(evaluator, row, direction, kind_k, f0, sigma, unit, epsilon)
                    probe = _judge(m, sigma, tolerance)
                    if probe.status == MISMATCH and kind_k == _RANDOM and math.isfinite(probe.analytic):
                        probe = _confirm(evaluator, row, direction, probe, f0, sigma, unit, tolerance)
                    judged.append(probe)
            finally:
                row.restore(evaluator)
            out[kind].append(_row(name, kind, row.size, judged))
    return out["layer"], (out["variable"] if granularity == "variable" else None), f0, sigma


def _measure_noise(evaluator, checked, theta, grads, units, f0, rng):
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


class _RowParams:
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
            return [g / self.grad_norm for g in self.grads], _GRADIENT
        d = [rng.standard_normal(t.shape) for t in self.theta]
        norm = math.sqrt(sum(float(np.sum(x * x)) for x in d))
        return [x / norm for x in d], _RANDOM

    def dot(self, vectors):
        return sum(float(np.sum(g * v)) for g, v in zip(self.grads, vectors))

    def restore(self, evaluator):
        for v in self.variables:
            evaluator.reset(v)


def _measure(evaluator, row, direction, kind, f0, sigma, unit, epsilon, step=None):
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


def _error_bound(m, sigma):
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
      not bounded this way; _judge and _confirm deal with them.
    """
    noise = _NOISE_SIGMAS * sigma / (math.sqrt(2.0) * m["h"])
    shape = _ODD_WEIGHT * abs(m["odd"]) + _EVEN_WEIGHT * abs(m["even"]) / m["h"]
    return noise + shape, noise, shape


def _judge(m, sigma, tolerance):
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
    bound, noise, shape = _error_bound(m, sigma)
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


def _confirm(evaluator, row, direction, probe, f0, sigma, unit, tolerance):
    """Re-measures a random probe's mismatch at step h/8; it stands only if it convicts there too.

    Along a random direction of a wide ReLU layer the directional derivative
    is an incoherent sum (~|g|/sqrt(n)) and a handful of kinks within the
    step moves the central difference by percents while D(h) and D(2h) still
    agree: no residual-based bound holds there (in float64, without any
    rounding, 3-8% of such probes break it). Kinks within h/8 are a small
    subset of those within h, so requiring the verdict at both steps cuts
    that to ~0.3%, and _row asks for two such random convictions.
    """
    again = _judge(_measure(evaluator, row, direction, _RANDOM, f0, sigma, unit, None, step=probe.step / _CONFIRM_RATIO),
                   sigma, tolerance)
    if again.status == MISMATCH:
        return dataclasses.replace(probe, reason=f"confirmed at step h/{_CONFIRM_RATIO:g}")
    return dataclasses.replace(
        probe, status=INCONCLUSIVE,
        reason=f"disagrees at step h but not at h/{_CONFIRM_RATIO:g}: the loss is not smooth on the scale of the step",
    )


def _row(name, granularity, size, judged):
    by_status = {s: [p for p in judged if p.status == s] for s in STATUSES}
    # Convicting: the gradient probe (robust, see _confirm) on its own, or
    # two random probes each confirmed at two steps. One confirmed random
    # disagreement with nothing else convicting is conflicting evidence.
    convicting = [p for p in by_status[MISMATCH] if p.direction == _GRADIENT or not math.isfinite(p.analytic)]
    random_hits = [p for p in by_status[MISMATCH] if not any(p is c for c in convicting)]
    if convicting or len(random_hits) >= _RANDOM_CONVICTIONS:
        status, pick = MISMATCH, max(convicting or random_hits, key=_severity)
    elif random_hits:
        pick = random_hits[0]
        return CheckRow(name, granularity, size, pick.analytic, pick.numeric, pick.relative_error, pick.error_bound,
                        INCONCLUSIVE, "only one random direction disagrees (confirmed at two steps)", tuple(judged))
    elif by_status[OK] and all(p.status == OK for p in judged if p.direction == _GRADIENT):
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


class _Evaluator:
    """Evaluates the loss and its gradient, and owns the snapshot of every variable it reads."""

    def __init__(self, loss_fn, checked):
        self._checked = checked
        self._fn, self._state = _trace(loss_fn)
        self.evaluations = 0
        self._dtype = None
        # Every variable the loss reads (from the trace) and the checked
        # ones, each once, snapshot to host memory before anything runs.
        seen, union = set(), []
        for v in list(checked) + list(self._state):
            if id(v) not in seen:
                seen.add(id(v))
                union.append(v)
        self._all = union
        self._saved = {id(v): _read(v) for v in union}
        self._checked_ids = {id(v) for v in checked}
        self._written = None  # the other variables loss_fn writes, found after its first call
        self._changed = set()

    @property
    def dtype(self):
        return self._dtype

    def saved_value(self, v):
        return self._saved[id(v)]

    def loss(self):
        """One loss evaluation as a Python float; state the loss wrote is put back."""
        value = self._fn()
        self.evaluations += 1
        value = _scalar(value)
        if self._dtype is None:
            self._dtype = value.dtype
        self._undo_writes()
        return float(value.numpy())

    def gradients(self):
        """The analytic gradient of each checked variable (numpy, or None where the loss ignores it)."""
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            for v in self._checked:
                tape.watch(v)
            value = _scalar(self._fn())
        grads = tape.gradient(value, self._checked, unconnected_gradients=tf.UnconnectedGradients.NONE)
        self._undo_writes()
        return [None if g is None else tf.convert_to_tensor(g).numpy() for g in grads]

    def perturb(self, variables, theta, direction, step):
        """Sets each variable to fl(theta + step * d); returns the applied perturbations (float64)."""
        applied = []
        for v, t, d in zip(variables, theta, direction):
            value = (t + step * d).astype(v.dtype.as_numpy_dtype)
            v.assign(value)
            applied.append(value.astype(np.float64) - t)
        return applied

    def reset(self, v):
        v.assign(self._saved[id(v)])

    def _undo_writes(self):
        if self._written is None:
            # First call: find what loss_fn wrote by comparing with the snapshot.
            self._written = [v for v in self._all
                             if id(v) not in self._checked_ids and not _same(_read(v), self._saved[id(v)])]
        for v in self._written:
            self._changed.add(_display_name(v))
            v.assign(self._saved[id(v)])

    def restore_all(self):
        """Puts every variable back bit for bit; returns names of the other variables loss_fn changed."""
        for v in self._all:
            current = _read(v)
            saved = self._saved[id(v)]
            if not _same(current, saved):
                if id(v) not in self._checked_ids:
                    self._changed.add(_display_name(v))
                v.assign(saved)
        return self._changed


def _trace(loss_fn):
    """``(callable, variables it reads)``: the concrete function of a trace, or loss_fn itself eagerly."""
    if isinstance(loss_fn, tf.types.experimental.PolymorphicFunction):
        concrete = loss_fn.get_concrete_function()
    else:
        # A fresh tf.function per call: tensors the closure holds are captured
        # as they are now, so a loss_fn over "the current batch" is never stale.
        try:
            concrete = tf.function(loss_fn).get_concrete_function()
        except Exception as e:  # untraceable Python (numpy calls, say): evaluate eagerly
            warnings.warn(
                f"loss_fn could not be traced with tf.function ({type(e).__name__}: {e}); evaluating it eagerly. "
                "Variables it reads other than `variables` cannot be found then, so state it changes there "
                "is not restored.",
                stacklevel=4,
            )
            return loss_fn, []
    _check_output(concrete.structured_outputs)
    return concrete, list(concrete.variables)


def _check_output(out):
    if not isinstance(out, tf.Tensor):
        raise TypeError(
            f"Expected `loss_fn` to return a scalar floating-point tensor. Received: {type(out).__name__}"
        )
    if not out.dtype.is_floating:
        raise TypeError(f"Expected `loss_fn` to return a floating-point loss. Received: dtype {out.dtype.name}")
    if out.shape.is_fully_defined() and out.shape.num_elements() != 1:
        raise ValueError(f"Expected `loss_fn` to return a scalar loss. Received: shape {tuple(out.shape)}")


def _scalar(value):
    if isinstance(value, tf.Variable):
        value = tf.convert_to_tensor(value)
    _check_output(value)
    return tf.reshape(value, [])


def _tf_variable(v):
    if isinstance(v, tf.Variable):
        return v
    inner = getattr(v, "_value", None)  # a Keras 3 variable wraps a tf.Variable
    if isinstance(inner, tf.Variable):
        return inner
    inner = getattr(v, "value", None)
    if isinstance(inner, tf.Variable):
        return inner
    raise TypeError(
        f"Expected tf.Variable or Keras variables backed by TensorFlow. Received: {type(v).__name__}"
    )


def _read(v):
    return np.array(v.numpy(), copy=True)


def _same(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "O":
        return bool(np.array_equal(a, b))
    return a.tobytes() == b.tobytes()


def _display_name(v):
    name = getattr(v, "path", None) or v.name
    return name[:-2] if name.endswith(":0") else name


# Unit roundoff u = 2**-(mantissa bits + 1): the largest relative error of one rounding.
_UNIT_ROUNDOFF = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-24, "float64": 2.0**-53}


def _unit_roundoff(dtype):
    return _UNIT_ROUNDOFF[tf.as_dtype(dtype).name]


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"Expected `{name}` to be a positive integer. Received: {value!r}")
    return int(value)


def _fraction(value, name):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"Expected `{name}` to be a number. Received: {type(value).__name__}")
    if not 0 < value < 1:
        raise ValueError(f"Expected `{name}` to be between 0 and 1 (exclusive). Received: {value!r}")
    return float(value)
