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
    finite = np.isfinite(values)
    holes = missing.any()
    if holes:
        finite &= ~missing
    if not holes and finite.all():
        # Every cell present and finite (the common case): one pass, no
        # temporaries the size of the matrix.
        out = REDUCE_AT[reduce](values, starts, axis=0)
        if reduce == "mean":
            out = out / np.diff(np.append(starts, n))[:, None]
        return steps[starts], steps[ends], out, np.zeros(out.shape, bool)
    # A finite value never equals the fill, so a bin's result is the fill
    # exactly when it holds no finite value: no second pass to find those.
    if reduce == "mean":
        total = np.add.reduceat(np.where(finite, values, 0.0), starts, axis=0)
        count = np.add.reduceat(finite.astype(np.int64), starts, axis=0)
        out = total / np.maximum(count, 1)
        any_finite = count > 0
    elif reduce == "min":
        out = np.minimum.reduceat(np.where(finite, values, np.inf), starts, axis=0)
        any_finite = out != np.inf
    else:
        out = np.maximum.reduceat(np.where(finite, values, -np.inf), starts, axis=0)
        any_finite = out != -np.inf
    out = np.where(any_finite, out, np.nan)
    special = ~finite
    if holes:
        special &= ~missing  # present and NaN or infinite: rare, and each wins its bin
    if not special.any():
        return steps[starts], steps[ends], out, ~any_finite
    for value in (-np.inf, np.inf, np.nan):  # later wins: NaN over +Inf over -Inf
        hit = special & (np.isnan(values) if value != value else values == value)
        out = np.where(np.logical_or.reduceat(hit, starts, axis=0), value, out)
    out_missing = np.logical_and.reduceat(missing, starts, axis=0)
    return steps[starts], steps[ends], out, out_missing


REDUCE_AT = {"max": np.maximum.reduceat, "min": np.minimum.reduceat, "mean": np.add.reduceat}
