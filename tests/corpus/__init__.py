"""A labelled corpus of real training runs: each scenario, its premise and the findings it must (not) get.

A scenario is a small seeded training run on the CPU, written by the real
writer (``GradientWriter`` or ``GradientCallback``), with

- a docstring saying what it is and where it comes from (literature or
  practice),
- a premise it checks from numbers it computes itself (the loss fell, the
  share of dead units, the first NaN step, ...), so that a scenario cannot
  silently stop being what it claims,
- its expected findings (``Expect``): none for a healthy run; for a
  pathological one, the kind, the layers that must be named, the layers
  that may be, the steps and the severity.

The findings are read back the way a user sees them: through TensorBoard's
data provider and the plugin's ``findings`` route. ``score`` compares them
with the expectations; tests/findings/test_corpus.py asserts on it and
``python -m benchmarks --only findings`` prints it.
"""

import dataclasses
import time

from corpus import fine_tunes  # noqa: F401  (registers the scenarios)
from corpus import from_init  # noqa: F401  (registers the scenarios)
from corpus import healthy  # noqa: F401  (registers the scenarios)
from corpus import pathological  # noqa: F401  (registers the scenarios)
from corpus import torch_runs  # noqa: F401  (registers the scenarios)
from corpus import units  # noqa: F401  (registers the scenarios)
from corpus import unseen  # noqa: F401  (registers the scenarios)
from corpus.registry import SCENARIOS  # noqa: F401
from corpus.registry import Expect  # noqa: F401
from corpus.registry import Scenario  # noqa: F401


@dataclasses.dataclass
class Result:
    """One scenario after training: its premise numbers, failed premise claims, and its findings."""

    name: str
    numbers: dict
    broken_premises: list
    findings: list
    seconds: float


def train(names, logdir):
    """Trains the named scenarios into ``logdir/<name>``; returns ``{name: (numbers, broken claims, seconds)}``."""
    out = {}
    for name in names:
        scenario = SCENARIOS[name]
        started = time.time()
        numbers, claims = scenario.train(str(logdir / name))
        out[name] = (numbers, [text for text, ok in claims if not ok], time.time() - started)
    return out


def read_findings(logdir, names):
    """``{name: [finding dict]}`` through the plugin's ``findings`` route on TensorBoard's Python data path."""
    from conftest import get_json
    from conftest import make_app

    client, _ = make_app(logdir, "python")
    return {name: get_json(client, f"/data/plugin/gradients/findings?run={name}")["findings"] for name in names}


def run(logdir, names=None):
    """Trains and reads the scenarios; returns ``{name: Result}``."""
    names = list(names or SCENARIOS)
    trained = train(names, logdir)
    found = read_findings(logdir, names)
    return {n: Result(n, trained[n][0], trained[n][1], found[n], trained[n][2]) for n in names}


@dataclasses.dataclass
class Score:
    """How one scenario's findings compare with its expectations.

    A claim is one (kind, layer) a finding names, consequences attached to a
    cause included (they are reported, under their cause). A claim of
    warning or error severity is right when an ``Expect`` of that kind
    requires or allows the layer and the layer's first flagged step is in
    the expected range; every other one is a false alarm. An information
    claim is no alarm: it is right when an ``Expect`` asks for it, and
    otherwise only noted (a severity mismatch where the ``Expect`` requires
    that layer at another severity). A required layer no right claim names
    is missed. Severity mismatches are listed apart.

    Attributes:
      right: ``(kind, layer, first step, severity)`` of each right claim.
      wrong: The same, of each false alarm.
      missed: ``(kind, layer)`` of each required layer not named.
      wrong_severity: ``(kind, reported, expected)``.
      errors_on_healthy: Kinds of the error findings of a healthy scenario.
      notes: Information claims no ``Expect`` asked for.
    """

    right: list
    wrong: list
    missed: list
    wrong_severity: list
    errors_on_healthy: list
    notes: list


def claims(findings):
    """Every finding and every consequence attached to one, as one list of ``(finding, kind of its cause or "")``."""
    return [
        (c, cause) for f in findings for c, cause in [(f, ""), *((c, f["kind"]) for c in f.get("consequences", []))]
    ]


def score(scenario, findings, numbers):
    right, wrong, wrong_severity, notes = [], [], [], []
    for f, cause in claims(findings):
        # A claim an Expect wants attached under a cause (``Expect.under``) is right only there.
        expects = [e for e in scenario.expect if e.kind == f["kind"] and e.under in ("", cause)]
        info = f["severity"] == "info"
        for layer in f["layers"]:
            first = f["evidence"][layer]["first_step"]
            claim = (f["kind"], layer, first, f["severity"])
            match = next((e for e in expects if e.covers(layer, first, numbers)), None)
            if info and not (match and match.severity == "info"):
                # A required layer only shown as information missed its severity; an allowed one may be
                # named or not, and information (a phase over long before the run's end) names it without alarm.
                if match and match.severity and layer in match.layers:
                    wrong_severity.append((f["kind"], f["severity"], match.severity))
                notes.append(claim)
                continue
            (right if match else wrong).append(claim)
            if match and match.severity and match.severity != f["severity"]:
                wrong_severity.append((f["kind"], f["severity"], match.severity))
    named = {(k, layer) for k, layer, _, _ in right}
    missed = [(e.kind, layer) for e in scenario.expect for layer in e.layers if (e.kind, layer) not in named]
    errors = [f["kind"] for f in findings if f["severity"] == "error"] if scenario.healthy else []
    return Score(right, wrong, missed, sorted(set(wrong_severity)), errors, notes)
