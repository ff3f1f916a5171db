"""A finding, the record every rule's verdict becomes, and how layer names appear in its sentence; no TensorFlow.

``diagnose`` and ``optimizer`` both make findings; ``diagnose``
words every one of them (``diagnose.describe``) with the helpers here.
"""

import dataclasses

import numpy as np


@dataclasses.dataclass
class Finding:
    """One diagnosis.

    Attributes:
      kind: One of ``diagnose.KINDS`` or ``optimizer.KINDS``.
      severity: ``"error"``, ``"warning"`` or ``"info"``: error for
        non-finite gradients, failed checks, and explosions that are
        sustained or end in non-finite values; warning for everything weaker
        that is still a problem; info for what a user may want to see but is
        no problem (idle units in a healthy network, a dead phase that
        recovered). Only error and warning can fail ``tb-gradcheck report``.
      run: The run.
      layers: Affected layer names (plain, as written), in depth order.
      steps: ``[first, last]`` step over all affected layers.
      metric: The heatmap metric that shows it (``grad_norm``, ...).
      aggregate: The aggregate that shows it best.
      message: One readable sentence, names bidi-isolated
        (``diagnose.describe(f)``); a consumer that wants other quoting
        calls ``diagnose.describe(f, quote)``.
      evidence: ``{layer: {number name: value}}``, each with its own
        ``first_step`` and ``last_step``.
      consequences: Findings that follow from this one on the same layers
        and steps (``FOLLOWS``: anything weaker after an error about
        non-finite or exploding gradients; layers not learning because
        their gradient vanishes), each a ``Finding``: one cause, reported
        once, with what it did attached rather than listed beside it.
      labels: ``{layer: label}`` for the layers named by an index, shown with
        their module's class in the sentence (``0 (Linear)``); ``layers`` and
        ``evidence`` keep the names as written.
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
    consequences: list = dataclasses.field(default_factory=list)
    labels: dict = dataclasses.field(default_factory=dict)

    def to_dict(self):
        """The finding as JSON-able data."""
        return dataclasses.asdict(self)


def with_labels(findings, labels):
    """Gives each finding (and what it explains) the labels of its layers, for its sentence."""
    for f in findings:
        f.labels = {n: labels[n] for n in f.layers if n in labels}
        with_labels(f.consequences, labels)
    return findings


def name_list(names, quote, limit=3):
    """Layer names for a sentence, each through ``quote``; past ``limit`` names, a count and the first few."""
    names = [quote(n) for n in names]
    if len(names) <= limit:
        return ", ".join(names)
    return f"{len(names)} layers ({', '.join(names[:limit])}, ...)"


def span(values):
    """The least and the greatest of ``values`` to two figures, or one number where they read the same."""
    lo, hi = f"{min(values):.2g}", f"{max(values):.2g}"
    return lo if lo == hi else f"{lo}-{hi}"


def count(n, noun):
    """``n`` and ``noun``, plural unless ``n`` is 1."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


# How a consequence is named in its cause's sentence (``diagnose.describe``).
CONSEQUENCE_NAMES = {
    "dead": "dead units",
    "vanishing": "vanishing gradients",
    "clipping": "clipping that binds",
    "not_learning": "layers not learning",
}


def last_slab(stats, name):
    """float64 ``[S, R]`` of column ``name``'s ``last`` slab and its missing mask; ``(None, None)`` without it."""
    if name not in stats.columns or "last" not in stats.aggregates:
        return None, None
    values, missing = stats.slab(name, "last")
    return values.astype(np.float64), missing


def isolate(name):
    """A layer name as a Unicode bidi isolate (FSI ... PDI) inside a message.

    Names are user data: one holding a right-to-left override (U+202E)
    would otherwise reverse the rest of the sentence, numbers included, in
    the tab and in a terminal. The isolate ends every override the name
    opens; the marks themselves are invisible.
    """
    return f"\u2068{name}\u2069"


# The reasons a layer does not learn (``optimizer.find``) that a small
# gradient gives: its update rounds away in float32, or lags the others'.
BELOW_FLOAT32 = "below what moves float32 weights"
BEHIND_OTHERS = "orders of magnitude below the other layers"
# The reason of a layer the writer saw no parameter group hold (``outside_optimizer``).
OUTSIDE = "no parameter group of the optimizer holds it"
# The reason of every layer of a network whose weights never move (``still``): no update is applied, which no
# gradient, exploding or not, causes; it never follows from another finding.
STILL = "no layer's weights moved"


@dataclasses.dataclass(frozen=True)
class Follows:
    """One way a finding follows from another (``FOLLOWS``).

    Attributes:
      cause: The cause's kind.
      least: The least severity of a cause.
      kinds: What follows: None (every weaker finding), or ``{kind:
        reasons}``, reasons None for any or the evidence ``reason`` a layer
        of that kind must have.
      cause_reasons: None, or the evidence ``reason`` a layer of the cause
        must have to be one.
      reach: ``"layer"``: the cause names the same layer. ``"above"``: a
        layer of the cause lies above the point the consequence's gradient
        decays across (at or after its evidence's ``decays_below`` row, in
        depth order).
    """

    cause: str
    least: str
    kinds: dict = None
    cause_reasons: tuple = None
    reach: str = "layer"


# What follows from what, one tier at a time. What goes wrong after a
# gradient went non-finite or exploded, on the layers it hit, follows from it
# (dead units after the weights exploded, clipping that binds because the
# gradient explodes), and whatever is found in gradients a loop never
# cleared (each a sum of every step's so far). A layer whose gradient vanishes does not learn for
# that reason: its update is its gradient's, too small to move float32
# weights or far behind the other layers' (a layer the optimizer leaves
# out, or a whole network at too small a learning rate, does not learn for
# another reason). A unit whose tanh or sigmoid output saturates gets a gradient of exactly 0 (the derivative
# rounds to 0 in float32): a saturated layer's units without gradient are its saturated units, not ReLU units
# that died or idle. A body whose gradient is orders below a head that the
# optimizer leaves out vanishes because of it: the head keeps its small
# initial weights, and the backward signal into the body passes through
# them (a head that does not learn for its gradient's sake is itself in the
# decay, not above it). The tiers run in order, so a consequence of a
# warning that is itself a consequence of an error is attached to the error,
# and what a vanishing body caused goes with it under the head.
FOLLOWS = (
    (Follows("non_finite", "error"), Follows("exploding", "error"), Follows("not_cleared", "error")),
    (
        Follows("vanishing", "warning", {"not_learning": (BELOW_FLOAT32, BEHIND_OTHERS)}),
        Follows("saturated", "warning", {"dead": None}),
    ),
    (Follows("not_learning", "warning", {"vanishing": None}, cause_reasons=(OUTSIDE,), reach="above"),),
)
# The kinds whose error is a cause of every weaker finding.
CAUSES = tuple(rule.cause for rule in FOLLOWS[0])
_RANK = {"error": 2, "warning": 1, "info": 0}


def settle_ended(findings, steps, window, describe):
    """The findings with every warning's layers whose phase ended long before the run's latest write made information.

    One rule for every kind (vanishing, exploding, dead, clipping, not
    learning): a layer's part of a warning is over when its last flagged
    step lies before the latter half of the run's writes and at least
    ``window`` writes came after it. The latter half: the run has then
    spent at least as long free of it as up to its end, so it was an early
    transient (a network leaving its initialisation, a warm-up), not the
    state the run trains in. The window: the writes any rule needs to call a
    state established (``Thresholds.baseline_writes``), so a short run's few
    clean writes do not make a phase over. Such a part becomes a copy of the
    finding at severity "info", its evidence saying how many writes came
    after it (``writes_after_it``); the rest stays a warning. Errors stay
    errors: a gradient that was not finite, or that threw the weights about
    for several writes, may have left them damaged, however healthy the
    gradient is since. The verdict of every rule stays causal; only the
    severity is read against the run's end, so a run that is still being
    written can see a warning become information later.

    Args:
      findings: A list of ``Finding``.
      steps: The run's written steps, ascending.
      window: ``Thresholds.baseline_writes``.
      describe: Callable finding -> sentence (``diagnose.describe``).

    Returns:
      The list, each warning split into its ongoing part and its ended
      part where it has both, in the same order.
    """
    n = len(steps)
    if n == 0:
        return findings
    latter = steps[n // 2]
    out = []
    for f in findings:
        if f.severity != "warning":
            out.append(f)
            continue
        after = {
            layer: int(n - np.searchsorted(steps, f.evidence[layer]["last_step"], side="right")) for layer in f.layers
        }
        ended = [layer for layer in f.layers if f.evidence[layer]["last_step"] < latter and after[layer] >= window]
        if not ended:
            out.append(f)
            continue
        ongoing = [layer for layer in f.layers if layer not in ended]
        if ongoing:
            out.append(_part(f, ongoing, describe))
        over = _part(f, ended, describe)
        over.severity = "info"
        over.evidence = {layer: {**e, "writes_after_it": after[layer]} for layer, e in over.evidence.items()}
        over.message = describe(over)
        out.append(over)
    return out


def attach_consequences(findings, describe, depth=None):
    """The findings with every one that follows from a cause (``FOLLOWS``) attached to it.

    A layer of a finding follows from a cause when the cause names a layer
    it reaches (the same layer; for a head the optimizer leaves out, the
    layers whose gradient decays below it: ``Follows.reach``) for a reason
    that can cause it, the finding is of a kind that follows from the
    cause's and no more severe than it (of a weaker severity, for a cause of
    every kind), and its first step for the layer lies within the cause's
    steps for that layer. Such layers move into a copy of the finding
    attached to the cause (``Finding.consequences``; to the earliest cause
    when two qualify), with what they caused themselves; the rest of it
    stays listed. One cause, reported once, with what it did attached
    rather than listed beside it.

    Args:
      findings: A list of ``Finding``, in order.
      describe: Callable finding -> sentence (``diagnose.describe``), to
        word the parts a finding is split into and the causes again.
      depth: ``{layer: index}`` in depth order, for ``reach="above"``; None
        leaves those rules out.

    Returns:
      The list without the attached parts, in the same order.
    """
    for tier in FOLLOWS:
        findings = _attach(findings, tier, describe, depth or {})
    return findings


def _attach(findings, tier, describe, depth):
    rules = {rule.cause: rule for rule in tier}
    causes = [f for f in findings if f.kind in rules and _RANK.get(f.severity, 0) >= _RANK[rules[f.kind].least]]
    if not causes:
        return findings
    out = []
    for f in findings:
        rank = _RANK.get(f.severity, 0)
        able = [i for i, c in enumerate(causes) if c is not f and _follows(f.kind, rank, c, rules)]
        if not able:
            out.append(f)
            continue
        moved, kept = {}, []
        for layer in f.layers:
            e = f.evidence[layer]
            reasons = [i for i in able if _reason_follows(f, e, causes[i], rules)]
            owner = _cause_of(causes, reasons, layer, e, rules, depth)
            (kept if owner is None else moved.setdefault(owner, [])).append(layer)
        for owner, layers in moved.items():
            part = _part(f, layers, describe)
            # What the part caused goes with it: one list under the first cause.
            causes[owner].consequences += [part, *part.consequences]
            part.consequences = []
            part.message = describe(part)
        if kept:
            out.append(f if len(kept) == len(f.layers) else _part(f, kept, describe))
    for cause in causes:
        if cause.consequences:
            cause.message = describe(cause)
    return out


def _follows(kind, rank, cause, rules):
    """Whether a finding of ``kind`` and severity ``rank`` can follow from ``cause``."""
    follows = rules[cause.kind].kinds
    cause_rank = _RANK.get(cause.severity, 0)
    if follows is None:
        return rank < cause_rank
    return kind in follows and rank <= cause_rank


def _reason_follows(found, evidence, cause, rules):
    """Whether the reason of one layer of ``found`` (its ``evidence``) is one that follows from ``cause``."""
    follows = rules[cause.kind].kinds
    reasons = None if follows is None else follows[found.kind]
    return evidence.get("reason") != STILL and (reasons is None or evidence.get("reason") in reasons)


def _cause_of(causes, able, layer, evidence, rules, depth):
    """The index in ``causes`` of the earliest cause that reaches ``layer`` (``evidence``) in time, or None."""
    best = None
    first_step = evidence["first_step"]
    for i in able:
        rule = rules[causes[i].kind]
        for e in _reaching(causes[i], rule, layer, evidence, depth):
            if e["first_step"] <= first_step <= e["last_step"]:
                if best is None or e["first_step"] < best[1]:
                    best = (i, e["first_step"])
    return None if best is None else best[0]


def _reaching(cause, rule, layer, evidence, depth):
    """The evidence of each layer of ``cause`` that reaches ``layer`` under ``rule`` (``Follows.reach``)."""
    if rule.reach == "above":
        point = depth.get(evidence.get("decays_below"))
        names = [n for n in cause.layers if point is not None and depth.get(n, -1) >= point]
    else:
        names = [layer] if layer in cause.evidence else []
    return [
        cause.evidence[n]
        for n in names
        if rule.cause_reasons is None or cause.evidence[n].get("reason") in rule.cause_reasons
    ]


def _part(found, layers, describe):
    """A copy of ``found`` about ``layers`` only, with the consequences on them, its steps and sentence made again; None for no layers."""
    if not layers:
        return None
    evidence = {layer: found.evidence[layer] for layer in layers}
    steps = [min(e["first_step"] for e in evidence.values()), max(e["last_step"] for e in evidence.values())]
    within = [_part(c, [n for n in c.layers if n in evidence], describe) for c in found.consequences]
    within = [c for c in within if c is not None]
    part = dataclasses.replace(found, layers=list(layers), steps=steps, evidence=evidence, consequences=within)
    part.message = describe(part)
    return part
