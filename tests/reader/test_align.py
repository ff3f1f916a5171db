"""The row alignment behind compare (tb_gradcheck/reader/align.py): pure Python and numpy, no TensorFlow.

The end-to-end cases (real Keras models written by GradientWriter, read by
TensorBoard) are in test_compare.py; here the alignment itself is held
against a brute-force reference and against the cases that need its rules.
"""

import itertools
import random

import pytest

from tb_gradcheck.reader import align

DENSE_IN, NORM, HIDDEN, OUT = ((4, 8), (8,)), ((8,), (8,)), ((8, 8), (8,)), ((8, 1), (1,))
TWIN = [DENSE_IN, NORM, HIDDEN, HIDDEN, OUT]


def side(names, shapes=None, sizes=None, layers=None):
    shapes = [None] * len(names) if shapes is None else list(shapes)
    sizes = [sum(_count(s) for s in row) for row in shapes] if sizes is None else list(sizes)
    return align.Side(list(names), shapes, sizes, layers)


def _count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def named(pairs, a, b):
    return [(None if i is None else a.names[i], None if j is None else b.names[j]) for i, j in pairs]


def test_auto_numbered_sequential_twins_align_row_by_row():
    a = side(
        ["sequential/dense", "sequential/layer_normalization", *(f"sequential/dense_{k}" for k in (1, 2, 3))], TWIN
    )
    b = side(
        ["sequential_1/dense_4", "sequential_1/layer_normalization_1", *(f"sequential_1/dense_{k}" for k in (5, 6, 7))],
        TWIN,
    )
    assert align.by_name(a.names, b.names).matched == 0
    found = align.choose(a, b, align.AUTO)
    assert (found.mode, found.basis, found.matched) == ("structure", "shapes", 5)
    assert found.pairs == [(k, k) for k in range(5)]


def test_an_inserted_layer_is_placed_at_its_depth_and_names_break_the_tie():
    a = side(["m/dense", "m/norm", "m/hidden", "m/hidden_1", "m/out"], TWIN)
    # The inserted layer has the shape of its neighbours: only its name says which one is new.
    b = side(["n/dense", "n/norm", "n/hidden", "n/extra", "n/hidden_1", "n/out"], TWIN[:3] + [HIDDEN] + TWIN[3:])
    found = align.by_structure(a, b)
    assert named(found.pairs, a, b) == [
        ("m/dense", "n/dense"),
        ("m/norm", "n/norm"),
        ("m/hidden", "n/hidden"),
        (None, "n/extra"),
        ("m/hidden_1", "n/hidden_1"),
        ("m/out", "n/out"),
    ]
    # Removed instead of inserted: the same, seen from the other run.
    back = align.by_structure(b, a)
    assert named(back.pairs, b, a)[3] == ("n/extra", None) and back.matched == 5


def test_a_removed_block_leaves_the_rest_paired_not_zipped():
    block = [HIDDEN, NORM]
    a = side([f"t/block_{i}/{p}" for i in range(4) for p in ("mlp", "ln")], block * 4)
    b_names = [n.replace("t/", "u/") for n in a.names if "block_1/" not in n]
    b = side(b_names, block * 3)
    found = align.by_structure(a, b)
    assert found.matched == 6
    assert named([p for p in found.pairs if None in p], a, b) == [("t/block_1/mlp", None), ("t/block_1/ln", None)]
    assert all(x.split("/", 1)[1] == y.split("/", 1)[1] for x, y in named(found.pairs, a, b) if x and y)


def test_rows_of_different_shapes_never_pair_and_a_width_sweep_stays_aligned_by_name():
    a = side(["net/d0", "net/d1"], [((4, 8), (8,)), ((8, 1), (1,))])
    b = side(["net/d0", "net/d1"], [((4, 16), (16,)), ((16, 1), (1,))])
    assert align.by_structure(a, b).matched == 0
    found = align.choose(a, b, align.AUTO)
    assert (found.mode, found.matched) == ("name", 2)
    # Same names and shapes: nothing to explain, by name.
    assert align.choose(a, a, align.AUTO).mode == "name"


def test_logs_without_shapes_align_by_sizes_and_rows_without_either_by_names():
    a = side(["x/dense", "x/dense_1"], TWIN[2:4])
    b = side(["y/dense_7", "y/dense_8"], sizes=[72, 72])
    found = align.choose(a, b, align.STRUCTURE)
    assert (found.basis, found.matched) == ("sizes", 2)
    checks_only = align.Side(["c/a", "c/b"], [None, None], [None, None])
    other = align.Side(["d/b"], [None], [None])
    found = align.by_structure(checks_only, other)
    assert found.basis == "names" and named(found.pairs, checks_only, other) == [("c/a", None), ("c/b", "d/b")]


def test_variable_rows_align_inside_aligned_layers_by_shape_and_kind():
    layers_a = ["f/dense", "f/layer_normalization"]
    layers_b = ["g/dense_3", "g/extra", "g/layer_normalization_2"]
    a = side(
        ["f/dense/kernel", "f/dense/bias", "f/layer_normalization/gamma", "f/layer_normalization/beta"],
        [((4, 8),), ((8,),), ((8,),), ((8,),)],
        layers=layers_a,
    )
    b = side(
        [
            "g/dense_3/kernel",
            "g/dense_3/bias",
            "g/extra/kernel",
            "g/layer_normalization_2/gamma",
            "g/layer_normalization_2/beta",
        ],
        [((4, 8),), ((8,),), ((8,),), ((8,),), ((8,),)],
        layers=layers_b,
    )
    found = align.by_structure(a, b)
    # g/extra/kernel has gamma's shape, but its layer (one [8] variable) is no layer of a.
    assert named(found.pairs, a, b) == [
        ("f/dense/kernel", "g/dense_3/kernel"),
        ("f/dense/bias", "g/dense_3/bias"),
        (None, "g/extra/kernel"),
        ("f/layer_normalization/gamma", "g/layer_normalization_2/gamma"),
        ("f/layer_normalization/beta", "g/layer_normalization_2/beta"),
    ]


def _reference_matches(sig_a, sig_b):
    """The longest common subsequence of two lists, by brute force over a's subsets (small lists only)."""
    best = 0
    for k in range(len(sig_a), 0, -1):
        for keep in itertools.combinations(range(len(sig_a)), k):
            j = 0
            for i in keep:
                while j < len(sig_b) and sig_b[j] != sig_a[i]:
                    j += 1
                if j == len(sig_b):
                    break
                j += 1
            else:
                return k
    return best


def test_structure_pairs_as_many_rows_as_the_longest_common_subsequence():
    rng = random.Random(0)
    shapes = [((2,),), ((3,),), ((2, 2),)]
    for _ in range(300):
        sig_a = [rng.choice(shapes) for _ in range(rng.randint(0, 7))]
        sig_b = [rng.choice(shapes) for _ in range(rng.randint(0, 7))]
        a = side([f"a/l{i}" for i in range(len(sig_a))], sig_a)
        b = side([f"b/l{rng.randint(0, 9)}_{j}" for j in range(len(sig_b))], sig_b)
        found = align.by_structure(a, b)
        assert found.matched == _reference_matches(sig_a, sig_b), (sig_a, sig_b)
        matched = [(i, j) for i, j in found.pairs if i is not None and j is not None]
        assert all(sig_a[i] == sig_b[j] for i, j in matched)
        assert matched == sorted(matched) and len({j for _, j in matched}) == len(matched)
        # Every row appears once, each run's rows in their own order.
        assert [i for i, _ in found.pairs if i is not None] == list(range(len(sig_a)))
        assert [j for _, j in found.pairs if j is not None] == list(range(len(sig_b)))


def test_two_thousand_rows_with_an_insert_and_a_removal_align_block_by_block():
    parts = {"q": HIDDEN, "k": HIDDEN, "v": HIDDEN, "o": HIDDEN, "up": ((8, 32), (32,)), "down": ((32, 8), (8,))}
    parts.update(ln1=NORM, ln2=NORM)
    rows = [(f"block_{i}/{p}", s) for i in range(250) for p, s in parts.items()]
    a = side([f"t/{n}" for n, _ in rows], [s for _, s in rows])
    # The other run has an embedding first and lacks the last block: no common head or tail to take off.
    b_rows = [("embed", ((100, 8),))] + rows[:-8]
    b = side([f"t_1/{n}" for n, _ in b_rows], [s for _, s in b_rows])
    found = align.choose(a, b, align.AUTO)
    assert (found.mode, found.matched) == ("structure", 1992)
    assert all(x.split("/", 1)[1] == y.split("/", 1)[1] for x, y in named(found.pairs, a, b) if x and y)


def test_a_table_past_the_limit_falls_back_to_names_and_says_so(monkeypatch):
    a = side(["a/x", "a/y", "a/z"], [HIDDEN, NORM, HIDDEN])
    b = side(["b/y", "b/x"], [NORM, HIDDEN])
    monkeypatch.setattr(align, "MAX_CELLS", 2)
    found = align.by_structure(a, b)
    assert found.mode == "name" and found.matched == 0


@pytest.mark.parametrize(
    "name, expected",
    [
        ("sequential_1/dense_4/kernel", "dense/kernel"),
        ("he_init/hidden", "hidden"),
        ("dense_3", "dense"),
        ("dense_13/kernel", "kernel"),
        ("w#2", "w"),
        ("trailing/", "trailing/"),
    ],
)
def test_normalized_drops_the_root_scope_and_numeric_suffixes(name, expected):
    assert align.normalized(name) == expected
