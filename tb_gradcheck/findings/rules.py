"""The rules behind the findings: for every written step and layer, is this layer sick? numpy only.

Each rule returns a ``Verdict``: a boolean flag per write and layer, a
severity and the numbers behind it per layer. ``diagnose`` turns verdicts
into ``finding.Finding`` objects and sentences.

Every rule is causal: its verdict about write ``t`` reads only writes up to
``t`` and, for the severity of a rise, at most ``Thresholds.sustained_writes``
writes after it. So the findings about a run's first N steps are the same
whether the run stopped at N steps or went on to 10N. No rule compares a
step with a statistic of the whole run (a whole-run median turns the normal
large gradients of early training into "spikes" once the run is long).
"""

import dataclasses

import numpy as np

from tb_gradcheck.core import metadata
from tb_gradcheck.findings import rises
from tb_gradcheck.findings import windows

# Stored columns this module reads when a log has them (metadata.py says what
# each holds). Older logs lack them and the rules that need them stay silent
# or fall back, rather than guess.
DEAD_UNITS = "dead_unit_fraction"
FINITE_NORM = "grad_norm_finite"
ONSET_OFFSET = "first_nonfinite_offset"
LOSS_SCALE = "loss_scale"


@dataclasses.dataclass
class Verdict:
    """What one rule says about one run.

    Attributes:
      flags: bool ``[S, L]``: the rule holds at that write for that layer.
      severity: ``{layer: "error" | "warning" | "info"}`` for every flagged
        layer; "info" is shown and never a problem (``dead_units``).
      evidence: ``{layer: {number name: value}}`` for every flagged layer,
        each with its own ``first_step`` and ``last_step``.
      aggregate: The heatmap aggregate that shows it best.
      quiet: Layers whose state this verdict explains without naming them
        (the other rules leave them alone): for ``dead``, the layers that
        get no gradient because a later one passes none.
    """

    flags: np.ndarray
    severity: dict
    evidence: dict
    aggregate: str
    quiet: frozenset = frozenset()

    @property
    def accounted_for(self):
        """The layers this verdict speaks for: those it names as a problem (not "info") and those it keeps quiet."""
        return {name for name, level in self.severity.items() if level != "info"} | self.quiet


class StatsView:
    """The slabs the rules read, each from the aggregate that answers it best, NaN where missing."""

    def __init__(self, matrix):
        self.rows = list(matrix.rows)
        self.steps = np.asarray(matrix.steps)
        self._matrix = matrix
        # Typical level: the window mean (a windowed writer) or the step itself.
        self.norm, self.present, self.typical = self._pick("grad_norm", ("mean", "last"))
        # Peak: the window max. A window holding a NaN has a NaN max, which
        # would hide the explosion before it; the writer's largest finite
        # norm of the window keeps it, when the log has that column.
        self.peak, _, self.peak_aggregate = self._pick("grad_norm", ("max", "last"))
        finite_peak, _, _ = self._pick(FINITE_NORM, ("max", "last"))
        if finite_peak is not None:
            self.peak = np.where(np.isnan(finite_peak), self.peak, finite_peak)
        # A window's sum counts its steps with a non-finite gradient, its last slab the elements of the write step.
        self.nonfinite, _, self.total = self._pick("grad_nonfinite", ("sum", "last"))
        self.nonfinite_elements, _, _ = self._pick("grad_nonfinite", ("last",))
        self.ratio, _, _ = self._pick("grad_to_weight", ("mean", "last"))
        self.dead, _, _ = self._pick(DEAD_UNITS, ("last",))
        # The share of a ReLU layer's units with no positive output in the write step's batch (activations=True).
        self.dead_by_output, _, _ = self._pick("act_dead_fraction", ("last",))
        self.weight_norm, _, _ = self._pick("weight_norm", ("last",))
        # ||w_after - w_before|| / ||w_before|| at the write step, when the writer bracketed the update.
        self.update, _, _ = self._pick("update_to_weight", ("last",))
        self.onset_offset, _, _ = self._pick(ONSET_OFFSET, ("last",))
        # The dynamic loss scale of a mixed-precision fit, at each write step.
        self.loss_scale, _, _ = self._pick(LOSS_SCALE, ("last",))
        # The first training step each write summarises: the step after the
        # previous write (the write step itself when every step is written).
        self.starts = np.concatenate([self.steps[:1], self.steps[:-1] + 1]) if len(self.steps) else self.steps

    def _pick(self, column, preferred):
        m = self._matrix
        if column not in m.columns:
            return None, None, None
        have = [a for a in m.aggregates if a is not None]
        aggregate = next((a for a in (*preferred, "last", *have) if a in have), None)
        if aggregate is None:
            return None, None, None
        values, missing = m.slab(column, aggregate)
        return np.where(missing, np.nan, values).astype(np.float64), ~missing, aggregate

    def bad(self):
        """bool ``[S, L]``: a non-finite gradient at this write (counted, or the statistics themselves broken)."""
        count = np.nan_to_num(self.nonfinite, nan=0.0) if self.nonfinite is not None else 0.0
        broken = ~np.isfinite(self.norm)
        if self.nonfinite is not None:
            broken |= ~np.isfinite(self.nonfinite)
        return self.present & ((count > 0) | broken)


def non_finite(v):
    """Writes whose gradients hold NaN or Inf. Always an error: the update they feed is garbage.

    Except where dynamic loss scaling is at work: a ``LossScaleOptimizer``
    refuses every step whose gradient is not finite (no update) and halves
    its scale, so an overflow of the scaled float16 gradient is how it finds
    its scale, not a fault. That holds while the scale is at least 1. Below
    1 the scaler is shrinking the loss itself, so the gradient is not finite
    even unscaled: an overflow no scale cures, or a NaN of the model's own,
    which is refused at every step and stops training. Those writes are
    errors, and the finding counts back to the first refused write of the
    streak that led there.
    """
    bad = v.bad()
    flags, scale = bad, None
    if v.loss_scale is not None and v.loss_scale.size:
        scale = np.fmax.reduce(v.loss_scale, axis=1)  # the same in every row; NaN where not recorded
        flags = bad & ~(scale >= 1.0)[:, None]  # NaN is not excused
    evidence = {}
    peak = np.where(v.present & np.isfinite(v.peak), v.peak, np.nan)
    for j in flagged_columns(flags):
        name = v.rows[j]
        steps = v.steps[flags[:, j]]
        flagged = int(np.argmax(flags[:, j]))
        first = windows.run_start(bad[:, j], flagged)  # with the refused writes that led to it
        before = peak[: first + 1, j]
        # The window's own record of its first non-finite step, when the log
        # has it: a write every N steps otherwise only says "by step s".
        offset = v.onset_offset[first, j] if v.onset_offset is not None else np.nan
        onset = int(v.steps[first] - offset) if np.isfinite(offset) else int(v.steps[first])
        elements = v.nonfinite_elements[flags[:, j], j] if v.nonfinite_elements is not None else np.zeros(0)
        evidence[name] = {
            "writes_with_nonfinite": len(steps),  # writes, not steps: with every_n_steps a write is a window
            # At the written steps (a window's other steps are counted as steps, below).
            "nonfinite_elements": float(np.nansum(elements)),
            # The explosion before the first NaN, if any: the largest finite
            # norm up to that write, against the first norm the layer had.
            "max_finite_norm_before": _float(np.nanmax(before)) if np.isfinite(before).any() else None,
            "first_step": onset,
            **({"steps_with_nonfinite": float(np.nansum(v.nonfinite[flags[:, j], j]))} if v.total == "sum" else {}),
            "last_step": int(steps[-1]),
        }
        at = scale[flagged] if scale is not None else np.nan
        if np.isfinite(at):  # the scale that no longer cured it
            evidence[name]["loss_scale"] = _float(at)
    return Verdict(flags, {name: "error" for name in evidence}, evidence, v.total)


def exploding(v, t):
    """Rises against the layer's own trailing past, steady growth, and gradients too large for their weights. Falls never count.

    A write is a rise when its peak norm is at least ``rise_orders`` above the
    median of the layer's typical norm over the ``baseline_writes`` writes
    before it, is the highest the layer has had, and is above the recent
    level of every layer (a layer climbing into the range the rest of the
    network already has is joining training, e.g. behind a zero-initialised
    head, not exploding). The rise lasts while the typical norm stays that
    far above the baseline it rose from, or the gradients are non-finite.
    Steady growth: the median of the latest half of the baseline window is
    ``growth_orders`` above the median of the half before it, and above
    anything before.

    A rise of one write that recovers must also clear the largest peak of
    the trailing window by ``spike_margin_orders``: where the layer's own
    recent writes already spread that wide, one more such write is its
    noise, not an event.

    Neither needs a past to see an explosion that is there from the first
    step: a write is also flagged where the gradient is too large for the
    weights it updates (``rises.too_large``: ``explode_ratio``), for as long
    as that lasts.

    Severity: error when the rise (or the too-large stretch) lasts
    ``sustained_writes`` writes or more, ends in non-finite gradients or in a
    norm of exactly 0, or the growth reaches ``rise_orders``; warning
    otherwise; information where the layer only grew, and each growth then
    held its new level for a baseline window (``rises.settled``: a change
    of level, not a divergence).
    """
    s, n_rows = v.norm.shape
    lt = windows.log_level(v.norm, v.present)
    lp = windows.log_level(v.peak, v.present)
    bad = v.bad()
    base = windows.before(lt, t.baseline_writes, windows.nanmedian)
    top = windows.before(lp, t.baseline_writes, windows.nanmax)  # the window's largest peak
    high = windows.running_max_before(lt)
    network = np.nanmax(np.where(np.isnan(base), -np.inf, base), axis=1, keepdims=True)  # [S, 1]
    rise = lp - base
    with np.errstate(invalid="ignore"):
        onset = (rise >= t.rise_orders) & (lp > high) & (lp > network)
    growth, growing, recent = rises.growth(lt, t)
    large, ratio, network_ratio = rises.too_large(v, t.explode_ratio)

    flags = np.zeros((s, n_rows), bool)
    severity, evidence = {}, {}
    # A layer with no onset, no growth and nothing too large has no span: its flags stay False.
    for j in flagged_columns(onset | growing | large):
        name = v.rows[j]
        starts, ends = rises.spans(
            np.flatnonzero(onset[:, j]), base[:, j] + t.rise_orders, lt[:, j], lp[:, j], bad[:, j]
        )
        # A one-write spike that recovers is a warning about one batch. In a
        # layer whose recent writes already spread over orders of magnitude
        # (heavy-tailed per-batch gradients), it must also clear the window's
        # largest peak (spike_margin_orders).
        with np.errstate(invalid="ignore"):
            clears = ~(lp[starts, j] - top[starts, j] < t.spike_margin_orders)
        rise_bad, rise_zero = _outcomes(v, bad, j, starts, ends)
        keep = (ends - starts > 1) | rise_bad | rise_zero | clears
        starts, ends = starts[keep], ends[keep]
        big_starts, big_ends = rises.held(large[:, j], bad[:, j])
        all_starts, all_ends = np.concatenate([starts, big_starts]), np.concatenate([ends, big_ends])
        ends_bad, ends_zero = (bool(x.any()) for x in _outcomes(v, bad, j, all_starts, all_ends))
        covered = np.zeros(s + 1, np.int64)
        np.add.at(covered, all_starts, 1)
        np.add.at(covered, all_ends, -1)
        flags[:, j] = np.cumsum(covered[:s]) > 0
        grew = growing[:, j]
        flags[:, j] |= grew
        if not flags[:, j].any():
            continue
        longest = int(np.max(all_ends - all_starts)) if len(all_starts) else 0
        max_growth = float(np.nanmax(growth[grew, j])) if grew.any() else None
        error = (
            longest >= t.sustained_writes
            or ends_bad
            or ends_zero
            or (max_growth is not None and max_growth >= t.rise_orders)
        )
        # Growth alone, each to a level that then held: a change of level, information (``rises.settled``).
        weight = v.weight_norm[:, j] if v.weight_norm is not None else None
        held = not len(all_starts) and rises.settled(grew, recent[:, j], lt[:, j], bad[:, j], weight, t)[grew].all()
        severity[name] = "info" if held else "error" if error else "warning"
        # A write summarises the steps since the previous one; the rise is
        # somewhere in there, so the range starts where that window starts.
        first, steps = v.starts[flags[:, j]], v.steps[flags[:, j]]
        worst = int(starts[np.argmax(rise[starts, j])]) if len(starts) else None
        reasons = []
        if len(starts):
            reasons.append("rise over its trailing median")
        if grew.any():
            reasons.append("steady growth")
        if len(big_starts):
            reasons.append("too large for its weights")
        peak_here = np.where(flags[:, j] & np.isfinite(v.peak[:, j]), v.peak[:, j], np.nan)
        evidence[name] = {
            "max_norm": _float(np.nanmax(peak_here)) if np.isfinite(peak_here).any() else None,
            "baseline_norm": _float(10.0 ** base[worst, j]) if worst is not None else None,
            "rise_orders": _float(rise[worst, j]) if worst is not None else None,
            "growth_orders_half_window": max_growth,
            "max_grad_to_weight": _float(np.nanmax(ratio[large[:, j], j])) if len(big_starts) else None,
            "network_grad_to_weight": _float(np.nanmax(network_ratio[large[:, j]])) if len(big_starts) else None,
            "rises": len(starts),
            "longest_rise_writes": int(longest),
            # A string, not a boolean: evidence values are numbers or words.
            "outcome": "ends in NaN/Inf"
            if ends_bad
            else "ends with no gradient at all"
            if ends_zero
            else HELD
            if held
            else ("sustained" if error else "recovered"),
            "first_step": int(first[0]),
            "last_step": int(steps[-1]),
            "reason": " and ".join(reasons),
        }
    return Verdict(flags, severity, evidence, v.peak_aggregate)


# The outcome of growth that settled at its new level (``rises.settled``).
HELD = "held its new level"


def _outcomes(v, bad, j, starts, ends):
    """Per span of layer ``j``: does it end in non-finite gradients, or in a norm of exactly 0?

    Non-finite: any in the span, or at the write that ends it. A norm of
    exactly 0 at the write that ends it: the layer gets no gradient any
    more, the explosion killed it.
    """
    s = len(bad)
    seen_bad = np.concatenate([[0], np.cumsum(bad[:, j])])
    ends_bad = seen_bad[np.minimum(ends + 1, s)] > seen_bad[starts]
    after = np.minimum(ends, s - 1)
    ends_zero = (ends < s) & v.present[after, j] & (v.norm[after, j] == 0)
    return ends_bad, ends_zero


def check_failures(checks):
    """Checks whose analytic and numeric derivatives disagree beyond the check's noise floor."""
    status, status_missing = checks.slab("status")
    error, _ = checks.slab("relative_error")
    mismatch = metadata.CHECK_STATUSES.index("mismatch")
    bad = ~status_missing & (status == mismatch)
    # Convictions whose verdict is the float64 twin's (settle): float32
    # could not decide the row. Missing in checks written before the column.
    recheck, recheck_missing = checks.slab("float64_recheck")
    by_twin = bad & ~recheck_missing & (recheck == metadata.CHECK_RECHECKS.index("float64"))
    evidence = {}
    for j in flagged_columns(bad):
        name = checks.rows[j]
        steps = checks.steps[bad[:, j]]
        evidence[name] = {
            "max_relative_error": float(np.nanmax(error[bad[:, j], j])),
            "checks_failed": int(bad[:, j].sum()),
            "checks_run": int((~status_missing[:, j]).sum()),
            "first_step": int(steps[0]),
            "last_step": int(steps[-1]),
        }
        if by_twin[:, j].any():
            evidence[name]["decided_by_float64_twin"] = int(by_twin[:, j].sum())
    return Verdict(bad, {name: "error" for name in evidence}, evidence, "last")


def _float(x):
    return float(x)


def flagged_columns(flags):
    """Indices of the columns of ``flags`` ``[S, L]`` with any true write, ascending: the layers a rule speaks of.

    One pass over the matrix instead of one strided column per layer (2,000
    layers x 10,000 writes: most of a rule's time in its loop over layers).
    """
    return np.flatnonzero(flags.any(axis=0)).tolist()
