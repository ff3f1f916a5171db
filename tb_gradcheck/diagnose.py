"""Findings from stored gradient matrices: vanishing, exploding, dead, non-finite, check failures; numpy only.

``find`` runs the rules (``tb_gradcheck.rules``) over the layer-granularity
matrices the plugin serves and returns ``finding.Finding`` objects that name
the run, the layers (plain names, as written), the step range and the numbers
behind the verdict. The thresholds are in ``Thresholds``, each with the reasoning for
its default. Every sentence is worded by ``describe``, which takes the quoting
of names from its consumer: bidi isolates in the tab (``finding.isolate``,
the default ``message``), plain names in the command line's report.
"""

import dataclasses

from tb_gradcheck import finding
from tb_gradcheck import metadata
from tb_gradcheck import optimizer_findings
from tb_gradcheck import rules


@dataclasses.dataclass(frozen=True)
class Thresholds(optimizer_findings.OptimizerThresholds):
    """When a pattern becomes a finding. Every field can be overridden.

    The optimizer findings' thresholds (clipping, not_learning) are fields
    too, inherited from ``optimizer_findings.OptimizerThresholds`` where
    their reasoning is written, so ``--threshold`` reaches them as well.

    No threshold is an absolute gradient norm: a layer in front of a
    normalisation layer has a gradient that scales as 1 / ||W||, so "large"
    only means something against the layer's own past or its weights.

    Attributes:
      baseline_writes: The trailing window, in writes, that a layer's recent
        level is measured over (the median of its typical norm), and that the
        slow rules (vanishing, dead) look back over for persistence. 20: a
        median of 20 points ignores a few outliers, and a window of writes,
        not of the whole run, keeps every verdict causal: a long run's normal
        large early gradients are not compared with its converged tail.
      rise_orders: Orders of magnitude a write's peak norm must sit above its
        trailing median to be a rise ("exploding"). 2: a hundredfold jump in
        one write is not optimiser noise (mini-batch noise changes a norm by
        factors of a few, a learning-rate schedule by less per step).
      spike_margin_orders: Orders of magnitude a one-write rise that
        recovers must also sit above the largest peak of its trailing window.
        1: under light-tailed mini-batch noise a window's largest peak is a
        few tenths of an order above its median, so a rise of ``rise_orders``
        clears it by more than this and nothing changes; only a layer whose
        own recent writes already spread over an order of magnitude or more
        (tiny batches; a converged classifier whose rare hard examples carry
        the whole gradient) needs its spike to stand out of that spread.
      growth_orders: Orders of magnitude the median norm of the latest half
        of the trailing window must sit above the half before it to be steady
        growth. 1: a polynomial climb from zero (a layer behind a
        zero-initialised head) gains at most about a factor 3 per half-window;
        a tenfold gain in ten writes is exponential growth, which is what a
        divergence looks like before it overflows. Growth of ``rise_orders``
        or more is an error.
      sustained_writes: A rise that stays ``rise_orders`` above its baseline
        for this many writes or more is an error; a shorter one a warning.
        3: a one-write spike is survivable (clipping, Adam's normalisation);
        three in a row means the weights are being thrown around.
      persistence: Fraction of the trailing window's writes the vanishing
        condition must hold in. 0.5: a layer that is fine half the
        time is a layer that trains; one that is sick most of the time is not.
      min_writes: Writes the trailing window must hold before the slow rules
        (vanishing, dead) speak, and the writes in a row in which every unit
        of a layer gets no gradient for it to be dead at once. 5: a majority
        of fewer than five writes is one or two steps.
      vanishing_orders: Orders of magnitude a layer's norm may sit below the
        largest norm among the layers after it (toward the output) before it
        is vanishing. 3: healthy deep nets keep layer norms within one or two
        orders; a thousandfold drop means the input side barely learns.
      vanishing_ratio: A layer whose ||g|| / ||W|| is below this is vanishing
        whatever the other layers do. 6e-8, float32's half-ulp (2**-24): an
        SGD step lr * g with lr <= 1 then changes the weights by less than
        float32 can represent, so they do not move at all. Relative to the
        weights, so it holds at any weight scale.
      dead_units: A layer is dead where its ``dead_unit_fraction`` (units
        whose every parameter gets exactly zero gradient over the whole
        batch) was at least this in every write of the trailing window. The
        window's minimum, because a live but selective ReLU unit (active on
        2% of inputs) is silent on a batch of 64 about one time in four,
        while a dead unit is silent on every batch: the share truly dead is
        at most the minimum. 0.25: a quarter of the layer's width lost for
        good (a dead unit gets no gradient to revive it); CS231n's notes cite
        40% dead as the mark of a too-high learning rate.
    """

    baseline_writes: int = 20
    rise_orders: float = 2.0
    spike_margin_orders: float = 1.0
    growth_orders: float = 1.0
    sustained_writes: int = 3
    persistence: float = 0.5
    min_writes: int = 5
    vanishing_orders: float = 3.0
    vanishing_ratio: float = 6e-8
    dead_units: float = 0.25


KINDS = ("non_finite", "check_failure", "exploding", "vanishing", "dead")

# How sure each kind is, for the README and the tab's help: see README
# "Findings and the command line".
_METRICS = {
    "non_finite": "grad_nonfinite",
    "check_failure": metadata.CHECK_METRIC,
    "exploding": "grad_norm",
    "vanishing": "grad_norm",
    "dead": rules.DEAD_UNITS,
}


def find(run, stats=None, checks=None, thresholds=None, sparse_rows=()):
    """Runs every rule over one run's layer matrices.

    Args:
      run: Run name, for the findings.
      stats: A ``store.Matrix`` of kind stats at layer granularity, or None.
      checks: A ``store.Matrix`` of kind check at layer granularity, or None.
      thresholds: ``Thresholds``; the defaults when None.
      sparse_rows: Names of layers with sparse gradients (exempt from "dead").

    Returns:
      A list of ``finding.Finding``, most severe kinds first.
    """
    out = []
    found = verdicts(stats, checks, thresholds, sparse_rows)
    for kind, verdict in found.items():
        if verdict.evidence:
            out.append(_finding(kind, run, verdict))
    # The optimizer's findings (clipping, layers not learning) follow the rest.
    dead = found["dead"].accounted_for if "dead" in found else ()
    return sorted(out, key=lambda f: (f.severity != "error", KINDS.index(f.kind))) + optimizer_findings.find(
        run, stats, thresholds, dead
    )


def verdicts(stats=None, checks=None, thresholds=None, sparse_rows=()):
    """Every rule's ``rules.Verdict``, by kind: the per-write flags behind ``find``.

    Args: as ``find``.

    Returns:
      ``{kind: rules.Verdict}`` for the kinds the data can answer. The flags
      are ``[steps, rows]`` of ``stats`` (or of ``checks`` for
      ``check_failure``).
    """
    t = thresholds or Thresholds()
    out = {}
    if stats is not None and len(stats.steps):
        view = rules.StatsView(stats)
        out["non_finite"] = rules.non_finite(view)
        out["exploding"] = rules.exploding(view, t)
        out["dead"] = rules.dead(view, t, set(sparse_rows))
        # A dead layer is reported once, as dead: its zero gradient is also
        # far below the layers after it.
        out["vanishing"] = rules.vanishing(view, t, exclude=out["dead"].accounted_for)
    if checks is not None and len(checks.steps):
        out["check_failure"] = rules.check_failures(checks)
    return out


def _finding(kind, run, verdict):
    evidence = verdict.evidence
    names = list(evidence)
    severity = "error" if "error" in verdict.severity.values() else "warning"
    steps = [min(e["first_step"] for e in evidence.values()), max(e["last_step"] for e in evidence.values())]
    f = finding.Finding(kind, severity, run, names, steps, _METRICS[kind], verdict.aggregate, "", evidence)
    f.message = describe(f)
    return f


def describe(found, quote=None):
    """The finding as one sentence, each layer name passed through ``quote``.

    All sentences are built here, from the finding's plain names and its
    evidence, so each consumer chooses how names appear: the tab keeps the
    default (``finding.isolate``: a bidi isolate), the command line passes
    ``str`` and escapes control characters in its whole output.

    Args:
      found: A ``finding.Finding``.
      quote: Callable name -> text; ``finding.isolate`` when None.

    Returns:
      The sentence.
    """
    if found.kind not in KINDS:  # the optimizer's findings
        return optimizer_findings.describe(found, quote)
    quote = quote or finding.isolate
    f, e = found, found.evidence
    names = finding.name_list(f.layers, quote)
    first, last = f.steps
    if f.kind == "non_finite":
        before = [x["max_finite_norm_before"] for x in e.values() if x.get("max_finite_norm_before") is not None]
        firsts = [n for n in f.layers if e[n]["first_step"] == first]
        where = "" if len(firsts) == len(f.layers) else f" in {finding.name_list(firsts, quote)}"
        text = (
            f"NaN/Inf gradients in {names}, first at step {first}{where} "
            f"({sum(x['steps_with_nonfinite'] for x in e.values())} layer-steps affected)"
        )
        if before:
            text += f"; the largest finite norm before it was {max(before):.3g}"
        scales = [x["loss_scale"] for x in e.values() if x.get("loss_scale") is not None]
        if scales:
            text += (
                f"; the loss scaler refused these steps and cut its scale to {min(scales):.3g}, "
                "so the gradient is not finite even unscaled"
            )
        return text + "."
    if f.kind == "exploding":
        worst = max(e.values(), key=lambda x: x["max_norm"] or 0.0)
        detail = []
        if worst["rise_orders"] is not None:
            detail.append(f"{worst['rise_orders']:.1f} orders above its trailing median {worst['baseline_norm']:.3g}")
        if worst["growth_orders_half_window"] is not None:
            detail.append(f"grew {worst['growth_orders_half_window']:.1f} orders in half a baseline window")
        outcomes = {x["outcome"] for x in e.values()}
        order = ("ends in NaN/Inf", "ends with no gradient at all", "sustained", "recovered")
        detail.append(next(o for o in order if o in outcomes))
        return (
            f"Exploding gradients in {names}: norm up to {worst['max_norm']:.3g} "
            f"({', '.join(detail)}), steps {first}-{last}."
        )
    if f.kind == "vanishing":
        orders = [
            x["median_orders_below_later_layers"]
            for x in e.values()
            if x["median_orders_below_later_layers"] is not None
        ]
        detail = (
            f"{min(orders):.1f}-{max(orders):.1f} orders of magnitude below the layers after them"
            if orders
            else "too small against its weights to change them in float32"
        )
        return f"Vanishing gradients in {names}: gradient norm {detail}, steps {first}-{last}."
    if f.kind == "dead":
        share = [x["median_dead_unit_fraction"] for x in e.values()]
        lo, hi = f"{min(share):.0%}", f"{max(share):.0%}"
        behind = max(x.get("layers_cut_off_behind", 0) for x in e.values())
        return (
            f"Dead units in {names}: {lo if lo == hi else lo + '-' + hi} of the units get an exactly zero "
            f"gradient on whole batches, steps {first}-{last}"
            + (f"; no gradient reaches the {behind} layer{'s' if behind > 1 else ''} before it." if behind else ".")
        )
    worst = max(x["max_relative_error"] for x in e.values())
    return f"Gradient check failed for {names}: analytic and numeric gradients differ by up to {worst:.2%}."
