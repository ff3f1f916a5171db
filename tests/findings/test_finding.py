"""One cause, one finding: what follows from another finding is attached to it (``finding.attach_consequences``)."""

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
