"""A finding, the record every rule's verdict becomes, and how layer names appear in its sentence; no TensorFlow.

``diagnose`` and ``optimizer`` both make findings; ``diagnose``
words every one of them (``diagnose.describe``) with the helpers here.
"""

import dataclasses


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


def isolate(name):
    """A layer name as a Unicode bidi isolate (FSI ... PDI) inside a message.

    Names are user data: one holding a right-to-left override (U+202E)
    would otherwise reverse the rest of the sentence, numbers included, in
    the tab and in a terminal. The isolate ends every override the name
    opens; the marks themselves are invisible.
    """
    return f"\u2068{name}\u2069"


# What follows from what, one tier at a time: ``(cause kind, least severity
# of a cause, what follows from it)``, where what follows is None (every
# weaker finding) or ``{kind: reasons}``, reasons None for any or the
# evidence ``reason`` a layer of that kind must have. What
# goes wrong after a gradient went non-finite or exploded, on the layers it
# hit, follows from it (dead units after the weights exploded, clipping that
# binds because the gradient explodes). A layer whose gradient vanishes
# does not learn for that reason: its update is its gradient's, too small
# to move float32 weights or far behind the other layers' (a layer the
# optimizer leaves out, or a whole network at too small a learning rate,
# does not learn for another reason). The tiers run in
# order, so a consequence of a warning that is itself a consequence of an
# error is attached to the error.
# The reasons a layer does not learn (``optimizer.find``) that a small
# gradient gives: its update rounds away in float32, or lags the others'.
BELOW_FLOAT32 = "below what moves float32 weights"
BEHIND_OTHERS = "orders of magnitude below the other layers"
FOLLOWS = (
    (("non_finite", "error", None), ("exploding", "error", None)),
    (
        (
            "vanishing",
            "warning",
            {"not_learning": (BELOW_FLOAT32, BEHIND_OTHERS)},
        ),
    ),
)
# The kinds whose error is a cause of every weaker finding.
CAUSES = tuple(kind for kind, _, _ in FOLLOWS[0])
_RANK = {"error": 2, "warning": 1, "info": 0}


def attach_consequences(findings, describe):
    """The findings with every one that follows from a cause (``FOLLOWS``) attached to it.

    A layer of a finding follows from a cause when the cause names the same
    layer, the finding is of a kind that follows from the cause's and no
    more severe than it (of a weaker severity, for a cause of every kind),
    and its first step for the layer lies within the cause's steps for it.
    Such layers move into a copy of the finding attached to the cause
    (``Finding.consequences``; to the earliest cause when two qualify); the
    rest of it stays listed. One cause, reported once, with what it did
    attached rather than listed beside it.

    Args:
      findings: A list of ``Finding``, in order.
      describe: Callable finding -> sentence (``diagnose.describe``), to
        word the parts a finding is split into and the causes again.

    Returns:
      The list without the attached parts, in the same order.
    """
    for tier in FOLLOWS:
        findings = _attach(findings, tier, describe)
    return findings


def _attach(findings, tier, describe):
    rules = {kind: (_RANK[least], follows) for kind, least, follows in tier}
    causes = [f for f in findings if f.kind in rules and _RANK.get(f.severity, 0) >= rules[f.kind][0]]
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
            owner = _cause_of(
                causes, [i for i in able if _reason_follows(f, e, causes[i], rules)], layer, e["first_step"]
            )
            (kept if owner is None else moved.setdefault(owner, [])).append(layer)
        for owner, layers in moved.items():
            causes[owner].consequences.append(_part(f, layers, describe))
        if kept:
            out.append(f if len(kept) == len(f.layers) else _part(f, kept, describe))
    for cause in causes:
        if cause.consequences:
            cause.message = describe(cause)
    return out


def _follows(kind, rank, cause, rules):
    """Whether a finding of ``kind`` and severity ``rank`` can follow from ``cause``."""
    follows = rules[cause.kind][1]
    cause_rank = _RANK.get(cause.severity, 0)
    if follows is None:
        return rank < cause_rank
    return kind in follows and rank <= cause_rank


def _reason_follows(found, evidence, cause, rules):
    """Whether the reason of one layer of ``found`` (its ``evidence``) is one that follows from ``cause``."""
    follows = rules[cause.kind][1]
    reasons = None if follows is None else follows[found.kind]
    return reasons is None or evidence.get("reason") in reasons


def _cause_of(causes, able, layer, first_step):
    best = None
    for i in able:
        e = causes[i].evidence.get(layer)
        if e is not None and e["first_step"] <= first_step <= e["last_step"]:
            if best is None or e["first_step"] < causes[best].evidence[layer]["first_step"]:
                best = i
    return best


def _part(found, layers, describe):
    """A copy of ``found`` about ``layers`` only, its steps and sentence made again."""
    evidence = {layer: found.evidence[layer] for layer in layers}
    steps = [min(e["first_step"] for e in evidence.values()), max(e["last_step"] for e in evidence.values())]
    part = dataclasses.replace(found, layers=list(layers), steps=steps, evidence=evidence, consequences=[])
    part.message = describe(part)
    return part
