"""Server-side downsampling of a heatmap along steps, keeping extremes; numpy only."""

import numpy as np

REDUCERS = ("max", "min", "mean")


def bin_steps(steps, values, missing, width, reduce="max"):
    """Groups consecutive steps into at most ``width`` bins.

    Each bin's value is ``reduce`` over its finite present values, except that
    a non-finite value anywhere in the bin wins (NaN over +Inf over -Inf): a
    NaN must never be averaged away, and with ``max`` a one-step spike shows at
    any width. A bin with nothing present stays missing.

    Args:
      steps: int ``[S]`` ascending.
      values: float ``[S, R]``.
      missing: bool ``[S, R]``.
      width: Int >= 1, the most bins to return.
      reduce: ``"max"``, ``"min"`` or ``"mean"``.

    Returns:
      ``(first_steps [B], last_steps [B], values [B, R], missing [B, R])``;
      the inputs unchanged (with ``last_steps`` equal to ``steps``) when
      there are no more steps than ``width``.
    """
    n = len(steps)
    if n <= width:
        return steps, steps, values, missing
    # Bin edges by index, so every bin covers (almost) the same number of writes.
    starts = np.unique(np.linspace(0, n, width + 1).astype(np.int64)[:-1])
    ends = np.append(starts[1:], n) - 1
    present = ~missing
    finite = present & np.isfinite(values)
    any_finite = np.logical_or.reduceat(finite, starts, axis=0)
    if reduce == "mean":
        total = np.add.reduceat(np.where(finite, values, 0.0), starts, axis=0)
        count = np.add.reduceat(finite.astype(np.int64), starts, axis=0)
        out = total / np.maximum(count, 1)
    elif reduce == "min":
        out = np.minimum.reduceat(np.where(finite, values, np.inf), starts, axis=0)
    else:
        out = np.maximum.reduceat(np.where(finite, values, -np.inf), starts, axis=0)
    out = np.where(any_finite, out, np.nan)
    for special in (-np.inf, np.inf, np.nan):  # later wins: NaN over +Inf over -Inf
        hit = present & (np.isnan(values) if special != special else values == special)
        out = np.where(np.logical_or.reduceat(hit, starts, axis=0), special, out)
    out_missing = ~np.logical_or.reduceat(present, starts, axis=0)
    return steps[starts], steps[ends], out, out_missing
