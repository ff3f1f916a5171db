"""Statistics against numpy computations on known gradients, eager and under tf.function."""

import numpy as np
import pytest
import tensorflow as tf

from tb_gradcheck.core import metadata
from tb_gradcheck.core.validate import variable_name as validate_name
from tb_gradcheck.tensorflow import statistics
from tb_gradcheck.tensorflow import units
from tb_gradcheck.tensorflow.variables import Rows

# float32 reductions over a few thousand elements agree with float64 numpy to
# about 1e-6 relative; 1e-5 leaves room for summation order, nothing more.
RTOL = 1e-5

COL = {c: i for i, c in enumerate(metadata.STORED_STAT_COLUMNS)}


def reference(gradients, variables, groups, unit_axes=None):
    """numpy statistics per group of variable indices: the definition, written plainly.

    Columns in ``metadata.STORED_STAT_COLUMNS`` order. ``unit_axes`` gives,
    per variable index, the trailing axes that index its units (default: the
    last axis; none for a scalar).
    """
    unit_axes = unit_axes or {}
    out = []
    for group in groups:
        present = [i for i in group if gradients[i] is not None]
        w = np.concatenate([np.asarray(variables[i].numpy(), np.float64).ravel() for i in group])
        row = dict.fromkeys(metadata.STORED_STAT_COLUMNS, -1.0)
        row["weight_norm"] = np.sqrt(np.sum(w**2))
        if present:
            g = np.concatenate([_dense(gradients[i], variables[i]).ravel() for i in present])
            nonfinite = np.sum(~np.isfinite(g))
            row.update(
                grad_norm=np.sqrt(np.sum(g**2)),
                grad_max_abs=np.max(np.abs(g)),
                grad_zero_fraction=np.mean(g == 0),
                grad_nonfinite=nonfinite,
                grad_norm_finite=np.sqrt(np.sum(g**2)) if nonfinite == 0 else -1.0,
                first_nonfinite_offset=0.0 if nonfinite else -1.0,
            )
            # A unit is dead when all its elements are zero; a group's units
            # are those of its last variable, dead in every variable of that
            # unit count.
            masks = {i: _dead_units(_dense(gradients[i], variables[i]), unit_axes.get(i, 1)) for i in present}
            count = _units(variables[group[-1]].shape, unit_axes.get(group[-1], 1))
            members = [masks[i] for i in present if masks[i].size == count]
            if members:
                row["dead_unit_fraction"] = np.mean(np.logical_and.reduce(members)) if count else 0.0
        out.append([row[c] for c in metadata.STORED_STAT_COLUMNS])
    return np.array(out)


def _units(shape, k):
    k = min(k, len(shape))
    return int(np.prod(shape[len(shape) - k :]))


def _dead_units(g, k):
    """bool per unit: every element of the unit is exactly 0 (units index the last k axes)."""
    return np.all(g.reshape(-1, _units(g.shape, k)) == 0, axis=0)


def _dense(g, v):
    if isinstance(g, tf.IndexedSlices):
        return np.asarray(tf.convert_to_tensor(g).numpy(), np.float64)  # sums repeated indices
    return np.asarray(g.numpy() if hasattr(g, "numpy") else g, np.float64)


# Where the statistics run: eagerly, in a tf.function, and compiled with XLA
# (statistics.compute(compiled=True): its own forms, with no cond).
# "window": a window's write step, which reuses the values and sums of squares half_sums took (known=...).
MODES = [False, True, "xla", "window"]
MODE_IDS = ["eager", "tf_function", "xla", "window_write_step"]


def compute(gradients, variables, graph):
    rows = Rows(variables)
    if graph == "xla":
        fn = tf.function(lambda gs: statistics.compute(gs, rows, compiled=True), jit_compile=True)
        layer, variable = fn(gradients)
    elif graph == "window":
        fn = tf.function(lambda gs: statistics.compute(gs, rows, known=statistics.half_sums(gs, rows)[2]))
        layer, variable = fn(gradients)
    elif graph:
        fn = tf.function(lambda gs: statistics.compute(gs, rows))
        layer, variable = fn(gradients)
    else:
        layer, variable = statistics.compute(gradients, rows)
    return rows, layer.numpy(), variable.numpy()


@pytest.fixture
def model():
    m = tf.keras.Sequential(
        [
            tf.keras.Input((5,), dtype="int32"),
            tf.keras.layers.Embedding(50, 4, name="embed"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(7, activation="relu", name="hidden"),
            tf.keras.layers.Dense(1, name="out"),
        ],
        name="sequential",
    )
    return m


def model_gradients(model, seed):
    """The model's real gradients on a random batch of token ids (the embedding's are IndexedSlices)."""
    x = tf.constant(np.random.default_rng(seed).integers(0, 50, size=(8, 5)), tf.int32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x) ** 2)
    return tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize("graph", MODES, ids=MODE_IDS)
def test_stats_match_numpy_on_real_model_gradients(model, graph):
    grads = model_gradients(model, seed=0)
    assert isinstance(grads[0], tf.IndexedSlices)  # the embedding's gradient is sparse
    variables = model.trainable_variables
    rows, layer, variable = compute(grads, variables, graph)

    assert rows.layer_names == ["sequential/embed", "sequential/hidden", "sequential/out"]
    assert rows.variable_names == [v.path for v in variables]
    np.testing.assert_allclose(layer, reference(grads, variables, [[0], [1, 2], [3, 4]]), rtol=RTOL)
    np.testing.assert_allclose(variable, reference(grads, variables, [[i] for i in range(5)]), rtol=RTOL)


@pytest.mark.parametrize("graph", [True, "xla", "window"], ids=["tf_function", "xla", "window_write_step"])
def test_indexed_slices_with_repeated_indices_equal_their_dense_sum(graph):
    v = tf.Variable(np.ones((6, 3), np.float32), name="table")
    values = tf.constant([[1.0, 0.0, -2.0], [3.0, 0.0, 2.0], [-1.0, 0.5, 2.0]])
    slices = tf.IndexedSlices(values, tf.constant([4, 1, 4]), tf.constant([6, 3]))
    _, _, sparse = compute([slices], [v], graph)
    _, _, dense = compute([tf.convert_to_tensor(slices)], [v], graph)
    np.testing.assert_allclose(sparse, dense, rtol=RTOL)
    # Row 4 sums to [0, 0.5, 0], row 1 is [3, 0, 2]: 15 of 18 dense elements
    # are zero (counting per slice would say 14), and the largest is 3.
    assert sparse[0, COL["grad_zero_fraction"]] == pytest.approx(15 / 18)
    assert sparse[0, COL["grad_max_abs"]] == 3.0
    assert sparse[0, COL["grad_norm"]] == pytest.approx(np.sqrt(0.25 + 9 + 4))


@pytest.mark.parametrize("graph", MODES, ids=MODE_IDS)
def test_none_gradient_is_missing_not_zero(graph):
    a = tf.Variable([1.0, 2.0], name="a")
    b = tf.Variable([[3.0]], name="b")
    _, layer, variable = compute([tf.constant([0.5, -0.5]), None], [a, b], graph)
    assert variable[1, : len(metadata.GRADIENT_STAT_COLUMNS)].tolist() == [statistics.MISSING] * len(
        metadata.GRADIENT_STAT_COLUMNS
    )
    assert layer[1, : len(metadata.GRADIENT_STAT_COLUMNS)].tolist() == [statistics.MISSING] * len(
        metadata.GRADIENT_STAT_COLUMNS
    )
    assert variable[1, COL["weight_norm"]] == pytest.approx(3.0)  # weights are still there
    assert variable[0, COL["grad_norm"]] == pytest.approx(np.sqrt(0.5))


@pytest.mark.parametrize("graph", [True, "xla"], ids=["tf_function", "xla"])
def test_layer_with_one_disconnected_variable_uses_the_rest(graph):
    m = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2, name="d")], name="sequential")
    kernel, bias = m.trainable_variables
    g = tf.constant(np.arange(6, dtype=np.float32).reshape(3, 2))
    _, layer, _ = compute([g, None], [kernel, bias], graph)
    ref = reference([g, None], [kernel, bias], [[0, 1]])
    np.testing.assert_allclose(layer, ref, rtol=RTOL)
    assert layer[0, COL["grad_zero_fraction"]] == pytest.approx(1 / 6)  # over the kernel only


@pytest.mark.parametrize("graph", [True, "xla"], ids=["tf_function", "xla"])
def test_all_gradients_missing(graph):
    a = tf.Variable([1.0], name="a")
    _, layer, variable = compute([None], [a], graph)
    assert layer[0, 0] == statistics.MISSING and variable[0, 0] == statistics.MISSING


@pytest.mark.parametrize("graph", MODES, ids=MODE_IDS)
def test_nonfinite_elements_are_counted_and_propagate(graph):
    a = tf.Variable(np.ones(5, np.float32), name="a")
    b = tf.Variable(np.ones(3, np.float32), name="b")
    ga = tf.constant([1.0, np.nan, np.inf, -np.inf, 0.0], tf.float32)
    gb = tf.constant([1.0, 2.0, 2.0])
    _, layer, variable = compute([ga, gb], [a, b], graph)
    assert variable[0, COL["grad_nonfinite"]] == 3
    assert np.isnan(variable[0, COL["grad_norm"]]) and np.isnan(variable[0, COL["grad_max_abs"]])
    assert variable[0, COL["grad_zero_fraction"]] == pytest.approx(0.2)
    assert variable[1, COL["grad_nonfinite"]] == 0 and variable[1, COL["grad_norm"]] == pytest.approx(3.0)


@pytest.mark.parametrize("graph", [True, "xla"], ids=["tf_function", "xla"])
def test_inf_without_nan_gives_inf_norm(graph):
    a = tf.Variable(np.ones(3, np.float32), name="a")
    _, _, variable = compute([tf.constant([1.0, np.inf, 2.0])], [a], graph)
    assert variable[0, COL["grad_norm"]] == np.inf and variable[0, COL["grad_max_abs"]] == np.inf
    assert variable[0, COL["grad_nonfinite"]] == 1


@pytest.mark.parametrize("scale", [1e-30, 1e-22, 1e22, 1e30])
@pytest.mark.parametrize("graph", [True, "xla"], ids=["tf_function", "xla"])
def test_norm_survives_float32_under_and_overflow_of_squares(scale, graph):
    values = np.array([3.0, 4.0, 0.0, 12.0], np.float32) * np.float32(scale)
    a = tf.Variable(np.ones(4, np.float32), name="a")
    _, layer, variable = compute([tf.constant(values)], [a], graph)
    expected = 13.0 * scale  # ||(3, 4, 0, 12)|| = 13
    assert variable[0, COL["grad_norm"]] == pytest.approx(expected, rel=RTOL)
    assert layer[0, COL["grad_norm"]] == pytest.approx(expected, rel=RTOL)
    assert variable[0, COL["grad_nonfinite"]] == 0


@pytest.mark.parametrize("graph", [True, "xla"], ids=["tf_function", "xla"])
def test_layer_norm_of_huge_variable_norms_does_not_overflow(graph):
    m = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1, name="d")], name="sequential")
    kernel, bias = m.trainable_variables
    g = [tf.constant([[3e30]]), tf.constant([4e30])]
    _, layer, _ = compute(g, [kernel, bias], graph)
    assert layer[0, COL["grad_norm"]] == pytest.approx(5e30, rel=RTOL)


@pytest.mark.parametrize("graph", [True, "xla", "window"], ids=["tf_function", "xla", "window_write_step"])
def test_half_precision_and_float64(graph):
    a = tf.Variable(np.ones(3, np.float16), name="a")
    b = tf.Variable(np.ones(2, np.float64), name="b")
    ga = tf.constant([300.0, 400.0, 0.0], tf.float16)  # squares overflow float16
    gb = tf.constant([1e-200, 0.0], tf.float64)  # below float32's range
    _, _, variable = compute([ga, gb], [a, b], graph)
    assert variable[0, COL["grad_norm"]] == pytest.approx(500.0, rel=1e-3)
    assert variable.dtype == np.float32  # stored as float32: 1e-200 flushes to 0 there
    assert variable[1, COL["grad_zero_fraction"]] == 0.5


def test_rows_group_keras_layers_and_plain_variables_in_first_appearance_order():
    m = tf.keras.Sequential(
        [
            tf.keras.Input((3,)),
            tf.keras.layers.Dense(2, name="first"),
            tf.keras.layers.BatchNormalization(name="bn"),
            tf.keras.layers.Dense(1, name="second"),
        ],
        name="sequential",
    )
    p1 = tf.Variable(1.0, name="Variable")
    p2 = tf.Variable(2.0, name="Variable")
    k1, b1, gamma, beta, k2, b2 = m.trainable_variables
    rows = Rows([p1, k2, k1, p2, b1, gamma, b2, beta])
    assert rows.layer_names == ["Variable", "sequential/second", "sequential/first", "Variable#2", "sequential/bn"]
    assert rows.variable_names[0] == "Variable" and rows.variable_names[3] == "Variable#2"
    assert rows.layer_of == [0, 1, 2, 3, 2, 4, 1, 4]
    assert rows.layer_sizes == [1, 2 + 1, 6 + 2, 1, 2 + 2]


@pytest.mark.parametrize("graph", MODES, ids=MODE_IDS)
def test_quick_statistics_equal_the_full_ones(model, graph):
    grads = model_gradients(model, seed=1)
    grads[2] = grads[2] + np.float32(np.nan)  # one NaN layer
    variables = model.trainable_variables
    rows = Rows(variables)
    xla = graph == "xla"

    def run(fn):
        return tf.function(fn, jit_compile=xla) if graph else fn

    full = run(lambda gs: statistics.compute(gs, rows, weights=False, compiled=xla))
    quick = run(lambda gs: statistics.quick(gs, rows, compiled=xla))
    full_l, full_v = (t.numpy() for t in full(grads))
    quick_l, quick_v = (t.numpy() for t in quick(grads))
    for q, f in ((quick_l, full_l), (quick_v, full_v)):
        assert q.shape == (f.shape[0], len(statistics.WINDOW_COLUMNS))
        for i, c in enumerate(statistics.WINDOW_COLUMNS):
            np.testing.assert_allclose(q[:, i], f[:, COL[c]], rtol=RTOL)
    assert quick_v[2, statistics.WINDOW_COLUMNS.index("grad_nonfinite")] == 7  # hidden/bias: all 7 elements NaN
    assert full_v[2, COL["grad_zero_fraction"]] == 0  # NaN is not zero: the NaN step's count is recounted


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "xla"])
def test_zero_count_is_exact_past_float32_integers(compiled):
    # 2**24 + 3 elements: the float32 sum of ones would round; the integer form counts exactly.
    n = 2**24 + 3
    g = np.ones(n, np.float32)
    g[:5] = 0.0
    g[-1] = -0.0
    v = tf.Variable(tf.zeros([n]))
    rows = Rows([v])
    fn = tf.function(lambda gs: statistics.compute(gs, rows, weights=False, compiled=True), jit_compile=True)
    _, variable = fn([tf.constant(g)]) if compiled else statistics.compute([tf.constant(g)], rows, weights=False)
    assert variable.numpy()[0, COL["grad_zero_fraction"]] == np.float32(6 / n)


@pytest.mark.parametrize("graph", [True, "xla"], ids=["tf_function", "xla"])
def test_weight_norms_survive_under_and_overflow_of_squares(graph):
    tiny = tf.Variable(np.array([3e-30, 4e-30], np.float32), name="tiny")
    huge = tf.Variable(np.array([3e30, 4e30], np.float32), name="huge")
    small64 = tf.Variable(np.array([3e-170, 4e-170, 0.0], np.float64), name="small64")
    zero = tf.Variable(np.zeros(3, np.float32), name="zero")
    grads = [tf.ones([2]), tf.ones([2]), tf.ones([3], tf.float64), tf.ones([3])]
    _, _, variable = compute(grads, [tiny, huge, small64, zero], graph)
    assert variable[0, COL["weight_norm"]] == pytest.approx(5e-30, rel=RTOL)
    assert variable[1, COL["weight_norm"]] == pytest.approx(5e30, rel=RTOL)
    assert variable[2, COL["weight_norm"]] == 0.0  # 5e-170 is below float32, where it is stored
    assert variable[3, COL["weight_norm"]] == 0.0


def test_compiled_norms_equal_the_quick_ones(model):
    grads = model_gradients(model, seed=3)
    grads[2] = None  # the hidden layer keeps its kernel's norm
    rows = Rows(model.trainable_variables)
    compiled = tf.function(lambda gs: statistics.norms(gs, rows, compiled=True), jit_compile=True)(grads)
    plain = statistics.norms(grads, rows)
    for a, b in zip(compiled, plain):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=RTOL)
    assert plain[1].numpy()[2] == statistics.MISSING


def _layer_model(layer, input_shape, dtype="float32"):
    return tf.keras.Sequential([tf.keras.Input(input_shape, dtype=dtype), layer], name="sequential")


def _masked_gradients(model, x, seed):
    """Real gradients of a loss that reads only some outputs, so whole units get exactly zero gradient."""
    out_shape = model(x).shape
    # Output channels 0 and 2 feed the loss; the others are cut off (dead).
    mask = np.zeros(out_shape[-1], np.float32)
    mask[[0, 2]] = 1.0
    w = np.random.default_rng(seed).normal(size=out_shape[1:]).astype(np.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x) * w * mask)
    return tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize(
    "layer, input_shape, unit_axes",
    [
        (tf.keras.layers.Dense(5, name="d"), (4,), {}),
        (tf.keras.layers.Conv2D(5, 3, name="c"), (6, 6, 2), {}),
        (tf.keras.layers.DepthwiseConv2D(3, depth_multiplier=2, name="dw"), (6, 6, 3), {0: 2}),
        (tf.keras.layers.LayerNormalization(name="ln"), (5,), {}),
    ],
    ids=["dense", "conv2d", "depthwise", "layernorm"],
)
@pytest.mark.parametrize("graph", MODES, ids=MODE_IDS)
def test_dead_unit_fraction_matches_numpy_on_real_layers(layer, input_shape, unit_axes, graph):
    model = _layer_model(layer, input_shape)
    x = tf.constant(np.random.default_rng(0).normal(size=(3, *input_shape)), tf.float32)
    grads = _masked_gradients(model, x, seed=1)
    variables = model.trainable_variables
    # Found from the model, not told: only the depthwise kernel differs from the shape rule.
    assert units.unit_axes(model) == {validate_name(variables[i]): k for i, k in unit_axes.items()}
    rows = Rows(variables, units.unit_axes(model))

    def fn(gs):
        return statistics.compute(gs, rows)

    layer_s, variable_s = (tf.function(fn) if graph else fn)(grads)
    expected_v = reference(grads, variables, [[i] for i in range(len(variables))], unit_axes)
    expected_l = reference(grads, variables, [list(range(len(variables)))], unit_axes)
    np.testing.assert_allclose(variable_s.numpy(), expected_v, rtol=RTOL)
    np.testing.assert_allclose(layer_s.numpy(), expected_l, rtol=RTOL)
    # The premise: some output channels are dead and some are not.
    assert 0 < layer_s.numpy()[0, COL["dead_unit_fraction"]] < 1


def test_depthwise_units_are_input_channel_times_multiplier():
    # 3 input channels x multiplier 2 = 6 output channels; the mask keeps
    # output channels 0 and 2 (= in * 2 + mult: (0, 0) and (1, 0)), so 4 of 6
    # (in, mult) units are dead. Taken by its last axis alone (the
    # multiplier, 2 units) the answer would be 1 of 2.
    model = _layer_model(tf.keras.layers.DepthwiseConv2D(3, depth_multiplier=2, name="dw"), (6, 6, 3))
    x = tf.constant(np.random.default_rng(0).normal(size=(2, 6, 6, 3)), tf.float32)
    grads = _masked_gradients(model, x, seed=2)
    variables = model.trainable_variables
    layer_s, variable_s = statistics.compute(grads, Rows(variables, units.unit_axes(model)))
    assert variable_s.numpy()[0, COL["dead_unit_fraction"]] == pytest.approx(4 / 6)
    assert layer_s.numpy()[0, COL["dead_unit_fraction"]] == pytest.approx(4 / 6)
    _, by_shape = statistics.compute(grads, Rows(variables))
    assert by_shape.numpy()[0, COL["dead_unit_fraction"]] == 0.5


def test_embedding_dead_units_are_columns_of_the_summed_slices():
    model = _layer_model(tf.keras.layers.Embedding(20, 4, name="e"), (3,), dtype="int32")
    x = tf.constant([[1, 5, 1], [7, 5, 2]], tf.int32)
    grads = _masked_gradients(model, x, seed=3)
    assert isinstance(grads[0], tf.IndexedSlices)
    variables = model.trainable_variables
    _, variable_s = statistics.compute(grads, Rows(variables))
    np.testing.assert_allclose(variable_s.numpy(), reference(grads, variables, [[0]]), rtol=RTOL)
    assert variable_s.numpy()[0, COL["dead_unit_fraction"]] == pytest.approx(2 / 4)  # columns 1 and 3


def test_planted_dead_relu_units_are_dead_and_their_successor_is_not():
    """ReLU units whose bias is far below any pre-activation never fire: their
    kernel columns and biases get zero gradient (dead), and the next layer's
    kernel rows from them are zero, which must not make the next layer's
    units dead."""
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.Sequential(
        [
            tf.keras.Input((8,)),
            tf.keras.layers.Dense(10, activation="relu", name="hidden"),
            tf.keras.layers.Dense(3, name="out"),
        ],
        name="sequential",
    )
    kernel, bias = model.get_layer("hidden").trainable_variables
    planted = [1, 4, 5, 8]
    b = np.zeros(10, np.float32)
    b[planted] = -100.0
    bias.assign(b)
    x = tf.constant(np.random.default_rng(0).normal(size=(16, 8)), tf.float32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(model(x) ** 2)
    variables = model.trainable_variables
    grads = tape.gradient(loss, variables)
    # The premise, computed: exactly the planted units never fire.
    pre = x.numpy() @ kernel.numpy() + b
    assert sorted(np.flatnonzero((pre <= 0).all(axis=0))) == planted
    assert (grads[2].numpy()[planted] == 0).all()  # out's kernel rows from them are zero
    rows = Rows(variables)
    layer_s, variable_s = statistics.compute(grads, rows)
    dead = layer_s.numpy()[:, COL["dead_unit_fraction"]]
    assert dead[0] == pytest.approx(len(planted) / 10) and dead[1] == 0.0
    np.testing.assert_allclose(layer_s.numpy(), reference(grads, variables, [[0, 1], [2, 3]]), rtol=RTOL)
    # Zero elements alone would call the successor 4/10 "dead" in its kernel.
    assert variable_s.numpy()[2, COL["grad_zero_fraction"]] == pytest.approx(len(planted) / 10)


def test_layer_units_are_and_over_variables_with_the_layer_unit_count():
    # Dense: kernel column j and bias j. A column zero in the kernel but not
    # in the bias is alive.
    model = _layer_model(tf.keras.layers.Dense(3, name="d"), (2,))
    kernel, bias = model.trainable_variables
    gk = tf.constant([[0.0, 1.0, 0.0], [0.0, 2.0, 0.0]])
    gb = tf.constant([0.0, 0.0, 5.0])
    layer_s, variable_s = statistics.compute([gk, gb], Rows([kernel, bias]))
    assert variable_s.numpy()[:, COL["dead_unit_fraction"]].tolist() == pytest.approx([2 / 3, 2 / 3])
    assert layer_s.numpy()[0, COL["dead_unit_fraction"]] == pytest.approx(1 / 3)  # only unit 0
    # Without the bias's gradient the layer's units come from the kernel alone.
    layer_s, _ = statistics.compute([gk, None], Rows([kernel, bias]))
    assert layer_s.numpy()[0, COL["dead_unit_fraction"]] == pytest.approx(2 / 3)
    # Without any variable of the layer's unit count there is no fraction.
    v = tf.Variable(np.ones((2, 2), np.float32), name="w")
    s = tf.Variable(1.0, name="s")
    layer_s, _ = statistics.compute([None, tf.ones(())], Rows([v, s]))
    assert layer_s.numpy()[1, COL["dead_unit_fraction"]] == 0.0  # the scalar's one unit is alive


def test_row_names_stay_unique_when_a_name_already_ends_in_a_suffix():
    # Three plain variables named Variable, Variable#2, Variable: numbering the
    # third "#2" would give two rows of one name, and the reader rejects a
    # layout with duplicate rows (the whole tag would show as a problem).
    vs = [tf.Variable(1.0, name=n) for n in ("Variable", "Variable#2", "Variable")]
    rows = Rows(vs)
    assert rows.variable_names == ["Variable", "Variable#2", "Variable#3"]
    assert rows.layer_names == rows.variable_names
    assert (
        metadata.parse(
            metadata.encode(
                metadata.stats_layout(
                    {"rows": rows.layer_names, "sizes": rows.layer_sizes},
                    {"rows": rows.variable_names, "sizes": rows.variable_sizes},
                    ["last"],
                    1,
                )
            )
        )["variable"]["rows"]
        == rows.variable_names
    )
