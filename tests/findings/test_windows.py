"""Trailing windows over writes (tb_gradcheck.findings.windows) against a plain loop: which writes each window holds."""

import numpy as np
import pytest

from tb_gradcheck.findings import windows


def naive(values, lo, hi, reduce):
    """``reduce`` over rows ``lo..hi`` (clipped to the matrix), NaN when none."""
    rows = values[max(lo, 0) : max(hi + 1, 0)]
    return reduce(rows, axis=0) if len(rows) else np.full(values.shape[1], np.nan)


@pytest.mark.filterwarnings("ignore:All-NaN slice")  # the naive loop on a window of one NaN
def test_before_and_through_hold_the_writes_they_say():
    values = np.random.default_rng(0).normal(size=(30, 3))
    values[4, 1] = np.nan
    for length in (1, 3, 20):
        got_before = windows.before(values, length, np.nanmax)
        got_through = windows.through(values, length, np.nanmax)
        for t in range(len(values)):
            np.testing.assert_array_equal(got_before[t], naive(values, t - length, t - 1, np.nanmax))
            np.testing.assert_array_equal(got_through[t], naive(values, t - length + 1, t, np.nanmax))


def test_through_counts_the_first_write():
    # The first write belongs to every window that reaches back to it: a
    # layer dead from write 0 has min_writes behind it at write min_writes - 1.
    counts = windows.through(np.ones((6, 1)), 20, np.nansum)[:, 0]
    assert counts.tolist() == [1, 2, 3, 4, 5, 6]


def test_run_start_walks_back_over_the_unbroken_run_only():
    mask = np.array([True, False, True, True, True, False])
    assert windows.run_start(mask, 4) == 2  # not past the gap at write 1
    assert windows.run_start(mask, 0) == 0


@pytest.mark.parametrize("reduce", [windows.nanmedian, windows.nanmax, windows.nanmin, windows.count])
@pytest.mark.filterwarnings("ignore:All-NaN slice")
def test_sliding_reducers_give_the_numbers_of_the_stacked_windows(reduce):
    # The module's reducers slide (sorted contiguous windows, doubling,
    # cumulative counts); every verdict rests on their being the same numbers
    # as the reducer over each window stacked, NaNs, ties, a window longer
    # than the run and an empty run included.
    rng = np.random.default_rng(3)
    for s, n in ((0, 3), (1, 2), (7, 4), (60, 9)):
        values = rng.normal(size=(s, n))
        values[rng.random((s, n)) < 0.15] = np.nan
        values[rng.random((s, n)) < 0.15] = 0.5  # ties
        if n > 3:
            values[:, 3] = np.nan  # a layer never written
        if reduce is windows.count:
            values = (rng.random((s, n)) < 0.5).astype(float)
        for length in (1, 2, 5, 10, 20, 75):
            stacked = windows._windows(values, length, reduce)
            np.testing.assert_array_equal(windows.before(values, length, reduce), stacked)
            ends = windows._windows(np.concatenate([values, np.full((1, n), np.nan)]), length, reduce)[1:]
            np.testing.assert_array_equal(windows.through(values, length, reduce), ends)


def test_median_of_others_is_the_median_of_each_row_without_the_column():
    rng = np.random.default_rng(5)
    for s, n in ((0, 3), (4, 1), (5, 2), (40, 7), (30, 12)):
        values = rng.normal(size=(s, n))
        values[rng.random((s, n)) < 0.2] = np.nan
        values[rng.random((s, n)) < 0.1] = -np.inf  # no update at all: not a value of the median
        values[rng.random((s, n)) < 0.2] = 0.25  # ties
        got = windows.median_of_others(values)
        for i in range(s):
            for j in range(n):
                rest = np.delete(values[i], j)
                rest = rest[np.isfinite(rest)]
                expected = np.median(rest) if len(rest) else np.nan
                np.testing.assert_equal(got[i, j], expected)
