"""Findings on the labelled corpus: per scenario expected vs reported, precision and recall, old rules vs new.

Trains every scenario of tests/corpus (real seeded runs on the CPU, written by
the real writer), reads each run back through TensorBoard's Python data path
(``store.local_store``) and runs two sets of rules over the same matrices:

- baseline: ``diagnose.py`` as of commit ``BASELINE_COMMIT`` (whole-run
  medians, a fixed ceiling of 1e3, dead = share of zero gradient elements),
  loaded from git;
- value: the current ``tb_gradcheck.diagnose``.

A claim is one (kind, layer) a finding names; precision is right claims over
all claims, recall is required (kind, layer) pairs found over all required
(tests/corpus ``score``). ``--quick`` leaves out ResNet50 and MobileNetV2.
"""

import importlib.util
import os
import pathlib
import subprocess
import sys
import tempfile

from benchmarks.common import ROOT
from benchmarks.common import row

BASELINE_COMMIT = "bca6f21"
HEAVY = ("resnet50_fit", "mobilenetv2_fit")


def _baseline_rules():
    """The findings rules as they were before issue #10, or None when git cannot show them."""
    try:
        source = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{BASELINE_COMMIT}:tb_gradcheck/diagnose.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    path = pathlib.Path(tempfile.mkdtemp(prefix="old_rules_")) / "old_diagnose.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("old_diagnose", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _findings(rules, logdir, names):
    from tb_gradcheck import queries
    from tb_gradcheck import store

    s, ctx, eid = store.local_store(logdir)
    out = {}
    for name in names:
        index = s.run(ctx, eid, name)
        stats = queries.matrix(s, ctx, eid, index, "stats", "layer") if index.layouts("stats", "layer") else None
        checks = queries.matrix(s, ctx, eid, index, "check", "layer") if index.layouts("check", "layer") else None
        found = rules.find(name, stats, checks, None, sparse_rows=index.sparse_rows("layer"))
        out[name] = [f.to_dict() for f in found]
    return out


def _totals(corpus, results, found):
    right = required = hit = healthy_errors = 0
    wrong = []
    for name, result in results.items():
        scenario = corpus.SCENARIOS[name]
        score = corpus.score(scenario, found[name], result.numbers)
        right += len(score.right)
        wrong += [(name, *claim) for claim in score.wrong]
        required += sum(len(e.layers) for e in scenario.expect)
        hit += sum(len(e.layers) for e in scenario.expect) - len(score.missed)
        healthy_errors += len(score.errors_on_healthy)
    precision = right / (right + len(wrong)) if right + len(wrong) else 1.0
    recall = hit / required if required else 1.0
    return precision, recall, healthy_errors, wrong


def _describe(findings):
    return (
        "; ".join(
            f"{f['severity']} {f['kind']} {','.join(f['layers'])} @{f['steps'][0]}-{f['steps'][1]}" for f in findings
        )
        or "none"
    )


def run(quick=False):
    sys.path.insert(0, str(ROOT / "tests"))
    import corpus

    names = [n for n in sorted(corpus.SCENARIOS) if not (quick and n in HEAVY)]
    logdir = pathlib.Path(tempfile.mkdtemp(prefix="findings_corpus_"))
    results = corpus.run(logdir, names)
    from tb_gradcheck import diagnose

    new = _findings(diagnose, logdir, names)
    old_rules = _baseline_rules()
    old = _findings(old_rules, logdir, names) if old_rules else None
    for name in names:
        scenario, result = corpus.SCENARIOS[name], results[name]
        expected = "; ".join(f"{e.severity or ''} {e.kind} {','.join(e.layers)}".strip() for e in scenario.expect)
        print(
            f"{name} ({result.seconds:.0f} s){' PREMISE BROKEN: ' + str(result.broken_premises) if result.broken_premises else ''}"
        )
        print(f"  expected: {expected or 'none (healthy)'}")
        print(f"  reported: {_describe(new[name])}")
        if old:
            print(f"  before:   {_describe(old[name])}")
    p, r, e, wrong = _totals(corpus, results, new)
    rows = []
    if old:
        p0, r0, e0, _ = _totals(corpus, results, old)
        rows += [
            row(
                "findings precision (before: old rules)",
                p0,
                p,
                "fraction",
                target=None,
                lower_is_better=False,
                limit=0.95,
            ),
            row("findings recall (before: old rules)", r0, r, "fraction", lower_is_better=False, limit=1.0),
            row("error findings on healthy runs (before: old rules)", e0, e, "findings", limit=0),
        ]
    else:
        rows += [
            row("findings precision", None, p, "fraction", lower_is_better=False, limit=0.95),
            row("findings recall", None, r, "fraction", lower_is_better=False, limit=1.0),
            row("error findings on healthy runs", None, e, "findings", limit=0),
        ]
    if wrong:
        print("false alarms:", wrong)
    broken = [n for n in names if results[n].broken_premises]
    rows.append(row("scenarios whose premise broke", None, len(broken), "scenarios", limit=0))
    return rows


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from benchmarks.__main__ import print_table

    print_table(run(quick="--quick" in sys.argv))
