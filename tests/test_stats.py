"""Statistics against numpy computations on known gradients, eager and under tf.function."""

import numpy as np
import pytest
import tensorflow as tf

from tb_gradcheck import metadata, stats

# float32 reductions over a few thousand elements agree with float64 numpy to
# about 1e-6 relative; 1e-5 leaves room for summation order, nothing more.
RTOL = 1e-5

COL = {c: i for i, c in enumerate(metadata.STORED_STAT_COLUMNS)}


def reference(gradients, variables, groups):
    """numpy statistics per group of variable indices: the definition, written plainly."""
    out = []
    for group in groups:
        present = [i for i in group if gradients[i] is not None]
        w = np.concatenate([np.asarray(variables[i].numpy(), np.float64).ravel() for i in group])
        w_norm = np.sqrt(np.sum(w**2))
        if not present:
            out.append([-1, -1, -1, -1, w_norm])
            continue
        g = np.concatenate([_dense(gradients[i], variables[i]).ravel() for i in present])
        norm = np.sqrt(np.sum(g**2))
        out.append([
            norm,
            np.max(np.abs(g)),
            np.mean(g == 0),
            np.sum(~np.isfinite(g)),
            w_norm,
        ])
    return np.array(out)


def _dense(g, v):
    if isinstance(g, tf.IndexedSlices):
        return np.asarray(tf.convert_to_tensor(g).numpy(), np.float64)  # sums repeated indices
    return np.asarray(g.numpy() if hasattr(g, "numpy") else g, np.float64)


def compute(gradients, variables, graph):
    rows = stats.Rows(variables)
    if graph:
        fn = tf.function(lambda gs: stats.compute(gs, variables, rows))
        layer, variable = fn(gradients)
    else:
        layer, variable = stats.compute(gradients, variables, rows)
    return rows, layer.numpy(), variable.numpy()


@pytest.fixture
def model():
    m = tf.keras.Sequential([
        tf.keras.Input((5,), dtype="int32"),
        tf.keras.layers.Embedding(50, 4, name="embed"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(7, activation="relu", name="hidden"),
        tf.keras.layers.Dense(1, name="out"),
    ], name="sequential")
    return m


def model_gradients(model, seed):
    """The model's real gradients on a random batch of token ids (the embedding's are IndexedSlices)."""
    x = tf.constant(np.random.default_rng(seed).integers(0, 50, size=(8, 5)), tf.int32)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(x) ** 2)
    return tape.gradient(loss, model.trainable_variables)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf_function"])
def test_stats_match_numpy_on_real_model_gradients(model, graph):
    grads = model_gradients(model, seed=0)
    assert isinstance(grads[0], tf.IndexedSlices)  # the embedding's gradient is sparse
    variables = model.trainable_variables
    rows, layer, variable = compute(grads, variables, graph)

    assert rows.layer_names == ["sequential/embed", "sequential/hidden", "sequential/out"]
    assert rows.variable_names == [v.path for v in variables]
    np.testing.assert_allclose(layer, reference(grads, variables, [[0], [1, 2], [3, 4]]), rtol=RTOL)
    np.testing.assert_allclose(variable, reference(grads, variables, [[i] for i in range(5)]), rtol=RTOL)


def test_indexed_slices_with_repeated_indices_equal_their_dense_sum():
    v = tf.Variable(np.ones((6, 3), np.float32), name="table")
    values = tf.constant([[1.0, 0.0, -2.0], [3.0, 0.0, 2.0], [-1.0, 0.5, 2.0]])
    slices = tf.IndexedSlices(values, tf.constant([4, 1, 4]), tf.constant([6, 3]))
    _, _, sparse = compute([slices], [v], graph=True)
    _, _, dense = compute([tf.convert_to_tensor(slices)], [v], graph=True)
    np.testing.assert_allclose(sparse, dense, rtol=RTOL)
    # Row 4 sums to [0, 0.5, 0], row 1 is [3, 0, 2]: 15 of 18 dense elements
    # are zero (counting per slice would say 14), and the largest is 3.
    assert sparse[0, COL["grad_zero_fraction"]] == pytest.approx(15 / 18)
    assert sparse[0, COL["grad_max_abs"]] == 3.0
    assert sparse[0, COL["grad_norm"]] == pytest.approx(np.sqrt(0.25 + 9 + 4))


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf_function"])
def test_none_gradient_is_missing_not_zero(graph):
    a = tf.Variable([1.0, 2.0], name="a")
    b = tf.Variable([[3.0]], name="b")
    _, layer, variable = compute([tf.constant([0.5, -0.5]), None], [a, b], graph)
    assert variable[1, : stats.GRADIENT_COLUMNS].tolist() == [stats.MISSING] * stats.GRADIENT_COLUMNS
    assert variable[1, COL["weight_norm"]] == pytest.approx(3.0)  # weights are still there
    assert variable[0, COL["grad_norm"]] == pytest.approx(np.sqrt(0.5))


def test_layer_with_one_disconnected_variable_uses_the_rest():
    m = tf.keras.Sequential([tf.keras.Input((3,)), tf.keras.layers.Dense(2, name="d")], name="sequential")
    kernel, bias = m.trainable_variables
    g = tf.constant(np.arange(6, dtype=np.float32).reshape(3, 2))
    _, layer, _ = compute([g, None], [kernel, bias], graph=True)
    ref = reference([g, None], [kernel, bias], [[0, 1]])
    np.testing.assert_allclose(layer, ref, rtol=RTOL)
    assert layer[0, COL["grad_zero_fraction"]] == pytest.approx(1 / 6)  # over the kernel only


def test_all_gradients_missing():
    a = tf.Variable([1.0], name="a")
    _, layer, variable = compute([None], [a], graph=True)
    assert layer[0, 0] == stats.MISSING and variable[0, 0] == stats.MISSING


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf_function"])
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


def test_inf_without_nan_gives_inf_norm():
    a = tf.Variable(np.ones(3, np.float32), name="a")
    _, _, variable = compute([tf.constant([1.0, np.inf, 2.0])], [a], graph=True)
    assert variable[0, COL["grad_norm"]] == np.inf and variable[0, COL["grad_max_abs"]] == np.inf
    assert variable[0, COL["grad_nonfinite"]] == 1


@pytest.mark.parametrize("scale", [1e-30, 1e-22, 1e22, 1e30])
def test_norm_survives_float32_under_and_overflow_of_squares(scale):
    values = np.array([3.0, 4.0, 0.0, 12.0], np.float32) * np.float32(scale)
    a = tf.Variable(np.ones(4, np.float32), name="a")
    _, layer, variable = compute([tf.constant(values)], [a], graph=True)
    expected = 13.0 * scale  # ||(3, 4, 0, 12)|| = 13
    assert variable[0, COL["grad_norm"]] == pytest.approx(expected, rel=RTOL)
    assert layer[0, COL["grad_norm"]] == pytest.approx(expected, rel=RTOL)
    assert variable[0, COL["grad_nonfinite"]] == 0


def test_layer_norm_of_huge_variable_norms_does_not_overflow():
    m = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1, name="d")], name="sequential")
    kernel, bias = m.trainable_variables
    g = [tf.constant([[3e30]]), tf.constant([4e30])]
    _, layer, _ = compute(g, [kernel, bias], graph=True)
    assert layer[0, COL["grad_norm"]] == pytest.approx(5e30, rel=RTOL)


def test_half_precision_and_float64():
    a = tf.Variable(np.ones(3, np.float16), name="a")
    b = tf.Variable(np.ones(2, np.float64), name="b")
    ga = tf.constant([300.0, 400.0, 0.0], tf.float16)  # squares overflow float16
    gb = tf.constant([1e-200, 0.0], tf.float64)  # below float32's range
    _, _, variable = compute([ga, gb], [a, b], graph=True)
    assert variable[0, COL["grad_norm"]] == pytest.approx(500.0, rel=1e-3)
    assert variable.dtype == np.float32  # stored as float32: 1e-200 flushes to 0 there
    assert variable[1, COL["grad_zero_fraction"]] == 0.5


def test_rows_group_keras_layers_and_plain_variables_in_first_appearance_order():
    m = tf.keras.Sequential([
        tf.keras.Input((3,)),
        tf.keras.layers.Dense(2, name="first"),
        tf.keras.layers.BatchNormalization(name="bn"),
        tf.keras.layers.Dense(1, name="second"),
    ], name="sequential")
    p1 = tf.Variable(1.0, name="Variable")
    p2 = tf.Variable(2.0, name="Variable")
    k1, b1, gamma, beta, k2, b2 = m.trainable_variables
    rows = stats.Rows([p1, k2, k1, p2, b1, gamma, b2, beta])
    assert rows.layer_names == ["Variable", "sequential/second", "sequential/first", "Variable#2", "sequential/bn"]
    assert rows.variable_names[0] == "Variable" and rows.variable_names[3] == "Variable#2"
    assert rows.layer_of == [0, 1, 2, 3, 2, 4, 1, 4]
    assert rows.layer_sizes == [1, 2 + 1, 6 + 2, 1, 2 + 2]


def test_rows_reject_bad_variables():
    v = tf.Variable(1.0, name="v")
    with pytest.raises(ValueError, match="at least one variable"):
        stats.Rows([])
    with pytest.raises(ValueError, match="same variable 'v'"):
        stats.Rows([v, v])
    with pytest.raises(TypeError, match="floating-point variables.*int32"):
        stats.Rows([tf.Variable(1, name="count")])
    with pytest.raises(TypeError, match="variables\\[0\\] of type ndarray"):
        stats.Rows([np.ones(3)])


def test_compute_rejects_mismatched_gradients():
    v = tf.Variable([1.0, 2.0], name="v")
    rows = stats.Rows([v])
    with pytest.raises(ValueError, match="one gradient per variable.*len\\(gradients\\)=2, len\\(variables\\)=1"):
        stats.compute([tf.ones(2), tf.ones(2)], [v], rows)
    with pytest.raises(ValueError, match="shape \\(3,\\) for variable 'v' of shape \\(2,\\)"):
        stats.compute([tf.ones(3)], [v], rows)
    with pytest.raises(TypeError, match="floating-point gradients.*int32"):
        stats.compute([tf.constant([1, 2])], [v], rows)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf_function"])
def test_cheap_mode_computes_norms_and_nonfinite_only(model, graph):
    grads = model_gradients(model, seed=1)
    grads[2] = grads[2] + np.float32(np.nan)  # one NaN layer
    variables = model.trainable_variables
    rows = stats.Rows(variables)
    run = tf.function(lambda gs, full: stats.compute(gs, variables, rows, weights=False, full=full)) if graph else (
        lambda gs, full: stats.compute(gs, variables, rows, weights=False, full=full))
    full_l, full_v = (t.numpy() for t in run(grads, True))
    cheap_l, cheap_v = (t.numpy() for t in run(grads, False))
    for cheap, full in ((cheap_l, full_l), (cheap_v, full_v)):
        for c in ("grad_norm", "grad_nonfinite"):
            np.testing.assert_allclose(cheap[:, COL[c]], full[:, COL[c]], rtol=RTOL)
        for c in ("grad_max_abs", "grad_zero_fraction", "weight_norm"):
            assert (cheap[:, COL[c]] == stats.MISSING).all(), c
    assert cheap_v[2, COL["grad_nonfinite"]] == 7  # hidden/bias: every one of its 7 elements is NaN
