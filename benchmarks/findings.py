"""Findings on the labelled corpus: per scenario expected vs reported, precision, recall and exit codes, old rules vs new.

Trains every scenario of tests/corpus (real seeded runs on the CPU, written by
the real writer), reads each run back through TensorBoard's Python data path
(``store.local_store``) and runs two sets of rules over the same logs:

- baseline: ``tb_gradcheck`` as of commit ``BASELINE_COMMIT``, the rules
  before issue #28 (dead = a share of 25% at any time, no explosion without
  a rise, ``report`` failing on any finding), taken from git into a
  directory of its own and run in a subprocess;
- value: the current rules, and the exit code of the current
  ``tb-gradcheck report`` (its default gate, ``--fail-on error``) on each
  scenario's run.

A claim is one (kind, layer) a finding of warning or error severity names
(consequences attached to a cause included); precision is right claims over
all claims, recall is required (kind, layer) pairs found over all required,
information findings apart (tests/corpus ``score``). ``--quick`` leaves out
ResNet50 and MobileNetV2.
"""

import contextlib
import io
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile

from benchmarks.common import ROOT
from benchmarks.common import row

BASELINE_COMMIT = "0bac55b"
HEAVY = ("resnet50_fit", "mobilenetv2_fit")

# Run by the baseline's interpreter: the old package first on the path.
_OLD_FINDINGS = """
import json, sys
sys.path.insert(0, sys.argv[1])
from tb_gradcheck import queries, store
s, ctx, eid = store.local_store(sys.argv[2])
out = {name: [f.to_dict() for f in queries.findings(s, ctx, eid, name)] for name in sys.argv[3:]}
print(json.dumps(out, default=str))
"""


def _baseline_findings(logdir, names):
    """``{name: [finding dict]}`` from the rules at ``BASELINE_COMMIT``, or None when git cannot show them."""
    old = pathlib.Path(tempfile.mkdtemp(prefix="old_rules_"))
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", BASELINE_COMMIT, "tb_gradcheck"], capture_output=True, check=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(old, filter="data")
        out = subprocess.run(
            [sys.executable, "-c", _OLD_FINDINGS, str(old), str(logdir), *names],
            capture_output=True,
            text=True,
            check=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        ).stdout
    except (OSError, subprocess.CalledProcessError, tarfile.TarError):
        return None
    return json.loads(out.strip().splitlines()[-1])


def _exit_code(run_dir):
    """What ``tb-gradcheck report <run_dir>`` exits with (its default gate), run in this process."""
    from tb_gradcheck import cli

    with contextlib.redirect_stdout(io.StringIO()):
        return cli.main(["report", str(run_dir)])


def _totals(corpus, results, found):
    right = required = hit = healthy_errors = 0
    wrong = []
    for name, result in results.items():
        scenario = corpus.SCENARIOS[name]
        score = corpus.score(scenario, found[name], result.numbers)
        problems = [e for e in scenario.expect if e.severity != "info"]
        right += sum(1 for claim in score.right if claim[3] != "info")
        wrong += [(name, *claim) for claim in score.wrong]
        missed = {(e.kind, layer) for e in problems for layer in e.layers} & set(score.missed)
        required += sum(len(e.layers) for e in problems)
        hit += sum(len(e.layers) for e in problems) - len(missed)
        healthy_errors += len(score.errors_on_healthy)
    precision = right / (right + len(wrong)) if right + len(wrong) else 1.0
    recall = hit / required if required else 1.0
    return precision, recall, healthy_errors, wrong


def _describe(findings):
    parts = []
    for f in findings:
        text = f"{f['severity']} {f['kind']} {','.join(f['layers'])} @{f['steps'][0]}-{f['steps'][1]}"
        if f.get("consequences"):
            text += (
                " (+ " + ", ".join(f"{c['severity']} {c['kind']} x{len(c['layers'])}" for c in f["consequences"]) + ")"
            )
        parts.append(text)
    return "; ".join(parts) or "none"


def run(quick=False):
    sys.path.insert(0, str(ROOT / "tests"))
    import corpus

    names = [n for n in sorted(corpus.SCENARIOS) if not (quick and n in HEAVY)]
    logdir = pathlib.Path(tempfile.mkdtemp(prefix="findings_corpus_"))
    results = corpus.run(logdir, names)
    new = {n: results[n].findings for n in names}
    old = _baseline_findings(logdir, names)
    exits = {n: _exit_code(logdir / n) for n in names}
    # The baseline's report exited 1 on any finding at all.
    old_exits = {n: int(bool(old[n])) for n in names} if old else None
    for name in names:
        scenario, result = corpus.SCENARIOS[name], results[name]
        expected = "; ".join(f"{e.severity or ''} {e.kind} {','.join(e.layers)}".strip() for e in scenario.expect)
        broken = f" PREMISE BROKEN: {result.broken_premises}" if result.broken_premises else ""
        print(f"{name} ({result.seconds:.0f} s){broken}")
        print(f"  expected: {expected or 'none (healthy)'}")
        print(f"  reported: {_describe(new[name])}; report exits {exits[name]}")
        if old:
            print(f"  before:   {_describe(old[name])}; report exited {old_exits[name]}")
    p, r, e, wrong = _totals(corpus, results, new)
    healthy = [n for n in names if corpus.SCENARIOS[n].healthy]
    must_fail = [n for n in names if any(x.severity == "error" for x in corpus.SCENARIOS[n].expect)]
    gate_healthy = sum(exits[n] != 0 for n in healthy)
    gate_errors = sum(exits[n] != 1 for n in must_fail)
    rows = []
    if old:
        p0, r0, e0, _ = _totals(corpus, results, old)
        rows += [
            row("findings precision (before: old rules)", p0, p, "fraction", lower_is_better=False, limit=0.95),
            row("findings recall (before: old rules)", r0, r, "fraction", lower_is_better=False, limit=1.0),
            row("error findings on healthy runs (before: old rules)", e0, e, "findings", limit=0),
            row(
                f"non-zero report exits on the {len(healthy)} healthy runs (before: old gate)",
                sum(old_exits[n] != 0 for n in healthy),
                gate_healthy,
                "runs",
                limit=0,
            ),
            row(
                f"report exits other than 1 on the {len(must_fail)} runs with an error (before: old gate)",
                sum(old_exits[n] != 1 for n in must_fail),
                gate_errors,
                "runs",
                limit=0,
            ),
        ]
    else:
        rows += [
            row("findings precision", None, p, "fraction", lower_is_better=False, limit=0.95),
            row("findings recall", None, r, "fraction", lower_is_better=False, limit=1.0),
            row("error findings on healthy runs", None, e, "findings", limit=0),
            row(f"non-zero report exits on the {len(healthy)} healthy runs", None, gate_healthy, "runs", limit=0),
            row(
                f"report exits other than 1 on the {len(must_fail)} runs with an error",
                None,
                gate_errors,
                "runs",
                limit=0,
            ),
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
