"""The vanishing rule (tb_gradcheck.findings.vanishing): a decay toward the input as a profile over depth, read by each row's kind.

Runs whose norms are set by hand (``norm_runs.findings``), written by the real
PyTorch writer, read back as the tab reads them.
"""

import numpy as np

import norm_runs
from tb_gradcheck.findings import diagnose
from tb_gradcheck.findings import vanishing

ATTENTION = [f"blocks.{i}.{part}" for i in range(2) for part in ("query", "key", "value")] + ["head"]


def _run(tmp_path, paths, norm, name="run", **kwargs):
    return norm_runs.findings(tmp_path / name, paths, norm, **kwargs)


def _of(found, kind):
    return [c for f in found for c in [f, *f.consequences] if c.kind == kind]


def test_rows_of_one_kind_share_a_name_without_block_indices_and_their_shapes():
    rows = ["encoder.layer.0.attention.self.query", "encoder.layer.1.attention.self.query", "blocks.0.mlp", "dense_3"]
    rows += ["encoder.layer.0.attention.self.key", "blocks.1.mlp", "dense_4", "dense_5"]
    shapes = {"dense_5": ((8, 1),)}  # another shape: another kind, whatever its name
    kind = vanishing.kinds(rows, shapes)
    same = [(a, b) for i, a in enumerate(rows) for b in rows[i + 1 :] if kind[rows.index(a)] == kind[rows.index(b)]]
    assert same == [
        ("encoder.layer.0.attention.self.query", "encoder.layer.1.attention.self.query"),
        ("blocks.0.mlp", "blocks.1.mlp"),
        ("dense_3", "dense_4"),
    ]


def test_query_and_key_as_small_in_every_block_as_in_the_first_are_not_vanishing(tmp_path):
    """Near-uniform attention: query and key 3+ orders below the value and the head in both blocks (the first row too)."""
    small = {"query": 1e-5, "key": 2e-5}
    found = _run(tmp_path, ATTENTION, lambda step, p: 1e-1 if p == "head" else small.get(p.split(".")[-1], 1e-2))
    assert not _of(found, "vanishing"), [f.message for f in found]


def test_a_block_orders_below_the_same_kinds_in_the_block_after_it_is_vanishing(tmp_path):
    """The whole first block 3 orders below the second, kind by kind: a decay toward the input."""
    found = _run(
        tmp_path, ATTENTION, lambda step, p: 1e-1 if p == "head" else 1e-6 if p.startswith("blocks.0") else 1e-2
    )
    (f,) = _of(found, "vanishing")
    assert f.layers == ["blocks.0.query", "blocks.0.key", "blocks.0.value"] and f.severity == "warning"
    assert f.evidence["blocks.0.query"]["decays_below"] == "blocks.1.query"
    # The gap is to the largest row above the decay point: the head.
    assert np.isclose(f.evidence["blocks.0.query"]["median_orders_below_later_layers"], 5.0, atol=1e-3)


def test_a_body_at_one_level_orders_below_its_head_is_vanishing(tmp_path):
    """No kind of the body recurs above the point: the rows of one kind all below it say nothing against it."""
    found = _run(tmp_path, ATTENTION, lambda step, p: 1e-1 if p == "head" else 1e-5)
    (f,) = _of(found, "vanishing")
    assert f.layers == ATTENTION[:-1] and f.evidence["blocks.0.query"]["decays_below"] == "head"


def test_a_deeper_query_as_small_breaks_the_decay_only_for_the_points_it_lies_above(tmp_path):
    """Block 1's query as small as block 0's: block 0 is not in a decay, but everything below the head is, at a point above both."""
    quiet = {"blocks.0.query", "blocks.1.query"}
    found = _run(tmp_path, ATTENTION, lambda step, p: 1e0 if p == "head" else 1e-6 if p in quiet else 1e-4)
    (f,) = _of(found, "vanishing")
    assert f.layers == ATTENTION[:-1], f.message


def test_a_first_row_orders_below_a_head_but_as_large_as_the_rows_above_it_is_not_vanishing(tmp_path):
    """A classifier that has learned its task: the head takes most of the gradient (RoBERTa's, fine-tuned to a loss near 0).

    The word embeddings, the first row, sit 3.3 orders below the head's
    output layer and are the only kind of their own, but most rows above
    them are no larger (position embeddings, query, key, value): the head
    is one step, not a decay toward the input.
    """
    norms = {
        "emb.words": 1e-4, "emb.types": 2e-3, "emb.positions": 1e-4,
        "layer.0.query": 5e-6, "layer.0.key": 2e-5, "layer.0.value": 5e-5, "layer.0.out": 3e-4,
        "layer.1.query": 1e-5, "layer.1.key": 1.2e-5, "layer.1.value": 1e-4, "layer.1.out": 5e-4,
        "head.dense": 2e-2, "head.out_proj": 2e-1,
    }  # fmt: skip
    found = _run(tmp_path, list(norms), lambda step, p: norms[p])
    assert not _of(found, "vanishing"), [f.message for f in found]
    # The same rows with the trunk an order above the first row: the rows above it are mostly larger, a decay.
    lifted = {p: n if p == "emb.words" or p.startswith("head") else n * 30 for p, n in norms.items()}
    (f,) = _of(_run(tmp_path, list(lifted), lambda step, p: lifted[p], name="lifted"), "vanishing")
    assert f.layers == ["emb.words"], f.message


def _learning_rate(step):
    """1e-3, then a decay to 1e-7 over the last 40 of 100 steps: a schedule's end."""
    return 1e-3 * 10 ** -(max(step - 60, 0) / 10)


def test_a_layer_under_the_float32_floor_only_as_the_whole_network_slows_is_not_vanishing(tmp_path):
    """A converged fine-tune's norm scale: a gradient at float32's half-ulp of its weights, moving two orders below the rest.

    As the learning rate decays, every update falls; the norm's crosses
    the 1e-7 floor first, in the last 20 writes, still two orders below the
    median layer's. Its update stays where the network's goes: the
    schedule's slowing, not a gradient that rounds away. Three orders
    below the rest while they move, the same layer is vanishing.
    """
    rows = ["a", "norm", "b", "head"]

    def norm(step, p):
        return 3e-8 if p == "norm" else 1e-2

    def updates(behind):
        return lambda step, p: _learning_rate(step) * (10.0**-behind if p == "norm" else 1.0)

    assert _learning_rate(79) * 1e-2 > 1e-7 > _learning_rate(81) * 1e-2  # the norm's update crosses the floor at 80
    found = _run(tmp_path, rows, norm, updates=updates(2))
    assert not _of(found, "vanishing"), [f.message for f in found]
    (f,) = _of(_run(tmp_path, rows, norm, name="behind", updates=updates(4)), "vanishing")
    assert f.layers == ["norm"] and f.evidence["norm"]["reason"] == "too small to move its weights", f.message


def test_a_kind_that_rises_across_the_point_by_less_than_an_order_breaks_it():
    """``decay_points`` on a profile: the kind's rows above the point within ``kind_orders`` of those below it."""
    t = diagnose.Thresholds()
    level = np.log10([[1e-6, 1e-2, 10**-5.5, 1e0]])  # a0, b0, a1, head; a0 and a1 one kind
    kind = np.array([0, 1, 0, 2])
    point, _ = vanishing.decay_points(level, kind, t)
    assert point.tolist() == [0]  # a1 is within an order of a0: no point below a1 holds, and b0 breaks the chain
    level[0, 2] = -2.0  # a1 two orders above a0
    point, top = vanishing.decay_points(level, kind, t)
    assert point.tolist() == [1] and top.tolist() == [0.0]
