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
      severity: ``"error"`` or ``"warning"``: error for non-finite gradients,
        failed checks, and rises that are large and sustained or end in
        non-finite values; warning for everything weaker.
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
