"""Phases that are over: a warning that ended long before the run's end is information, for every kind; growth that settles is no explosion.

``finding.settle_ended`` (one rule for every kind) and ``rises.settled``
(growth that held its new level), on runs whose norms are set by hand
(``norm_runs.findings``), written by the real PyTorch writer, read back as the tab
reads them.
"""

import norm_runs
from tb_gradcheck.findings import finding
from tb_gradcheck.findings import rules

MLP = ["dense_0", "dense_1", "head"]


def _run(tmp_path, paths, norm, name="run", **kwargs):
    return norm_runs.findings(tmp_path / name, paths, norm, **kwargs)


def _only(found, kind):
    (f,) = [f for f in found if f.kind == kind]
    return f


def _vanishing_until(end):
    return lambda step, p: 1e-1 if p == "head" else 1e-6 if p == "dense_0" and step < end else 1e-2


def test_vanishing_that_ended_early_is_information_and_one_that_goes_on_a_warning(tmp_path):
    f = _only(_run(tmp_path, MLP, _vanishing_until(30), name="early"), "vanishing")
    assert f.severity == "info" and f.layers == ["dense_0"] and f.steps[1] < 50
    assert f.evidence["dense_0"]["writes_after_it"] >= 50
    assert "a phase that is over" in f.message
    # Ended in the latter half of the run: not long before its end, still a warning.
    f = _only(_run(tmp_path, MLP, _vanishing_until(70), name="late"), "vanishing")
    assert f.severity == "warning" and "writes_after_it" not in f.evidence["dense_0"]


def test_a_short_runs_few_clean_writes_do_not_end_a_phase(tmp_path):
    """12 writes after it, in a run of 30: the latter half, but not a whole baseline window (20 writes)."""
    f = _only(_run(tmp_path, MLP, _vanishing_until(12), steps=30), "vanishing")
    assert f.severity == "warning", f.message


def test_a_spike_early_in_the_run_is_information_as_the_vanishing_phase_is(tmp_path):
    def spike_at(s):
        return lambda step, p: 1e3 if step == s and p == "dense_1" else 1e-1 if p == "head" else 1e-2

    f = _only(_run(tmp_path, MLP, spike_at(20), name="early"), "exploding")
    assert f.severity == "info" and f.evidence["dense_1"]["outcome"] == "recovered"
    f = _only(_run(tmp_path, MLP, spike_at(80), name="late"), "exploding")
    assert f.severity == "warning"


def _growth(step, p, top=-0.5, end=100):
    """dense_1 at 1e-2 to step 60, then up 0.15 orders a step to ``top``, held there to ``end``, then back to 1e-2."""
    if p != "dense_1":
        return 1e-1 if p == "head" else 1e-2
    level = min(-2.0 + 0.15 * max(step - 60, 0), top)
    return 10.0 ** (level if step < end else -2.0)


def test_growth_to_a_level_that_then_holds_is_information_not_an_explosion(tmp_path):
    """A network leaving its plateau: 1.5 orders in ten writes, then that level for the rest of the run."""
    f = _only(_run(tmp_path, MLP, _growth, steps=120), "exploding")
    assert f.severity == "info" and f.evidence["dense_1"]["outcome"] == rules.HELD, f.message
    assert "not a divergence" in f.message


def test_growth_that_goes_on_or_falls_back_stays_a_warning(tmp_path):
    # Still growing when the run ends: no window after it to settle in.
    f = _only(_run(tmp_path, MLP, lambda step, p: _growth(step, p, top=1.0), steps=75, name="on"), "exploding")
    assert f.severity in ("warning", "error") and f.evidence["dense_1"]["outcome"] != rules.HELD
    # Back to where it started ten writes after: a slow spike, not a new level.
    f = _only(_run(tmp_path, MLP, lambda step, p: _growth(step, p, end=75), steps=120, name="back"), "exploding")
    assert f.severity == "warning" and f.evidence["dense_1"]["outcome"] != rules.HELD


def test_growth_that_holds_while_the_weights_are_thrown_about_stays_a_warning(tmp_path):
    """The level holds, but the weights grow a hundredfold after it: the update is not bounded."""
    found = _run(
        tmp_path, MLP, _growth, steps=120, weights=lambda step, p: 100.0 if p == "dense_1" and step > 75 else 1.0
    )
    f = _only(found, "exploding")
    assert f.severity == "warning" and f.evidence["dense_1"]["outcome"] != rules.HELD


def _finding(kind, severity, last):
    evidence = {"a": {"first_step": 0, "last_step": last, "reason": "x"}}
    return finding.Finding(kind, severity, "r", ["a"], [0, last], "grad_norm", "last", "", evidence)


def test_settle_ended_treats_every_kind_alike_and_leaves_errors_alone():
    steps = list(range(100))
    kinds = ("vanishing", "exploding", "dead", "clipping", "not_learning")
    found = [_finding(k, "warning", 10) for k in kinds] + [_finding("exploding", "error", 10)]
    out = finding.settle_ended(found, steps, 20, lambda f: f.kind)
    assert [(f.kind, f.severity) for f in out] == [*((k, "info") for k in kinds), ("exploding", "error")]
    assert all(f.evidence["a"]["writes_after_it"] == 89 for f in out[:-1])
