"""A finding, the record every rule's verdict becomes, and how layer names appear in its sentence; no TensorFlow.

``diagnose`` and ``optimizer_findings`` both make findings; ``diagnose``
words every one of them (``diagnose.describe``) with the helpers here.
"""

import dataclasses


@dataclasses.dataclass
class Finding:
    """One diagnosis.

    Attributes:
      kind: One of ``diagnose.KINDS`` or ``optimizer_findings.KINDS``.
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
      consequences: Weaker findings that follow from this one (an error
        about non-finite or exploding gradients) on the same layers and
        steps, each a ``Finding``: one cause, reported once, with what it
        did attached rather than listed beside it.
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

    def to_dict(self):
        """The finding as JSON-able data."""
        return dataclasses.asdict(self)


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


# The kinds whose error is a cause: what goes wrong after a gradient went
# non-finite or exploded, on the layers it hit, follows from it.
CAUSES = ("non_finite", "exploding")
_RANK = {"error": 2, "warning": 1, "info": 0}


def attach_consequences(findings, describe):
    """The findings with every weaker one that follows from an error of ``CAUSES`` attached to it.

    A layer of a weaker finding (warning or info) follows from a cause when
    the cause names the same layer and the weaker finding's first step for
    it lies within the cause's steps for it: dead units after the weights
    exploded, clipping that binds because the gradient explodes. Such layers
    move into a copy of the weaker finding attached to the cause
    (``Finding.consequences``; to the earliest cause when two qualify); the
    rest of it stays listed.

    Args:
      findings: A list of ``Finding``, in order.
      describe: Callable finding -> sentence (``diagnose.describe``), to
        word the parts a finding is split into and the causes again.

    Returns:
      The list without the attached parts, in the same order.
    """
    causes = [f for f in findings if f.severity == "error" and f.kind in CAUSES]
    if not causes:
        return findings
    out = []
    for f in findings:
        if _RANK.get(f.severity, 0) >= _RANK["error"]:
            out.append(f)
            continue
        moved, kept = {}, []
        for layer in f.layers:
            owner = _cause_of(causes, layer, f.evidence[layer]["first_step"])
            (kept if owner is None else moved.setdefault(owner, [])).append(layer)
        for owner, layers in moved.items():
            causes[owner].consequences.append(_part(f, layers, describe))
        if kept:
            out.append(f if len(kept) == len(f.layers) else _part(f, kept, describe))
    for cause in causes:
        if cause.consequences:
            cause.message = describe(cause)
    return out


def _cause_of(causes, layer, first_step):
    best = None
    for i, cause in enumerate(causes):
        e = cause.evidence.get(layer)
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
