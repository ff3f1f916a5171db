"""Findings from stored gradient matrices: vanishing, exploding, dead, non-finite, check failures; numpy only.

``find`` runs the rules (``tb_gradcheck.findings.rules``) over the layer-granularity
matrices the plugin serves and returns ``finding.Finding`` objects that name
the run, the layers (plain names, as written), the step range and the numbers
behind the verdict. The thresholds are in ``Thresholds``, each with the reasoning for
its default. Every sentence is worded by ``describe``, which takes the quoting
of names from its consumer: bidi isolates in the tab (``finding.isolate``,
the default ``message``), plain names in the command line's report.
"""

import dataclasses

import numpy as np

from tb_gradcheck.core import metadata
from tb_gradcheck.findings import activations
from tb_gradcheck.findings import dead_units
from tb_gradcheck.findings import finding
from tb_gradcheck.findings import optimizer
from tb_gradcheck.findings import rules
from tb_gradcheck.findings import vanishing


@dataclasses.dataclass(frozen=True)
class Thresholds(optimizer.OptimizerThresholds, activations.ActivationThresholds):
    """When a pattern becomes a finding. Every field can be overridden.

    The optimizer's and the forward side's thresholds are fields too, inherited from
    ``optimizer.OptimizerThresholds`` and ``activations.ActivationThresholds`` where their
    reasoning is written, so ``--threshold`` reaches them as well.

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
        Also the writes after a growth in which it must settle to be a new
        level (``rises.settled``), and the least a phase needs after it to
        be over (``finding.settle_ended``): a state a window establishes
        takes a window to end.
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
        or more is an error. Also the band growth must settle in
        (``rises.settled``): over the window after it, no further growth of
        this much, no fall back by this much (a slow spike), and the weights'
        norm within this many orders of its value before: a tenfold change
        of the weights is more than the steady steps of training make in a
        window, and a thrown-about network makes more.
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
      vanishing_orders: Orders of magnitude every row below a point in the
        depth order must sit below the largest row above it for the point
        to be a decay (``vanishing.decay_points``). 3: healthy deep nets keep
        layer norms within one or two orders; a thousandfold drop means the
        input side barely learns.
      kind_orders: Orders of magnitude a kind's largest row above a decay
        point must sit above its largest row below it, for every kind (a
        row's role: its name with the block indices taken out, and its
        parameter shapes) with rows on both sides, and half the rows above
        it above every row below (``vanishing``). 1: rows of one kind at
        different depths of a healthy network sit within a factor of a few
        of each other (a residual stream hands every block the same
        gradient; a variance-preserving initialisation keeps a plain stack's
        layers at one scale), so a row within an order of a row of its kind
        above the point is as small as its role makes it, wherever it sits:
        attention's query and key, orders below the value projection in
        every layer while the softmax is near uniform. A real decay lifts
        each kind it crosses, and most rows, by more: 0.5-0.9 orders a layer.
      vanishing_ratio: See ``optimizer.OptimizerThresholds``, which
        reads it too.
      dead_units: A layer's ``dead_unit_fraction`` (units whose every
        parameter gets exactly zero gradient over the whole batch) of at
        least this in every write of the trailing window is shown, as
        information, when it is neither dying, mostly dead nor silent
        (``tb_gradcheck.findings.dead_units``): idle units. The window's minimum,
        because a live but selective ReLU unit (active on 2% of inputs) is
        silent on a batch of 64 about one time in four, while a dead unit is
        silent on every batch: the share truly dead is at most the minimum.
        Information, not a warning, because a share idle from the start is a
        property of healthy networks: with correlated inputs (non-negative
        features, pooled or averaged activations) each unit's response to
        their common component has a sign set by the initialisation, a coin
        flip, so up to about half of a layer can be idle on every input from
        step 0 while the rest trains. 0.25: a quarter of the layer's width.
      dying_share: A layer is dying where at least this share of the units
        that were alive in the run's first ``min_writes`` writes gets no
        gradient in every write of the trailing window: ``(lowest - start) >=
        dying_share * (1 - start)``. A share of the live units, not of the
        layer, because healthy training moves the idle share too: units near
        their threshold on non-centred inputs drift into it (tests/corpus
        ``idle_units_drift``: 19% to 34% of the layer idle on held-out
        inputs in 300 Adam steps, a fifth of its live units; up to a quarter
        in probes at other seeds). 0.4: well past that drift, and from a
        fully live start it is the 40% dead that CS231n's notes give as the
        mark of a too-high learning rate. Units killed by a learning-rate
        jump or a bad step lose far more (60-95% of the live units in the
        corpus).
      dead_mostly: A layer is mostly dead where its dead share was at least
        this in every write of the trailing window, whatever it was at the
        start: a warning, where a smaller share there from the start is
        idle (information). A dead phase is over only once the window's
        share is back under this: partly recovered (information) while it
        is still ``dead_units`` or more, recovered under that. 0.75:
        the idle share a healthy layer can start with comes from a coin
        flip per unit (``dead_units``), which idles about half of a layer at
        most, with a spread of ``0.5 / sqrt(width)``; three quarters is two
        of those spreads above half at a width of 16 (a chance of 4% that
        every unit's flip went that way) and four at 64 (3e-5). A unit dead
        at initialisation that never comes back is no coin flip: a bias or
        weight scale initialised wrong puts most of the layer there.
      dead_silent: A layer is silent where its dead share was at least this
        in every write of the trailing window, whatever it was at the start:
        (almost) none of its units passes any gradient to the layers before
        it. 0.9: at most a tenth of the width left; a coin flip per unit
        silences about half of a layer, and 90% or more of a layer of 16
        units happens by chance less than once in 3,000 (binomial tail).
        Every unit silent on ``min_writes`` batches in a row is silent at
        once.
      explode_ratio: A layer's gradient is too large for its weights where
        its ``grad_to_weight`` (``||g|| / ||W||``) and the whole network's
        are both at least this (``rises.too_large``): it explodes with or
        without a past to rise from (an over-scaled initialisation, a
        recurrent gain above 1, from the first step). An SGD step moves the
        weights by ``lr * ||g|| / ||W||`` of their size; at 1e3 a step at
        lr 1e-3, the low end of the rates SGD is used at, moves them by their
        whole size, and one at the usual 1e-2 to 1e-1 by 10 to 100 times.
        Healthy training sits at network ratios of 0.01 to 10 from the first
        step (0.02 to 30 over the corpus; ResNet50 from scratch at 32x32 is
        the largest, 2.2 at 224x224, and its conv1 in front of BatchNorm is
        at 2e3 alone, which is why the network's ratio must be large too).
        Explosions from the first step sit far above: 1.5e5 to 7e7 in the
        corpus (a tanh RNN of gain 3 over 50 steps, a 30-layer ReLU net at
        twice He's scale). Adam's step ignores the
        gradient's scale, but a gradient 1e3 times the weights still says the
        forward or backward signal is amplified.
    """

    baseline_writes: int = 20
    rise_orders: float = 2.0
    spike_margin_orders: float = 1.0
    growth_orders: float = 1.0
    sustained_writes: int = 3
    persistence: float = 0.5
    min_writes: int = 5
    vanishing_orders: float = 3.0
    kind_orders: float = 1.0
    dead_units: float = 0.25
    dying_share: float = 0.4
    dead_mostly: float = 0.75
    dead_silent: float = 0.9
    explode_ratio: float = 1e3


KINDS = ("non_finite", "check_failure", "exploding", "vanishing", "dead")
# From least to most severe. Only "warning" and "error" are problems.
SEVERITIES = ("info", "warning", "error")

# How sure each kind is, for the README and the tab's help: see README
# "Findings and the command line".
_METRICS = {
    "non_finite": "grad_nonfinite",
    "check_failure": metadata.CHECK_METRIC,
    "exploding": "grad_norm",
    "vanishing": "grad_norm",
    "dead": rules.DEAD_UNITS,
}


def find(
    run,
    stats=None,
    checks=None,
    thresholds=None,
    sparse_rows=(),
    outside_optimizer=(),
    labels=None,
    shapes=None,
    not_cleared_after=None,
):
    """Runs every rule over one run's layer matrices.

    Args:
      run: Run name, for the findings.
      stats: A ``store.Matrix`` of kind stats at layer granularity, or None.
      checks: A ``store.Matrix`` of kind check at layer granularity, or None.
      thresholds: ``Thresholds``; the defaults when None.
      sparse_rows: Names of layers with sparse gradients (exempt from "dead").
      outside_optimizer: Names of layers with a gradient that no parameter
        group of the optimizer holds (the layout says so where the writer
        saw the groups): a warning, not the "frozen" information.
      labels: ``{layer: label}`` for layers named by an index
        (``metadata.labels``): their sentences show the label.
      shapes: Optional ``{layer: shapes}``: each row's parameter shapes
        (or its size), which with its name say its kind
        (``vanishing.kinds``).
      not_cleared_after: None, or the last step before the writer saw the
        gradients go uncleared between steps (``optimizer.find``).

    Returns:
      A list of ``finding.Finding``, most severe first (errors, warnings,
      then information), each severity in the order of ``KINDS``; the
      optimizer's findings follow the rest of their severity. A finding
      that follows from another on the same layers and steps (anything
      weaker after an error about non-finite or exploding gradients; layers
      not learning because their gradient vanishes: ``finding.FOLLOWS``) is
      attached to it (``Finding.consequences``), not listed. A warning
      that ended long before the run's latest write is information
      (``finding.settle_ended``).
    """
    out = []
    found = verdicts(stats, checks, thresholds, sparse_rows, shapes)
    for kind, verdict in found.items():
        out += _findings(kind, run, verdict)
    dead = found["dead"].accounted_for if "dead" in found else ()
    out += optimizer.find(run, stats, thresholds, dead, outside_optimizer, not_cleared_after)
    out += activations.find(run, stats, thresholds or Thresholds())
    if stats is not None:
        window = (thresholds or Thresholds()).baseline_writes
        out = finding.settle_ended(out, np.asarray(stats.steps), window, describe)
    order = [*KINDS, *optimizer.KINDS, *activations.KINDS]
    out.sort(key=lambda f: (-SEVERITIES.index(f.severity), order.index(f.kind)))
    depth = {name: i for i, name in enumerate(stats.rows)} if stats is not None else {}
    out = finding.attach_consequences(out, describe, depth)
    if labels:
        for f in finding.with_labels(out, labels):
            f.message = describe(f)
    return out


def verdicts(stats=None, checks=None, thresholds=None, sparse_rows=(), shapes=None):
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
        out["dead"] = dead_units.dead(view, t, set(sparse_rows))
        # A dead layer is reported once, as dead: its zero gradient is also
        # far below the layers after it.
        out["vanishing"] = vanishing.vanishing(view, t, out["dead"].accounted_for, shapes)
        activations.annotate(out, stats, t)  # the forward view beside the gradient's, where recorded
    if checks is not None and len(checks.steps):
        out["check_failure"] = rules.check_failures(checks)
    return out


def _findings(kind, run, verdict):
    """One verdict's findings: its problems (error when any layer's is) and, apart, its information."""
    out = []
    for info in (False, True):
        evidence = {n: e for n, e in verdict.evidence.items() if (verdict.severity[n] == "info") == info}
        if not evidence:
            continue
        levels = {verdict.severity[n] for n in evidence}
        severity = next(level for level in reversed(SEVERITIES) if level in levels)
        steps = [min(e["first_step"] for e in evidence.values()), max(e["last_step"] for e in evidence.values())]
        f = finding.Finding(kind, severity, run, list(evidence), steps, _METRICS[kind], verdict.aggregate, "", evidence)
        f.message = describe(f)
        out.append(f)
    return out


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
    plain = quote or finding.isolate
    labels = {n: label for c in found.consequences for n, label in c.labels.items()} | found.labels

    def quote(name):
        return plain(labels.get(name, name))

    sentence = activations.describe if found.kind in activations.KINDS else _sentence
    text = (optimizer.describe if found.kind in optimizer.KINDS else sentence)(found, quote)
    text += activations.remark(found, quote)
    after = [e["writes_after_it"] for e in found.evidence.values() if "writes_after_it" in e]
    if after:
        text += (
            f" It ended by step {found.steps[1]}, and the {finding.count(min(after), 'write')} since, the latter half of "
            "the run, are free of it (information: a phase that is over)."
        )
    if found.consequences:
        parts = [
            f"{finding.CONSEQUENCE_NAMES.get(c.kind, c.kind.replace('_', ' '))} in {finding.name_list(c.layers, quote)} "
            f"(steps {c.steps[0]}-{c.steps[1]})"
            for c in found.consequences
        ]
        text += f" It explains what followed: {'; '.join(parts)}."
    return text


def _sentence(found, quote):
    f, e = found, found.evidence
    names = finding.name_list(f.layers, quote)
    first, last = f.steps
    if f.kind == "non_finite":
        before = [x["max_finite_norm_before"] for x in e.values() if x.get("max_finite_norm_before") is not None]
        firsts = [n for n in f.layers if e[n]["first_step"] == first]
        where = "" if len(firsts) == len(f.layers) else f" in {finding.name_list(firsts, quote)}"
        text = (
            f"NaN/Inf gradients in {names}, first at step {first}{where} "
            f"({finding.count(sum(x['writes_with_nonfinite'] for x in e.values()), 'layer-write')} affected)"
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
        if all(x["outcome"] == rules.HELD for x in e.values()):
            grew = sorted({f"{x['growth_orders_half_window']:.1f}" for x in e.values()}, key=float)
            return (
                f"Gradients in {names} grew {'-'.join(dict.fromkeys([grew[0], grew[-1]]))} orders in half a baseline window "
                f"(up to {worst['max_norm']:.3g}), steps {first}-{last}, and then held that level for a whole "
                "window, with no NaN/Inf and the weights not thrown about: a change of level, such as a network "
                "leaving its starting plateau, not a divergence, which grows on (information)."
            )
        detail = []
        ratios = [x for x in e.values() if x.get("max_grad_to_weight") is not None]
        if ratios:
            top = max(ratios, key=lambda x: x["max_grad_to_weight"])
            detail.append(
                f"up to {top['max_grad_to_weight']:.3g} times its weights' norm, so one SGD step at "
                f"learning rate 1e-3 would move them {top['max_grad_to_weight'] * 1e-3:.3g} times their size"
            )
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
        return vanishing.describe(f, quote)
    if f.kind == "dead":
        return dead_units.describe(f, quote)
    worst = max(x["max_relative_error"] for x in e.values())
    return f"Gradient check failed for {names}: analytic and numeric gradients differ by up to {worst:.2%}."
