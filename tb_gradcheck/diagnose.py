"""Findings from stored gradient matrices: vanishing, exploding, dead, non-finite, check failures; numpy only.

Every rule reads the layer-granularity matrices the plugin serves and returns
``Finding`` objects that name the run, the layers, the step range and the
numbers behind the verdict. The thresholds are in ``Thresholds``, each with
the reasoning for its default.
"""

import dataclasses

import numpy as np

from tb_gradcheck import metadata
from tb_gradcheck import optimizer_findings


@dataclasses.dataclass(frozen=True)
class Thresholds:
    """When a pattern becomes a finding. Every field can be overridden.

    Attributes:
      persistence: Fraction of a layer's steps a condition must hold for the
        slow patterns (vanishing, dead). 0.5: a layer that is fine half the
        time is a layer that trains; one that is sick most of the time is not.
      vanishing_floor: A gradient norm below this is vanishing whatever the
        other layers do. 1e-9: an update lr * g that small cannot change a
        float32 weight of order 1e-2 at any usual learning rate (float32
        resolves about 6e-8 relative, so such a weight moves only by steps of
        ~6e-10).
      vanishing_orders: Orders of magnitude a layer's norm may sit below the
        largest norm among the layers after it (toward the output) before it
        is vanishing. 3: healthy deep nets keep layer norms within one or two
        orders; a thousandfold drop means the input side barely learns.
      exploding_ceiling: A gradient norm above this at any step is exploding.
        1e3: three orders above the clipping norms people use (1 to 10).
      exploding_spike_orders: A step whose norm is this many orders of
        magnitude above the layer's median norm is a spike. 2: a hundredfold
        jump in one step is not noise in any optimiser we know.
      exploding_growth_orders: Growth of the median norm from the first tenth
        of the steps to the last tenth that counts as exploding over time. 2.
      dead_zero_fraction: A layer whose gradient has at least this fraction
        of exact zeros in most steps is dead. 0.9: sparse inputs and a few
        dead ReLU units give zero fractions well below that; at 0.9 most of
        the layer learns nothing. Layers with sparse (IndexedSlices)
        gradients are exempt: an embedding touches only its batch's rows.
      min_steps_for_trends: Fewer written steps than this and the spike and
        growth rules stay silent: a median of three points says nothing.
    """

    persistence: float = 0.5
    vanishing_floor: float = 1e-9
    vanishing_orders: float = 3.0
    exploding_ceiling: float = 1e3
    exploding_spike_orders: float = 2.0
    exploding_growth_orders: float = 2.0
    dead_zero_fraction: float = 0.9
    min_steps_for_trends: int = 10


KINDS = ("non_finite", "check_failure", "exploding", "vanishing", "dead")
_SEVERITY = {"non_finite": "error", "check_failure": "error", "exploding": "error", "vanishing": "warning",
             "dead": "warning"}


@dataclasses.dataclass
class Finding:
    """One diagnosis.

    Attributes:
      kind: One of ``KINDS``.
      severity: ``"error"`` or ``"warning"``.
      run: The run.
      layers: Affected layer names, in depth order.
      steps: ``[first, last]`` step over all affected layers.
      metric: The heatmap metric that shows it (``grad_norm``, ...).
      aggregate: The aggregate that shows it best.
      message: One readable sentence.
      evidence: ``{layer: {number name: value}}``, each with its own
        ``first_step`` and ``last_step``.
    """

    kind: str
    severity: str
    run: str
    layers: list
    steps: list
    metric: str
    aggregate: str
    message: str
    evidence: dict

    def to_dict(self):
        return dataclasses.asdict(self)


def find(run, stats=None, checks=None, thresholds=None, sparse_rows=()):
    """Runs every rule over one run's layer matrices.

    Args:
      run: Run name, for the findings.
      stats: A ``store.Matrix`` of kind stats at layer granularity, or None.
      checks: A ``store.Matrix`` of kind check at layer granularity, or None.
      thresholds: ``Thresholds``; the defaults when None.
      sparse_rows: Names of layers with sparse gradients (exempt from "dead").

    Returns:
      A list of ``Finding``, most severe kinds first.
    """
    t = thresholds or Thresholds()
    out = []
    if stats is not None and len(stats.steps):
        view = _StatsView(stats)
        out += _non_finite(run, view)
        out += _exploding(run, view, t)
        dead = _dead(run, view, t, set(sparse_rows))
        out += _vanishing(run, view, t, exclude=set(dead[0].layers) if dead else set())
        out += dead
    if checks is not None and len(checks.steps):
        out += _check_failures(run, checks)
    # The optimizer's findings (clipping, layers not learning) follow the rest.
    return sorted(out, key=lambda f: KINDS.index(f.kind)) + optimizer_findings.find(run, stats, thresholds)


class _StatsView:
    """The slabs the rules read, each from the aggregate that answers it best."""

    def __init__(self, matrix):
        self.rows = matrix.rows
        self.steps = matrix.steps
        have = set(matrix.aggregates)

        def pick(column, preferred):
            # The preferred aggregate where the metric has it, else the last
            # value, else whatever the run stored (a layout need not hold "last").
            usable = preferred in have and preferred in metadata.METRIC_AGGREGATES[column]
            aggregate = preferred if usable else next(a for a in ("last", *matrix.aggregates) if a in have)
            values, missing = matrix.slab(column, aggregate)
            return np.where(missing, np.nan, values), ~missing, aggregate

        # Typical level: the window mean; extremes: the window max and min;
        # non-finite: the window total.
        self.norm, self.present, self.typical = pick("grad_norm", "mean")
        self.norm_max, _, self.peak = pick("grad_norm", "max")
        self.zero, _, _ = pick("grad_zero_fraction", "mean")
        self.nonfinite, _, self.total = pick("grad_nonfinite", "sum")

    def finite(self, values):
        return self.present & np.isfinite(values)


def _non_finite(run, v):
    # The writer counts NaN/Inf elements, so a positive count is the signal;
    # a count or norm that is itself NaN/Inf (a damaged or foreign log) is
    # no sign of health either.
    bad = v.present & ((v.nonfinite > 0) | ~np.isfinite(v.nonfinite) | ~np.isfinite(v.norm))
    layers = [j for j in range(len(v.rows)) if bad[:, j].any()]
    if not layers:
        return []
    evidence = {}
    for j in layers:
        steps = v.steps[bad[:, j]]
        evidence[v.rows[j]] = {
            "steps_with_nonfinite": int(len(steps)),
            "nonfinite_elements": float(np.nansum(v.nonfinite[bad[:, j], j])),
            "first_step": int(steps[0]),
            "last_step": int(steps[-1]),
        }
    names = [v.rows[j] for j in layers]
    first = min(e["first_step"] for e in evidence.values())
    message = (
        f"NaN/Inf gradients in {_list(names)}, first at step {first} "
        f"({sum(e['steps_with_nonfinite'] for e in evidence.values())} layer-steps affected)."
    )
    return [_finding("non_finite", run, names, evidence, "grad_nonfinite", v.total, message)]


def _exploding(run, v, t):
    finite = v.finite(v.norm_max)
    evidence = {}
    for j, name in enumerate(v.rows):
        steps = v.steps[finite[:, j]]
        if not len(steps):
            continue
        peak = v.norm_max[finite[:, j], j]
        typical = v.norm[v.finite(v.norm)[:, j], j]
        reasons, hot = [], peak > t.exploding_ceiling
        if hot.any():
            reasons.append(f"above the ceiling {t.exploding_ceiling:g}")
        median = float(np.median(typical)) if len(typical) else np.nan
        growth = None
        if len(steps) >= t.min_steps_for_trends and median > 0:
            spikes = peak > median * 10.0**t.exploding_spike_orders
            if spikes.any():
                reasons.append(f"over {t.exploding_spike_orders:g} orders above its median")
                hot |= spikes
            growth = _growth_orders(typical)
            if growth is not None and growth > t.exploding_growth_orders:
                reasons.append(f"grew {growth:.1f} orders of magnitude over the run")
                tenth = max(1, len(steps) // 10)
                hot[-tenth:] = True
        if reasons:
            hot_steps = steps[hot]
            evidence[name] = {
                "max_norm": float(peak.max()),
                "median_norm": median,
                "max_over_median_orders": float(np.log10(peak.max() / median)) if median > 0 else None,
                "growth_orders": growth,
                "steps_over": int(hot.sum()),
                "first_step": int(hot_steps[0]),
                "last_step": int(hot_steps[-1]),
                "reason": "; ".join(reasons),
            }
    if not evidence:
        return []
    names = list(evidence)
    worst = max(evidence.values(), key=lambda e: e["max_norm"])
    message = (
        f"Exploding gradients in {_list(names)}: norm up to {worst['max_norm']:.3g} "
        f"({worst['reason']}), steps {min(e['first_step'] for e in evidence.values())}"
        f"-{max(e['last_step'] for e in evidence.values())}."
    )
    return [_finding("exploding", run, names, evidence, "grad_norm", v.peak, message)]


def _growth_orders(typical):
    positive = typical[typical > 0]
    if len(positive) < 10:
        return None
    tenth = max(1, len(positive) // 10)
    return float(np.log10(np.median(positive[-tenth:])) - np.log10(np.median(positive[:tenth])))


def _dead(run, v, t, sparse):
    evidence = {}
    for j, name in enumerate(v.rows):
        if name in sparse:
            continue
        here = v.present[:, j] & np.isfinite(v.zero[:, j])
        if not here.any():
            continue
        dead = here & (v.zero[:, j] >= t.dead_zero_fraction)
        fraction = dead.sum() / here.sum()
        if fraction >= t.persistence:
            steps = v.steps[dead]
            evidence[name] = {
                "median_zero_fraction": float(np.median(v.zero[here, j])),
                "fraction_of_steps": float(fraction),
                "first_step": int(steps[0]),
                "last_step": int(steps[-1]),
            }
    if not evidence:
        return []
    names = list(evidence)
    message = (
        f"Dead layers: {_list(names)} get exact-zero gradients for at least "
        f"{t.dead_zero_fraction:.0%} of their elements in "
        f"{min(e['fraction_of_steps'] for e in evidence.values()):.0%} or more of the steps."
    )
    return [_finding("dead", run, names, evidence, "grad_zero_fraction", v.typical, message)]


def _vanishing(run, v, t, exclude):
    norm = np.where(v.finite(v.norm), v.norm, np.nan)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_norm = np.log10(norm)  # 0 -> -inf: a zero gradient is infinitely far below
        # Largest norm among the layers after each layer (toward the output).
        after = np.full_like(log_norm, -np.inf)
        filled = np.where(np.isnan(log_norm), -np.inf, log_norm)
        for j in range(len(v.rows) - 2, -1, -1):
            after[:, j] = np.maximum(after[:, j + 1], filled[:, j + 1])
        decay = after - log_norm
    evidence = {}
    for j, name in enumerate(v.rows):
        if name in exclude:
            continue
        here = ~np.isnan(log_norm[:, j])
        if not here.any():
            continue
        below_floor = here & (norm[:, j] < t.vanishing_floor)
        decayed = here & np.isfinite(after[:, j]) & (decay[:, j] > t.vanishing_orders)
        sick = below_floor | decayed
        fraction = sick.sum() / here.sum()
        if fraction < t.persistence:
            continue
        steps = v.steps[sick]
        finite_decay = decay[decayed, j][np.isfinite(decay[decayed, j])]
        evidence[name] = {
            "median_norm": float(np.median(norm[here, j])),
            "median_orders_below_later_layers": float(np.median(finite_decay)) if len(finite_decay) else None,
            "fraction_of_steps": float(fraction),
            "first_step": int(steps[0]),
            "last_step": int(steps[-1]),
            "reason": "below the floor" if below_floor.sum() >= decayed.sum() else "decays across depth",
        }
    if not evidence:
        return []
    names = list(evidence)
    orders = [e["median_orders_below_later_layers"] for e in evidence.values() if e["median_orders_below_later_layers"]]
    detail = (
        f"{min(orders):.1f}-{max(orders):.1f} orders of magnitude below the layers after them"
        if orders else f"below {t.vanishing_floor:g}"
    )
    message = f"Vanishing gradients in {_list(names)}: gradient norm {detail} in most steps."
    return [_finding("vanishing", run, names, evidence, "grad_norm", v.typical, message)]


def _check_failures(run, checks):
    status, status_missing = checks.slab("status")
    error, _ = checks.slab("relative_error")
    mismatch = metadata.CHECK_STATUSES.index("mismatch")
    bad = ~status_missing & (status == mismatch)
    evidence = {}
    for j, name in enumerate(checks.rows):
        if bad[:, j].any():
            steps = checks.steps[bad[:, j]]
            evidence[name] = {
                "max_relative_error": float(np.nanmax(error[bad[:, j], j])),
                "checks_failed": int(bad[:, j].sum()),
                "checks_run": int((~status_missing[:, j]).sum()),
                "first_step": int(steps[0]),
                "last_step": int(steps[-1]),
            }
    if not evidence:
        return []
    names = list(evidence)
    worst = max(e["max_relative_error"] for e in evidence.values())
    message = f"Gradient check failed for {_list(names)}: analytic and numeric gradients differ by up to {worst:.2%}."
    return [_finding("check_failure", run, names, evidence, metadata.CHECK_METRIC, "last", message)]


def _finding(kind, run, names, evidence, metric, aggregate, message):
    steps = [min(e["first_step"] for e in evidence.values()), max(e["last_step"] for e in evidence.values())]
    return Finding(kind, _SEVERITY[kind], run, names, steps, metric, aggregate, message, evidence)


def _list(names, limit=3):
    names = [_isolate(n) for n in names]
    if len(names) <= limit:
        return ", ".join(names)
    return f"{len(names)} layers ({', '.join(names[:limit])}, ...)"


def _isolate(name):
    """A layer name as a Unicode bidi isolate (FSI ... PDI) inside a message.

    Names are user data: one holding a right-to-left override (U+202E)
    would otherwise reverse the rest of the sentence, numbers included, in
    the tab and in a terminal. The isolate ends every override the name
    opens; the marks themselves are invisible.
    """
    return f"\u2068{name}\u2069"
