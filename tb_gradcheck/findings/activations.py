"""Findings from the forward side: saturated tanh/sigmoid layers, growing and massive activations; numpy only.

Rules over the activation columns (``metadata.ACTIVATION_STAT_COLUMNS``) of
a run's layer-granularity stats matrix, called by ``diagnose``. A run
without those columns (every log written before them, every writer without
``activations=True``) gets no finding and no remark from here. They also add
the forward view to two gradient findings: a vanishing finding names the
layers among its own whose tanh/sigmoid outputs are saturated, and a dead
finding gives the dead-by-output fraction beside the gradient's, saying
so when the two disagree.
"""

import dataclasses

import numpy as np

from tb_gradcheck.findings import finding
from tb_gradcheck.findings import windows

KINDS = ("saturated", "activation_growth", "massive_activations")
SATURATED = "act_saturated_fraction"
DEAD_BY_OUTPUT = "act_dead_fraction"
RMS = "act_rms"
MAX_ABS = "act_max_abs"


@dataclasses.dataclass(frozen=True)
class ActivationThresholds:
    """When the forward side becomes a finding. ``diagnose.Thresholds`` fields of the same names win.

    Attributes:
      saturated: A layer whose following Tanh or Sigmoid has at least this
        share of its outputs near a bound (``act_saturated_fraction``) in
        ``persistence`` of the trailing window is saturated. 0.5: a
        saturated output passes back under 4% of the gradient its unit
        would at its centre (metadata says why), so at a share ``s`` the
        layer passes back at most ``(1 - s) + 0.04 s`` of it: at one half,
        about half, and a stack of such layers halves the gradient per
        layer, the decay across depth Glorot and Bengio (2010) traced to
        saturated sigmoid units.
      activation_growth_orders: A layer whose ``act_rms`` (median over the
        trailing window) sits this many orders above its median over the
        run's first ``min_writes`` writes has activations that grew by
        orders. 2: normalisation keeps a layer's outputs near unit scale,
        and a residual stream grows like the square root of its depth, a
        few-fold; outputs a hundred times their start are the growth that
        precedes a divergence (attention logits rising step after step
        before the loss blows up: Dehghani et al. 2023, Wortsman et al. 2023).
        A layer that starts below unit scale has its growth counted from
        unit scale (RMS 1): a branch small by design at initialisation
        (LayerScale at 1e-5 or 1e-6, MoE experts weighted by a router's
        small probabilities, LoRA's zero B) rises toward unit scale as it
        learns, which is no divergence; a divergence goes on past it.
      massive_abs: An output of at least this magnitude, and
      massive_ratio: at least this many times the layer's RMS, is massive:
        100 and 1000, the thresholds of Sun et al. (2024, "Massive
        Activations in Large Language Models": magnitude over 100 and about
        1000 times the median magnitude). The RMS stands in for the median
        |a|, which is not stored: it is at least the median for the
        distributions that matter (a Gaussian's median |a| is 0.67 of its
        RMS, and a massive value only raises the RMS), so the test is
        stricter than the paper's, never looser. Information: such values
        are how large Transformers carry attention biases, no fault, but
        they decide quantisation and low-precision ranges.
      views_disagree: The dead fraction by gradient and by output differ by
        at least this much: said in the dead finding. 0.25: a quarter of the
        layer's units. Units dead by gradient but alive by output get a zero
        gradient from later layers, not from their own ReLU.
    """

    saturated: float = 0.5
    activation_growth_orders: float = 2.0
    massive_abs: float = 100.0
    massive_ratio: float = 1000.0
    views_disagree: float = 0.25


# A vanishing finding names the layers among its own with at least this share of their tanh/sigmoid outputs
# saturated: such a layer passes back at most 1 - 0.96 * 0.1, about 90%, of its gradient, a loss that
# compounds over a stack of them; a smaller share is within what a healthy tanh layer shows.
NAMED_SHARE = 0.1


def _column(stats, name):
    """float64 ``[S, L]`` of a column's ``last`` slab, NaN where missing; None without the column."""
    if name not in stats.columns or "last" not in stats.aggregates:
        return None
    values, missing = stats.slab(name, "last")
    if missing.all():
        return None
    return np.where(missing, np.nan, values).astype(np.float64)


def annotate(found, stats, thresholds):
    """Adds the forward view to ``vanishing`` and ``dead`` verdicts' evidence (``diagnose.verdicts``), in place."""
    if stats is None:
        return
    steps = np.asarray(stats.steps)
    rows = {name: j for j, name in enumerate(stats.rows)}
    for kind, column, key in (
        ("vanishing", SATURATED, "median_saturated_fraction"),
        ("dead", DEAD_BY_OUTPUT, "dead_by_output"),
    ):
        values = _column(stats, column) if kind in found else None
        if values is None:
            continue
        for name, e in found[kind].evidence.items():
            span = (steps >= e["first_step"]) & (steps <= e["last_step"])
            seen = values[span, rows[name]]
            seen = seen[np.isfinite(seen)]
            if len(seen):
                e[key] = float(np.median(seen))
                if kind == "dead" and "median_dead_unit_fraction" in e:
                    gap = abs(e[key] - e["median_dead_unit_fraction"])
                    e["views_disagree"] = bool(gap >= thresholds.views_disagree)


def remark(found, quote):
    """What the forward view adds to a ``vanishing`` or ``dead`` sentence ("" when nothing)."""
    e = found.evidence
    if found.kind == "vanishing":
        saturated = [n for n in found.layers if e[n].get("median_saturated_fraction", 0.0) >= NAMED_SHARE]
        if not saturated:
            return ""
        shares = [e[n]["median_saturated_fraction"] for n in saturated]
        return (
            f" Their tanh/sigmoid outputs are saturated in {finding.name_list(saturated, quote)} "
            f"({_range(shares)} of outputs near a bound), which passes back little gradient."
        )
    if found.kind == "dead":
        both = [n for n in found.layers if "dead_by_output" in e[n]]
        if not both:
            return ""
        text = f" By output, {_range([e[n]['dead_by_output'] for n in both])} of units had no positive value."
        apart = [n for n in both if e[n].get("views_disagree")]
        if apart:
            text += (
                f" The gradient and the output disagree in {finding.name_list(apart, quote)}: units with outputs "
                "but no gradient get none from the layers after them, not from their own ReLU."
            )
        return text
    return ""


def find(run, stats, thresholds):
    """The forward-side findings of one run (none without activation columns).

    Args:
      run: Run name.
      stats: ``store.Matrix`` of kind stats at layer granularity, or None.
      thresholds: ``diagnose.Thresholds`` (its window fields and these).
    """
    if stats is None or not len(stats.steps):
        return []
    t = thresholds
    out = []
    saturated = _column(stats, SATURATED)
    if saturated is not None:
        here = np.isfinite(saturated)
        held = here & (saturated >= t.saturated)
        flags = windows.persistent(held, here, t)
        numbers = {"saturated_fraction": saturated}
        out += _finding("saturated", "warning", run, stats, flags, SATURATED, numbers, onset=held)
    rms, max_abs = _column(stats, RMS), _column(stats, MAX_ABS)
    if rms is not None:
        out += _growth(run, stats, rms, t)
    if rms is not None and max_abs is not None:
        with np.errstate(invalid="ignore", divide="ignore"):
            massive = (max_abs >= t.massive_abs) & (max_abs >= t.massive_ratio * rms)
        here = np.isfinite(max_abs) & np.isfinite(rms)
        flags = windows.persistent(massive & here, here, t)
        numbers = {"abs_activation": max_abs, "over_rms": max_abs / np.where(rms > 0, rms, np.nan)}
        out += _finding("massive_activations", "info", run, stats, flags, MAX_ABS, numbers, onset=massive & here)
    return out


def _growth(run, stats, rms, t):
    """Layers whose ``act_rms`` grew ``activation_growth_orders`` or more above its start, causally."""
    logs = windows.log_level(rms, np.isfinite(rms))
    seen = np.isfinite(logs)
    start = np.full(rms.shape[1], np.nan)
    for j in range(rms.shape[1]):
        first = logs[seen[:, j], j][: t.min_writes]
        if len(first) == t.min_writes:
            start[j] = np.median(first)
    # The trailing window's median against the start, once the run holds a start and a window after it.
    level = windows.through(logs, t.baseline_writes, windows.nanmedian)
    orders = level - start[None, :]
    # Counted from unit scale where a layer starts below it (log10 1 = 0): the premise is outputs held near unit
    # scale, so a branch that starts orders below it by design (LayerScale's 1e-5 or 1e-6, MoE experts weighted by
    # a router's small probabilities, LoRA's B = 0) and rises toward it as it learns is not diverging.
    above_unit = level - np.maximum(start, 0.0)[None, :]
    ready = np.cumsum(seen, axis=0) >= 2 * t.min_writes
    flags = ready & seen & (np.nan_to_num(above_unit, nan=-np.inf) >= t.activation_growth_orders)
    return _finding("activation_growth", "warning", run, stats, flags, RMS, {"growth_orders": orders, "act_rms": rms})


def _finding(kind, severity, run, stats, flags, metric, numbers, onset=None):
    """One finding of the flagged layers; ``onset`` (bool ``[S, L]``, the per-write condition a window confirms).

    With ``onset`` the finding starts where the unbroken run of writes that
    hold the condition began (``first_step``), not where the trailing window
    made it sure (``confirmed_at_step``): the convention of vanishing and
    dead, so that a layer saturated from its first write reads so, not from
    the write at which the window first held enough writes.
    """
    steps = np.asarray(stats.steps)
    evidence = {}
    for j in np.flatnonzero(flags.any(axis=0)):
        f = flags[:, j]
        confirmed = int(np.argmax(f))
        start = confirmed if onset is None else windows.run_start(onset[:, j], confirmed)
        e = {"first_step": int(steps[start]), "last_step": int(steps[f][-1])}
        if onset is not None:
            e["confirmed_at_step"] = int(steps[confirmed])
        for key, values in numbers.items():
            e[f"max_{key}"] = float(np.nanmax(values[f, j]))
        e["fraction_of_steps"] = float(f.mean())
        evidence[stats.rows[j]] = e
    if not evidence:
        return []
    span = [min(e["first_step"] for e in evidence.values()), max(e["last_step"] for e in evidence.values())]
    f = finding.Finding(kind, severity, run, list(evidence), span, metric, "last", "", evidence)
    f.message = describe(f)
    return [f]


def describe(found, quote=None):
    """The sentence of a forward-side finding, names passed through ``quote`` (``diagnose.describe``)."""
    quote = quote or finding.isolate
    e = found.evidence
    names = finding.name_list(found.layers, quote)
    first, last = found.steps
    if found.kind == "saturated":
        share = _range([x["max_saturated_fraction"] for x in e.values()])
        return (
            f"Saturated tanh/sigmoid outputs in {names}: up to {share} of outputs near a bound, steps {first}-{last}; "
            "a saturated unit passes back under 4% of its gradient (Glorot and Bengio 2010)."
        )
    if found.kind == "activation_growth":
        grew = max(x["max_growth_orders"] for x in e.values())
        return (
            f"Activations in {names} grew {grew:.1f} orders of magnitude above their start (RMS up to "
            f"{max(x['max_act_rms'] for x in e.values()):.3g}), steps {first}-{last}: the growth that comes before "
            "a divergence."
        )
    top = max(e.values(), key=lambda x: x["max_abs_activation"])
    return (
        f"Massive activations in {names}: |a| up to {top['max_abs_activation']:.3g}, "
        f"{top['max_over_rms']:.3g} times the layer's RMS (over 100 and 1000 times: Sun et al. 2024), "
        f"steps {first}-{last} (information: how large Transformers carry attention biases)."
    )


def _range(shares):
    lo, hi = min(shares), max(shares)
    return f"{lo:.0%}" if f"{lo:.0%}" == f"{hi:.0%}" else f"{lo:.0%}-{hi:.0%}"
