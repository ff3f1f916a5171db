"""Report types of the gradient check: probes, rows and the whole report; plain data, no TensorFlow."""

import dataclasses
import math

import numpy as np

from tb_gradcheck.core import metadata

STATUSES = metadata.CHECK_STATUSES
OK, INCONCLUSIVE, MISMATCH = STATUSES
RECHECKS = metadata.CHECK_RECHECKS
# Probe directions: along the row's analytic gradient, Gaussian random, and
# the two blind-spot kinds whose analytic derivative is zero by construction:
# over the elements whose gradient is exactly zero ("zero_set"), and over a
# block of the row, orthogonal to the gradient there ("block", thorough mode).
GRADIENT, RANDOM, ZERO_SET, BLOCK = "gradient", "random", "zero_set", "block"
BLIND_SPOT = (ZERO_SET, BLOCK)


@dataclasses.dataclass(frozen=True)
class Probe:
    """One directional-derivative comparison along one direction.

    Attributes:
      direction: ``"gradient"`` (along the row's analytic gradient),
        ``"random"``, ``"zero_set"`` (over the elements whose analytic
        gradient is exactly zero) or ``"block"`` (over one block of the row,
        orthogonal to the analytic gradient there; ``thorough=True``).
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
      min_detectable_error: The power of this check on this row: the
        smallest relative error along the row's gradient (a gradient scaled
        by 1 + r, or any error whose projection on the gradient is r times
        it) that the gradient probe convicts whatever its rounding:
        (tolerance + 2 E / |a|) / (1 - tolerance). Infinite when the row has
        no usable gradient probe. Errors confined to a few elements project
        on the gradient by about their share of it; docs/gradient_check.md
        ("Limits") says what each mode finds there.
      location: For a mismatch, where bisection narrowed the fault (e.g.
        ``"dense_1/kernel[3, 7]"``, ``"dense_1/kernel[0:32, :]"``); empty
        when not a mismatch or not narrowed below the whole row.
      float64_recheck: Whose verdict this is (``settle``): ``"none"`` the
        check's own dtype's, ``"float64"`` the float64 twin's (the own dtype
        left the row inconclusive; every number above is then the twin's),
        ``"unavailable"`` the own dtype's, inconclusive, because the twin
        could not run (``reason`` says why).
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
    min_detectable_error: float = math.inf
    location: str = ""
    float64_recheck: str = RECHECKS[0]

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
      thorough: Whether blind-spot probes over blocks of every row were made
        (``check_gradients(thorough=True)``).
      notes: Lines on what the check did not do and why (e.g. a float64
        twin whose loss is not the model's, so the model's own gradient was
        not held against it: ``float32_gap``); empty when it did all of it.
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
    thorough: bool = False
    notes: tuple = ()

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
            "thorough": self.thorough,
            "notes": list(self.notes),
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
            f"{self.probes} probes per row{', thorough' if self.thorough else ''}, tolerance {self.tolerance:g}, "
            f"seed {self.seed}: {verdict}"
        ]
        lines += [f"Note: {note}" for note in self.notes]
        for title, rows in groups:
            width = max([len(title)] + [len(r.name) for r in rows])
            lines.append("")
            lines.append(
                f"{title:<{width}}  {'analytic':>12}  {'numeric':>12}  {'difference':>10}  "
                f"{'rel. error':>10}  {'noise floor':>11}  {'catches >=':>10}  status"
            )
            for r in rows:
                # "catches >=": the row's min_detectable_error, the smallest
                # relative error along its gradient this check convicts.
                note = f" ({r.reason})" if r.reason else (f" (at {r.location})" if r.location else "")
                if r.float64_recheck == RECHECKS[1]:
                    note = f" [float64 twin]{note}"
                lines.append(
                    f"{r.name:<{width}}  {r.analytic:>12.5e}  {r.numeric:>12.5e}  "
                    f"{abs(r.analytic - r.numeric):>10.2e}  {r.relative_error:>10.2e}  "
                    f"{r.noise_floor:>11.2e}  {_percent(r.min_detectable_error):>10}  {r.status}{note}"
                )
        return "\n".join(lines)


def _percent(x):
    if not math.isfinite(x):
        return "-"
    return f"{100 * x:.3g}%"


def stored_checks(report):
    """A report as the check tensors every writer stores: ``[(layout, matrix)]``, one per granularity it has.

    Layers always, variables when the check ran per variable. The matrix is
    float32 ``[R, len(CHECK_COLUMNS)]``, the status as its index in
    ``CHECK_STATUSES`` and whose verdict it is as its index in
    ``CHECK_RECHECKS`` (docs/stored_format.md).

    Raises:
      TypeError: ``report`` is not a ``GradientCheckReport``.
    """
    if not isinstance(report, GradientCheckReport):
        raise TypeError(
            f"Expected `report` to be a GradientCheckReport (from a check_gradients). Received: {type(report).__name__}"
        )
    stored = []
    for granularity, rows in (("layer", report.layers), ("variable", report.variables)):
        if not rows:
            continue
        matrix = np.full((len(rows), len(metadata.CHECK_COLUMNS)), np.nan, np.float32)
        for i, row in enumerate(rows):
            for j, column in enumerate(metadata.CHECK_COLUMNS):
                value = getattr(row, column)
                if column == "status":
                    value = metadata.CHECK_STATUSES.index(value)
                elif column == "float64_recheck":
                    value = metadata.CHECK_RECHECKS.index(value)
                matrix[i, j] = value
        stored.append((metadata.check_layout(granularity, [r.name for r in rows]), matrix))
    return stored
