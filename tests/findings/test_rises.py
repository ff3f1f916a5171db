"""Growth that settles at a new level is information, not an explosion (``rises.settled``).

Runs whose norms are set by hand (``norm_runs.findings``), written by the
real PyTorch writer, read back as the tab reads them.
"""

import norm_runs
from tb_gradcheck.findings import rules

MLP = ["dense_0", "dense_1", "head"]


def _run(tmp_path, paths, norm, name="run", **kwargs):
    return norm_runs.findings(tmp_path / name, paths, norm, **kwargs)


def _only(found, kind):
    (f,) = [f for f in found if f.kind == kind]
    return f


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
