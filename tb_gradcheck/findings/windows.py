"""Trailing windows over a run's writes: the arithmetic the rules share; numpy only.

Every matrix here is ``[writes, rows]``, one column per layer. The window
``before`` write ``t`` holds writes ``t - length .. t - 1``; ``through`` and
``persistent`` take the window that ends at ``t``. Neither reads a write after ``t``,
which is what keeps the rules causal (``tb_gradcheck.findings.rules``).
"""

import warnings

import numpy as np


def log_level(values, present):
    """log10 of a positive finite value, NaN otherwise (a zero norm has no level to rise from)."""
    ok = present & np.isfinite(values) & (values > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ok, np.log10(np.where(ok, values, 1.0)), np.nan)


def before(values, length, reduce):
    """``reduce`` over the ``length`` writes before each write (not including it), per column; NaN when none.

    ``reduce`` is any reduction over the last axis of a stack of windows. The
    reducers of this module (``nanmedian``, ``nanmax``, ``nanmin``, ``count``)
    slide instead (``_SLIDING``): the same numbers, without a pass over every
    write of every window (2,000 rows x 10,000 steps: 400 million values).
    """
    fast = _SLIDING.get(reduce)
    if fast is not None:
        # The window before write t is the window through write t - 1.
        shifted = np.concatenate([np.full((1, values.shape[1]), np.nan), values])[: len(values)]
        return fast(shifted, length)
    return _windows(values, length, reduce)


def through(values, length, reduce):
    """``reduce`` over the ``length`` writes that end at each write (including it), per column."""
    fast = _SLIDING.get(reduce)
    if fast is not None:
        return fast(values, length)
    pad = np.full((1, values.shape[1]), np.nan)
    return _windows(np.concatenate([values, pad]), length, reduce)[1:]


def _windows(values, length, reduce):
    """``before`` for any reducer: each window stacked and reduced."""
    s, n_rows = values.shape
    padded = np.concatenate([np.full((length, n_rows), np.nan), values], axis=0)
    windows = np.lib.stride_tricks.sliding_window_view(padded, length, axis=0)[:s]  # [S, L, length], a view
    out = np.empty((s, n_rows))
    # A few columns at a time: the reduction copies its input, and S x L x
    # length at once is hundreds of megabytes for a long run of a big model.
    chunk = max(1, (1 << 20) // max(1, s * length))
    with np.errstate(all="ignore"), _quiet():
        for j in range(0, n_rows, chunk):
            out[:, j : j + chunk] = reduce(windows[:, j : j + chunk], axis=-1)
    return out


def run_start(mask, end):
    """The first write of the unbroken run of true writes in ``mask`` (one column, bool) that ends at ``end``."""
    start = end
    while start > 0 and mask[start - 1]:
        start -= 1
    return start


class _quiet:
    """Silences numpy's "All-NaN slice" and "Mean of empty slice" warnings: an empty window is NaN on purpose."""

    def __enter__(self):
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._catch.__exit__(*exc)


def median_of_others(values):
    """``[S, L]``: for each column, the median of the finite values in the other columns of its row (NaN: none).

    What a layer is judged against at a write: the rest of the network.
    One sort of each row, then each column's own value skipped by its rank,
    where ``np.delete`` per column would copy the matrix once per layer.
    """
    values = np.where(np.isfinite(values), values, np.nan)
    n = values.shape[1]
    order = np.argsort(values, axis=1, kind="stable")  # NaN last
    ordered = np.take_along_axis(values, order, axis=1)
    rank = np.empty_like(order)  # each value's place in ``ordered``: the inverse of the one sort
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(n), order.shape), axis=1)
    inside = ~np.isnan(values)  # a finite value of its own, left out of its median
    others = np.sum(inside, axis=1, keepdims=True) - inside

    def kth(k):  # the k-th smallest of the others: past the column's own rank, one further along
        index = np.where(inside & (k >= rank), k + 1, k)
        return np.take_along_axis(ordered, np.clip(index, 0, max(n - 1, 0)), axis=1)

    with np.errstate(invalid="ignore"):
        middle = (kth((others - 1) // 2) + kth(others // 2)) / 2
    return np.where(others > 0, middle, np.nan)


def nanmedian(windows, axis=-1):
    """``np.nanmedian`` over the last axis by one sort: NaN sorts last, the median sits among the finite values.

    numpy's own nanmedian falls back to a Python-level loop per window, which
    is seconds for a long run of a big model.
    """
    ordered = np.sort(windows, axis=axis)
    n = np.sum(~np.isnan(windows), axis=axis)
    lo = np.clip((n - 1) // 2, 0, None)[..., None]
    hi = np.clip(n // 2, 0, windows.shape[axis] - 1)[..., None]
    middle = (np.take_along_axis(ordered, lo, axis) + np.take_along_axis(ordered, hi, axis))[..., 0] / 2
    return np.where(n > 0, middle, np.nan)


def nanmax(windows, axis=-1):
    """The largest value of each window, NaN ignored; NaN when the window holds none."""
    with np.errstate(invalid="ignore"):
        return np.fmax.reduce(windows, axis=axis)


def nanmin(windows, axis=-1):
    """The smallest value of each window, NaN ignored; NaN when the window holds none."""
    with np.errstate(invalid="ignore"):
        return np.fmin.reduce(windows, axis=axis)


def count(windows, axis=-1):
    """How many writes of each window are true (not 0, not NaN)."""
    return np.sum((windows != 0) & ~np.isnan(windows), axis=axis).astype(np.float64)


def _count_through(values, length):
    """``count`` over the window through each write, by one cumulative sum of integers (exact)."""
    return window_sums(values.astype(bool) if values.dtype == bool else (values != 0) & ~np.isnan(values), length)


def window_sums(mask, length):
    """int32 ``[S, L]``: how many writes of ``mask`` are true in the window of ``length`` through each write."""
    s, n_rows = mask.shape
    seen = np.zeros((s + 1, n_rows), np.int32)  # counts of at most S writes
    np.cumsum(mask, axis=0, dtype=np.int32, out=seen[1:])
    lo = np.maximum(np.arange(1, s + 1) - length, 0)
    return seen[1:] - seen[lo]


def _extreme_through(op, values, length):
    """``op`` (np.fmax or np.fmin) over the window through each write, by doubling.

    After k doublings ``m[i]`` is ``op`` over the ``2**k`` writes from ``i``;
    a window of ``length`` is ``op`` of two such spans that overlap, which
    changes nothing for a maximum. About log2(length) passes over the matrix
    instead of ``length``.
    """
    s, n_rows = values.shape
    if s == 0:
        return np.zeros((0, n_rows))
    m = np.concatenate([np.full((length - 1, n_rows), np.nan), values]).astype(np.float64)
    span = 1
    while 2 * span <= length:
        m = op(m[:-span], m[span:])
        span *= 2
    return op(m[:s], m[length - span : length - span + s])


def _median_through(values, length):
    """``nanmedian`` over the window through each write: the same sort, on windows laid out contiguously.

    Each layer's writes are laid out contiguously first, so a window is
    ``length`` adjacent values and numpy sorts them in place with its
    vectorised sort (a window of 20 in about 60 ns); the stacked windows of
    ``_windows`` are strided across layers and sort several times slower.
    A full window (no NaN, most of them) takes its two middle values; the
    few with a NaN (the run's first writes, a write without a gradient)
    take ``nanmedian``'s indices into the same sorted window.
    """
    s, n_rows = values.shape
    out = np.empty((s, n_rows))
    if s == 0 or n_rows == 0:
        return out
    known = window_sums(~np.isnan(values), length).T  # [L, S]: values in each window
    lo, hi = (length - 1) // 2, length // 2
    padded = np.concatenate([np.full((n_rows, length - 1), np.nan), values.T], axis=1)
    windows = np.lib.stride_tricks.sliding_window_view(padded, length, axis=1)  # [L, S, length], a view
    chunk = max(1, (1 << 22) // (s * length))
    for a in range(0, n_rows, chunk):
        w = np.array(windows[a : a + chunk]).reshape(-1, length)  # a copy, each window contiguous
        w.sort(axis=-1)  # NaN last, as in nanmedian
        middle = (w[:, lo] + w[:, hi]) / 2
        n = known[a : a + chunk].reshape(-1)
        partial = np.flatnonzero(n < length)
        if len(partial):
            k = n[partial]
            rows = w[partial]
            low = np.take_along_axis(rows, np.clip((k - 1) // 2, 0, None)[:, None], 1)[:, 0]
            high = np.take_along_axis(rows, np.clip(k // 2, 0, length - 1)[:, None], 1)[:, 0]
            middle[partial] = np.where(k > 0, (low + high) / 2, np.nan)
        out[:, a : a + chunk] = middle.reshape(-1, s).T
    return out


def running_max_before(values):
    """Largest finite value over the writes before each write, -inf when none."""
    filled = np.where(np.isnan(values), -np.inf, values)
    running = np.maximum.accumulate(filled, axis=0)
    return np.concatenate([np.full((1, values.shape[1]), -np.inf), running[:-1]], axis=0)


def persistent(condition, here, t):
    """Writes where ``condition`` holds and held in at least ``persistence`` of the trailing window's writes."""
    # Counts over the window ending at each write (inclusive), by cumulative sums.
    hits = window_sums(condition & here, t.baseline_writes)
    counts = window_sums(here, t.baseline_writes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return condition & here & (counts >= t.min_writes) & (hits >= t.persistence * counts)


# Reducers that slide: each computes ``through`` for its reducer, the same
# numbers as the stacked windows of ``_windows``.
_SLIDING = {
    nanmedian: _median_through,
    nanmax: lambda values, length: _extreme_through(np.fmax, values, length),
    nanmin: lambda values, length: _extreme_through(np.fmin, values, length),
    count: _count_through,
}
