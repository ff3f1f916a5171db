"""merge.py on hand-built layouts: rows merged by name, later layouts win, columns read by name; no TensorBoard.

Each layout here is what ``metadata.stats_layout`` / ``check_layout`` makes
and ``store`` decodes; the values are chosen so that every cell says where it
came from (layout, step, row, column), and every assertion recomputes that.
"""

import numpy as np
import pytest

from tb_gradcheck.core import metadata
from tb_gradcheck.reader import merge

C = list(metadata.STORED_STAT_COLUMNS)


def stats_part(layers, steps, aggregates=("last",), window=1, tag_value=0.0, columns=C):
    """A stats ``Part``: cell (step s, slab a, row r, column c) = tag_value + s + r / 10 + c / 100 + a / 1000."""
    content = metadata.stats_layout(
        {"rows": layers, "sizes": [1] * len(layers)},
        {"rows": [f"{n}/v" for n in layers], "sizes": [1] * len(layers)},
        aggregates,
        window,
    )
    content["columns"] = list(columns)
    steps = np.asarray(steps, np.int64)
    s, a, r, c = np.meshgrid(
        steps, np.arange(len(aggregates)), np.arange(2 * len(layers) + 1), np.arange(len(columns)), indexing="ij"
    )
    values = (tag_value + s + r / 10 + c / 100 + a / 1000).astype(np.float32)
    return merge.Part(content, steps, values)


def expected(tag_value, step, row, column, aggregate=0):
    return np.float32(tag_value + step + row / 10 + column / 100 + aggregate / 1000)


def test_one_layout_slab_is_its_column():
    part = stats_part(["a", "b"], [0, 5, 7])
    steps, values, missing = merge.slab([part], "layer", "grad_max_abs", "last")
    assert steps.tolist() == [0, 5, 7] and not missing.any()
    c = C.index("grad_max_abs")
    assert values.tolist() == [[expected(0, s, r, c) for r in range(2)] for s in (0, 5, 7)]
    _, variables, _ = merge.slab([part], "variable", "grad_max_abs", "last")
    assert variables[0].tolist() == [expected(0, 0, 2, c), expected(0, 0, 3, c)]  # variable rows follow the layers


def test_two_layouts_merge_by_name_and_the_later_one_wins_a_shared_step():
    first = stats_part(["a", "b"], [0, 1, 2], tag_value=100)
    second = stats_part(["b", "c"], [2, 3], tag_value=200)  # "b" moved to row 0, "a" gone, "c" new
    steps, values, missing = merge.slab([first, second], "layer", "grad_norm", "last")
    assert steps.tolist() == [0, 1, 2, 3]
    assert merge.rows([first.content, second.content], "layer") == ["a", "b", "c"]
    want = np.full((4, 3), np.nan, np.float32)
    want[0:3, 0] = [expected(100, s, 0, 0) for s in (0, 1, 2)]
    want[0:2, 1] = [expected(100, s, 1, 0) for s in (0, 1)]
    want[2:4, 1] = [expected(200, s, 0, 0) for s in (2, 3)]  # step 2: the later layout wins
    want[2:4, 2] = [expected(200, s, 1, 0) for s in (2, 3)]
    np.testing.assert_array_equal(values, want)
    np.testing.assert_array_equal(missing, np.isnan(want))


def test_minus_one_is_missing_nan_is_data_and_a_missing_cell_does_not_overwrite():
    first = stats_part(["a"], [0, 1], tag_value=10)
    second = stats_part(["a"], [1], tag_value=20)
    second.values[0, 0, 0, 0] = -1  # no gradient at step 1 in the later layout
    first.values[0, 0, 0, 0] = np.nan
    _, values, missing = merge.slab([first, second], "layer", "grad_norm", "last")
    assert np.isnan(values[0, 0]) and not missing[0, 0]
    assert values[1, 0] == expected(10, 1, 0, 0) and not missing[1, 0]


def test_columns_are_read_by_name_unknown_ones_skipped_absent_ones_missing():
    reordered = ["future_stat"] + C[::-1]  # a newer writer: another order, one column this reader does not know
    part = stats_part(["a"], [3], columns=reordered)
    _, values, missing = merge.slab([part], "layer", "weight_norm", "last")
    assert values[0, 0] == expected(0, 3, 0, reordered.index("weight_norm"))
    old = stats_part(["a"], [4], columns=C[:2])  # an older writer without weight_norm
    steps, values, missing = merge.slab([part, old], "layer", "weight_norm", "last")
    assert steps.tolist() == [3, 4] and missing[:, 0].tolist() == [False, True]


def test_grad_to_weight_is_derived_per_cell_and_missing_for_zero_weights():
    part = stats_part(["a", "b"], [0, 1])
    part.values[:, 0, 1, C.index("weight_norm")] = 0  # layer b: all-zero weights
    _, values, missing = merge.slab([part], "layer", "grad_to_weight", "last")
    norm, weight = C.index("grad_norm"), C.index("weight_norm")
    np.testing.assert_allclose(
        values[:, 0], [expected(0, s, 0, norm) / expected(0, s, 0, weight) for s in (0, 1)], rtol=1e-6
    )
    assert missing[:, 1].all() and not missing[:, 0].any()


def test_aggregates_of_a_windowed_layout_and_last_standing_in_for_a_one_step_window():
    windowed = stats_part(["a"], [9], aggregates=("last", "mean", "max", "min", "sum"), window=10)
    _, values, _ = merge.slab([windowed], "layer", "grad_norm", "max")
    assert values[0, 0] == expected(0, 9, 0, 0, aggregate=2)
    every_step = stats_part(["a"], [10])
    steps, values, missing = merge.slab([windowed, every_step], "layer", "grad_norm", "max")
    assert steps.tolist() == [9, 10] and values[1, 0] == expected(0, 10, 0, 0) and not missing.any()
    _, _, missing = merge.slab([windowed, every_step], "layer", "grad_nonfinite", "sum")
    assert missing[:, 0].tolist() == [False, True]  # a one-step window has no sum to stand in for


def test_check_rows_with_a_nan_status_are_missing_in_every_column():
    content = metadata.check_layout("layer", ["a", "b"])
    values = np.arange(2 * 2 * len(metadata.CHECK_COLUMNS), dtype=np.float32).reshape(2, 2, -1)
    status = metadata.CHECK_COLUMNS.index("status")
    values[:, :, status] = [[0, 2], [np.nan, 1]]
    part = merge.Part(content, np.array([4, 8], np.int64), values)
    _, error, missing = merge.slab([part], "layer", "relative_error")
    assert missing.tolist() == [[False, False], [True, False]]
    assert error[0].tolist() == values[0, :, metadata.CHECK_COLUMNS.index("relative_error")].tolist()


def test_matrix_holds_every_column_and_aggregate_and_agrees_with_slab():
    parts = [
        stats_part(["a", "b"], [0, 1, 2], aggregates=("last", "max"), window=5, tag_value=1),
        stats_part(["b", "c"], [2, 3], tag_value=2),
    ]
    m = merge.matrix(parts, metadata.KIND_STATS, "layer", problems=["p"])
    assert m.rows == ["a", "b", "c"] and m.aggregates == ["last", "max"] and m.problems == ["p"]
    assert set(metadata.STAT_COLUMNS) <= set(m.columns)
    for aggregate in m.aggregates:
        for column in m.columns:
            _, values, missing = merge.slab(parts, "layer", column, aggregate)
            got_values, got_missing = m.slab(column, aggregate)
            np.testing.assert_array_equal(got_values, values)
            np.testing.assert_array_equal(got_missing, missing)


@pytest.mark.parametrize("kind", [metadata.KIND_STATS, metadata.KIND_CHECK])
def test_no_parts_give_an_empty_matrix(kind):
    m = merge.matrix([], kind, "layer")
    assert m.values.shape[0] == 0 and m.rows == []


def test_interleaved_steps_and_reordered_rows_land_on_their_own_cells():
    first = stats_part(["a", "b", "c"], [0, 2, 4], tag_value=100)
    second = stats_part(["c", "a"], [1, 3], tag_value=200)  # rows in another order, steps between the first's
    steps, values, missing = merge.slab([first, second], "layer", "grad_norm", "last")
    assert steps.tolist() == [0, 1, 2, 3, 4] and not missing[:, [0, 2]].any()
    assert missing[:, 1].tolist() == [False, True, False, True, False]
    for i, s in enumerate(steps):
        layout, order = (100, ["a", "b", "c"]) if s % 2 == 0 else (200, ["c", "a"])
        for j, name in enumerate(["a", "b", "c"]):
            if name in order:
                assert values[i, j] == expected(layout, s, order.index(name), 0)
