"""Findings after the rules: what follows from another finding is attached to it (``finding.attach_consequences``), and a warning over long before the run's end is information (``finding.settle_ended``)."""

import norm_runs
from tb_gradcheck.findings import diagnose
from tb_gradcheck.findings import finding


def _finding(kind, severity, layers, first=0, last=99, **evidence):
    e = {n: {"first_step": first, "last_step": last, **evidence} for n in layers}
    return finding.Finding(kind, severity, "r", list(layers), [first, last], "grad_norm", "last", "", e)


def _attach(findings):
    for f in findings:
        f.message = diagnose.describe(f)
    return finding.attach_consequences(findings, diagnose.describe)


def _vanishing(layers, first=0, last=99):
    return _finding(
        "vanishing", "warning", layers, first, last, median_norm=1e-9, median_orders_below_later_layers=5.0,
        fraction_of_steps=1.0, reason="decays across depth",
    )  # fmt: skip


def _not_learning(layers, reason=finding.BELOW_FLOAT32, severity="warning", first=0):
    return _finding(
        "not_learning", severity, layers, first, median_update_to_weight=0.0, median_grad_norm=1.0,
        median_orders_below_other_layers=None, fraction_of_steps=1.0, reason=reason,
    )  # fmt: skip


def test_layers_not_learning_because_their_gradient_vanishes_are_attached_to_the_vanishing_warning():
    out = _attach([_vanishing(["a", "b", "c"]), _not_learning(["a", "b", "d"])])
    assert [(f.kind, f.layers) for f in out] == [("vanishing", ["a", "b", "c"]), ("not_learning", ["d"])]
    (attached,) = out[0].consequences
    assert attached.kind == "not_learning" and attached.layers == ["a", "b"]
    assert "It explains what followed: layers not learning in" in out[0].message


def test_a_layer_the_optimizer_leaves_out_does_not_follow_from_vanishing():
    """Frozen by the optimizer, or a learning rate too small for the whole network: another cause."""
    frozen = _not_learning(["a"], reason="frozen by the optimizer", severity="info")
    slow = _not_learning(["b"], reason="the whole network moves under 1e-06 of its weights per step")
    out = _attach([_vanishing(["a", "b"]), frozen, slow])
    assert not out[0].consequences and len(out) == 3


def test_weights_that_never_move_follow_from_no_other_finding():
    """No update applied is its own cause: an explosion on the same layers and steps does not explain it."""
    exploding = _finding(
        "exploding", "error", ["a"], max_norm=1e6, baseline_norm=1.0, rise_orders=6.0,
        growth_orders_half_window=None, outcome="sustained",
    )  # fmt: skip
    still = _finding(
        "not_learning", "warning", ["a", "b"], weight_norm=1.0, median_grad_norm=1.0, writes_unchanged=100,
        reason=finding.STILL,
    )  # fmt: skip
    out = _attach([exploding, still])
    assert [(f.kind, f.layers) for f in out] == [("exploding", ["a"]), ("not_learning", ["a", "b"])]
    assert "No weights move" in out[1].message and not out[0].consequences


def test_not_learning_before_the_gradient_vanished_does_not_follow_from_it():
    out = _attach([_vanishing(["a"], first=50), _not_learning(["a"], first=10)])
    assert not out[0].consequences and [f.kind for f in out] == ["vanishing", "not_learning"]


def test_what_follows_an_error_is_attached_to_the_error_before_any_warning_takes_it():
    """A not_learning layer after an explosion on it goes to the explosion, though it also vanishes."""
    exploding = _finding(
        "exploding", "error", ["a"], max_norm=1e6, baseline_norm=1.0, rise_orders=6.0,
        growth_orders_half_window=None, outcome="sustained",
    )  # fmt: skip
    out = _attach([exploding, _vanishing(["a", "b"]), _not_learning(["a", "b"])])
    assert [c.kind for c in out[0].consequences] == ["vanishing", "not_learning"]
    assert out[0].consequences[1].layers == ["a"] and out[0].consequences[0].layers == ["a"]
    (vanishing,) = [f for f in out if f.kind == "vanishing"]
    assert vanishing.layers == ["b"] and [c.layers for c in vanishing.consequences] == [["b"]]


DEPTH = {name: i for i, name in enumerate(["a", "b", "c", "pooler", "head"])}


def _below(layers, point, first=0, last=99):
    found = _vanishing(layers, first, last)
    for e in found.evidence.values():
        e["decays_below"] = point
    return found


def test_a_body_vanishing_below_a_head_the_optimizer_leaves_out_is_attached_to_it_with_what_it_caused():
    """The head keeps its small initial weights: the body's gradient, and the body's not learning, follow from it."""
    findings = [
        _below(["a", "b", "c"], "pooler"),
        _not_learning(["b"]),
        _not_learning(["head"], reason=finding.OUTSIDE),
    ]
    for f in findings:
        f.message = diagnose.describe(f)
    out = finding.attach_consequences(findings, diagnose.describe, DEPTH)
    (head,) = out
    assert head.kind == "not_learning" and head.layers == ["head"]
    assert [(c.kind, c.layers) for c in head.consequences] == [("vanishing", ["a", "b", "c"]), ("not_learning", ["b"])]
    assert "It explains what followed: vanishing gradients in" in head.message


def test_a_head_below_the_decay_point_or_not_learning_for_its_gradient_does_not_explain_the_body():
    # "c" does not learn but lies below the point the body decays across: it is part of the decay.
    out = finding.attach_consequences(
        [_below(["a", "b"], "pooler"), _not_learning(["c"], reason=finding.OUTSIDE)], diagnose.describe, DEPTH
    )
    assert [f.kind for f in out] == ["vanishing", "not_learning"] and not out[1].consequences
    # A head above it whose update is small for its own gradient's sake is no cause: the optimizer did not leave it out.
    out = finding.attach_consequences(
        [_below(["a", "b"], "pooler"), _not_learning(["head"], reason=finding.BEHIND_OTHERS)], diagnose.describe, DEPTH
    )
    assert [f.kind for f in out] == ["vanishing", "not_learning"] and not out[1].consequences
    # Without the depth order the reach above is not known: nothing is attached.
    out = finding.attach_consequences(
        [_below(["a", "b"], "pooler"), _not_learning(["head"], reason=finding.OUTSIDE)], diagnose.describe
    )
    assert len(out) == 2


# A warning that ended long before the run's end is information, for every kind (``finding.settle_ended``), on
# runs whose norms are set by hand (``norm_runs.findings``).
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


def _ended_finding(kind, severity, last):
    evidence = {"a": {"first_step": 0, "last_step": last, "reason": "x"}}
    return finding.Finding(kind, severity, "r", ["a"], [0, last], "grad_norm", "last", "", evidence)


def test_settle_ended_treats_every_kind_alike_and_leaves_errors_alone():
    steps = list(range(100))
    kinds = ("vanishing", "exploding", "dead", "clipping", "not_learning")
    found = [_ended_finding(k, "warning", 10) for k in kinds] + [_ended_finding("exploding", "error", 10)]
    out = finding.settle_ended(found, steps, 20, lambda f: f.kind)
    assert [(f.kind, f.severity) for f in out] == [*((k, "info") for k in kinds), ("exploding", "error")]
    assert all(f.evidence["a"]["writes_after_it"] == 89 for f in out[:-1])
