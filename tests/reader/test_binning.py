"""Server-side step binning keeps extremes, NaN and missing honest."""

import numpy as np

from tb_gradcheck.reader.binning import bin_steps


def test_fewer_steps_than_width_pass_through():
    steps = np.arange(5)
    values = np.ones((5, 2))
    out = bin_steps(steps, values, np.zeros((5, 2), bool), 10)
    assert out[0] is steps and out[2] is values


def test_bins_cover_every_step_once():
    steps = np.arange(0, 2000, 2)
    first, last, values, _ = bin_steps(steps, np.ones((1000, 1)), np.zeros((1000, 1), bool), 7)
    assert len(first) == 7 and first[0] == 0 and last[-1] == 1998
    assert (first[1:] > last[:-1]).all()


def test_reducers_and_nonfinite_priority():
    v = np.array([[1.0], [5.0], [2.0], [np.inf], [3.0], [np.nan], [-np.inf], [4.0]])
    m = np.zeros_like(v, bool)
    steps = np.arange(8)
    _, _, mx, _ = bin_steps(steps, v, m, 4, "max")
    assert mx[:, 0].tolist()[0] == 5.0 and mx[1, 0] == np.inf and np.isnan(mx[2, 0]) and mx[3, 0] == -np.inf
    _, _, mn, _ = bin_steps(steps[:2], v[:2], m[:2], 1, "min")
    assert mn[0, 0] == 1.0
    _, _, mean, _ = bin_steps(steps[:3], v[:3], m[:3], 1, "mean")
    assert mean[0, 0] == 8.0 / 3


def test_missing_is_ignored_unless_the_whole_bin_is_missing():
    v = np.array([[1.0, 9.0], [7.0, 9.0], [2.0, 9.0], [3.0, 9.0]])
    m = np.array([[False, True], [True, True], [False, False], [False, False]])
    _, _, out, out_m = bin_steps(np.arange(4), v, m, 2)
    assert out[0, 0] == 1.0 and out_m[0, 1] and not out_m[1, 1] and out[1, 1] == 9.0


def _one_bin(values, missing, reduce):
    """The definition, for one bin's cells of one row: the reducer over finite present values, a present NaN/Inf wins."""
    present = values[~missing]
    for special in (np.nan, np.inf, -np.inf):  # in order of precedence
        if np.any(np.isnan(present) if special != special else present == special):
            return special, False
    finite = present[np.isfinite(present)]
    if not len(finite):
        return np.nan, not len(present)
    return {"max": np.max, "min": np.min, "mean": np.mean}[reduce](finite), False


def test_every_bin_is_its_definition_whatever_the_width_and_the_cells():
    """The fold over bins (all bins one row offset at a time) against a bin-by-bin loop, on uneven bins."""
    rng = np.random.default_rng(7)
    for trial in range(120):
        n, rows = int(rng.integers(2, 80)), int(rng.integers(1, 5))
        values = rng.standard_normal((n, rows)).astype(np.float32)
        missing = rng.random((n, rows)) < (0.3 if trial % 3 else 0.0)
        if trial % 2:
            for special in (np.nan, np.inf, -np.inf):
                values[rng.random((n, rows)) < 0.04] = special
        width = int(rng.integers(1, n))
        for reduce in ("max", "min", "mean"):
            first, last, out, out_missing = bin_steps(np.arange(n), values, missing, width, reduce)
            assert len(first) <= width and first[0] == 0 and last[-1] == n - 1
            for b, (s, e) in enumerate(zip(first, last)):
                for r in range(rows):
                    want, want_missing = _one_bin(values[s : e + 1, r], missing[s : e + 1, r], reduce)
                    assert out_missing[b, r] == want_missing, (trial, reduce, b, r)
                    # Max and min are exact. A mean sums float32 cells of about unit size in
                    # float32: up to 80 roundings of 6e-8 each, in another order than numpy's.
                    np.testing.assert_allclose(out[b, r], want, rtol=0, atol=1e-5 if reduce == "mean" else 0)
