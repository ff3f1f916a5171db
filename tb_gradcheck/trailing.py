"""Trailing windows over a run's writes: the arithmetic the rules share; numpy only.

Every matrix here is ``[writes, rows]``, one column per layer. The window
``before`` write ``t`` holds writes ``t - length .. t - 1``; ``through`` and
``persistent`` take the window that ends at ``t``. Neither reads a write after ``t``,
which is what keeps the rules causal (``tb_gradcheck.rules``).
"""

import warnings

import numpy as np


def log_level(values, present):
    """log10 of a positive finite value, NaN otherwise (a zero norm has no level to rise from)."""
    ok = present & np.isfinite(values) & (values > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(ok, np.log10(np.where(ok, values, 1.0)), np.nan)


def before(values, length, reduce):
    """``reduce`` over the ``length`` writes before each write (not including it), per column; NaN when none."""
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


def through(values, length, reduce):
    """``reduce`` over the ``length`` writes that end at each write (including it), per column."""
    pad = np.full((1, values.shape[1]), np.nan)
    return before(np.concatenate([values, pad]), length, reduce)[1:]


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


def running_max_before(values):
    """Largest finite value over the writes before each write, -inf when none."""
    filled = np.where(np.isnan(values), -np.inf, values)
    running = np.maximum.accumulate(filled, axis=0)
    return np.concatenate([np.full((1, values.shape[1]), -np.inf), running[:-1]], axis=0)


def persistent(condition, here, t):
    """Writes where ``condition`` holds and held in at least ``persistence`` of the trailing window's writes."""
    window = t.baseline_writes
    c = (condition & here).astype(np.float64)
    n = here.astype(np.float64)
    # Sums over the window ending at each write (inclusive), by cumulative sums.
    zeros = np.zeros((1, c.shape[1]))
    cc = np.concatenate([zeros, np.cumsum(c, axis=0)])
    cn = np.concatenate([zeros, np.cumsum(n, axis=0)])
    lo = np.maximum(np.arange(1, len(c) + 1) - window, 0)
    hits = cc[1:] - cc[lo]
    counts = cn[1:] - cn[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return condition & here & (counts >= t.min_writes) & (hits >= t.persistence * counts)
