"""Rises of a layer's gradient norm over its own past, for the exploding rule; numpy only.

``rules.exploding`` finds the writes where a rise starts; these say how long
each lasts, and where the norm grows steadily instead.
"""

import numpy as np

from tb_gradcheck.findings import windows


def spans(onsets, level, lt, lp, bad):
    """``(starts, ends)`` of one layer's rises: each onset outside an earlier rise, to where it stops holding.

    ``level`` is ``[S]``: the level a rise at each write must hold. Most
    onsets of a noisy layer end at the next write, and such a rise cannot
    swallow a later onset; those are settled together, and only the onsets
    whose rise outlasts one write walk the run in order.
    """
    s = len(lt)
    nxt = np.minimum(onsets + 1, s - 1)
    lasting = holds(level[onsets], lt[nxt], lp[nxt], bad[nxt]) & (onsets + 1 < s)
    if not lasting.any():
        return onsets, onsets + 1
    starts, ends = [], []
    stop = 0
    for i, long in zip(onsets.tolist(), lasting.tolist()):
        if i < stop:
            continue  # inside the previous rise
        stop = end(i, level[i], lt, lp, bad) if long else i + 1
        starts.append(i)
        ends.append(stop)
    return np.array(starts, np.int64), np.array(ends, np.int64)


def holds(level, lt, lp, bad):
    """Where a rise to ``level`` still holds: the typical norm stays at ``level``, or the gradients are non-finite.

    The peak alone speaks for a write whose typical norm is NaN.
    """
    with np.errstate(invalid="ignore"):
        return bad | (lt >= level) | ((lp >= level) & np.isnan(lt))


def end(i, level, lt, lp, bad):
    """The first write after ``i`` at which a rise to ``level`` no longer holds (``len(lt)`` if it holds to the end).

    The search looks ahead in doubling windows: a noisy run has an
    onset every few writes, and testing the whole rest of the run for each
    of them made findings quadratic in the steps (11 minutes on 2,000 rows
    x 10,000 steps); this costs about the length of each rise.
    """
    lo, width = i + 1, 16
    while lo < len(lt):
        hi = min(len(lt), lo + width)
        held = holds(level, lt[lo:hi], lp[lo:hi], bad[lo:hi])
        if not held.all():
            return lo + int(np.argmin(held))
        lo, width = hi, 2 * width
    return len(lt)


def growth(lt, t):
    """Steady growth: the median of the latest half-window against the half-window before it.

    Returns ``(growth orders [S, L], growing [S, L], recent [S, L])``,
    ``recent`` the median of the latest half-window. Medians of half the
    baseline window each: one outlier moves neither, and a polynomial climb
    from zero (a layer behind a zero-initialised head: its gradient grows
    like the head's weights, about linearly) gains a factor of about 3 per
    half-window at most, where an exponential blow-up gains its rate to the
    power of the half-window.
    """
    s, n_rows = lt.shape
    half = max(1, t.baseline_writes // 2)
    pad = np.full((half, n_rows), np.nan)
    recent = windows.through(lt, half, windows.nanmedian)  # writes (t - half, t]
    counts = windows.through(np.isfinite(lt), half, windows.count)
    earlier = np.concatenate([pad, recent])[:s]  # writes (t - 2 half, t - half]
    earlier_counts = np.concatenate([np.zeros((half, n_rows)), counts])[:s]
    filled = np.where(np.isnan(lt), -np.inf, lt)
    before = np.concatenate([np.full((half, n_rows), -np.inf), np.maximum.accumulate(filled, axis=0)])[:s]
    network = np.nanmax(np.where(np.isnan(earlier), -np.inf, earlier), axis=1, keepdims=True)
    enough = (counts >= max(1, half // 2)) & (earlier_counts >= max(1, half // 2))
    growth = np.where(enough, recent - earlier, np.nan)
    with np.errstate(invalid="ignore"):
        growing = enough & (growth >= t.growth_orders) & (recent > before) & (recent > network)
    return growth, growing, recent


def settled(growing, recent, lt, bad, weight, t):
    """bool ``[S]``: the writes of one layer's growth after which the growth stopped at its new level for a whole baseline window.

    Growth is flagged because exponential growth is how a divergence
    starts; a divergence does not stop by itself, it grows on until the
    gradient overflows or something (clipping, saturation) holds it. A
    growth is settled when, over the ``baseline_writes`` writes after it,
    the growth rule does not fire again (no further gain of
    ``growth_orders`` per half-window), the layer's typical norm does not
    fall back (their median stays within ``growth_orders`` below the level
    it had reached: a growth that falls back is a slow spike, not a new
    level), no gradient is NaN or Inf, and the weights are not thrown about
    (their norm stays within ``growth_orders`` of where it was before the
    growth). That is a change of level: a network leaving its starting
    plateau raises its gradients (attention that starts to pick raises its
    projections') to where they then stay, while the loss falls. No loss
    is stored with the gradients, so that is what stands in for it. A
    growth whose window has not passed yet is not settled.

    Args:
      growing: bool ``[S]``: one layer's growth writes (``growth``).
      recent: ``[S]``: its median of the latest half-window (``growth``).
      lt: ``[S]``: its log10 typical norm.
      bad: bool ``[S]``: non-finite writes.
      weight: ``[S]`` weight norms, or None.
      t: ``diagnose.Thresholds``.
    """
    s = len(growing)
    out = np.zeros(s, bool)
    edges = np.diff(np.concatenate([[0], growing.astype(np.int8), [0]]))
    for a, b in zip(np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)):  # growth at writes a .. b-1
        hold = slice(b, b + t.baseline_writes)
        after = lt[hold]
        if b + t.baseline_writes > s or growing[hold].any() or bad[hold].any() or not np.isfinite(after).any():
            continue
        with np.errstate(invalid="ignore"):
            if not np.nanmedian(after) >= recent[b - 1] - t.growth_orders:
                continue
            if weight is not None and np.nanmax(weight[hold]) > weight[max(a - 1, 0)] * 10.0**t.growth_orders:
                continue
        out[a:b] = True
    return out


def too_large(v, limit):
    """Writes where a layer's gradient is too large for the weights it would update, with or without a past.

    The ratio ``||g|| / ||W||`` is what an SGD step of learning rate ``lr``
    moves the weights by, as a fraction of their size (``lr * ||g|| / ||W||``),
    so it needs no baseline: an explosion present from the first step shows
    in it as well as one that rises. A layer is flagged at a write when its
    own ratio and the whole network's (``sqrt(sum ||g||^2) / sqrt(sum
    ||W||^2)`` over the layers written there) are both at least ``limit``.
    The network's, because one layer can have tiny weights by design and
    then a large ratio on an ordinary gradient: a LayerScale initialised at
    1e-6, a layer just leaving a zero initialisation, a convolution whose
    gradient in front of a normalisation layer grows as its weights shrink.
    Layers whose first recorded weight norm is exactly 0 (zero-initialised)
    are left out of both: their ratio measures how far they have come from
    zero, not how large their gradient is.

    Args:
      v: A ``rules.StatsView``.
      limit: ``Thresholds.explode_ratio``.

    Returns:
      ``(large [S, L] bool, ratio [S, L], network ratio [S])``; all False
      when the log has no weight norms.
    """
    s, n_rows = v.norm.shape
    if v.weight_norm is None:
        nothing = np.full((s, n_rows), np.nan)
        return np.zeros((s, n_rows), bool), nothing, np.full(s, np.nan)
    g, w = v.norm, v.weight_norm
    with np.errstate(invalid="ignore"):
        ok = v.present & np.isfinite(g) & np.isfinite(w) & (w > 0)
        recorded = v.present & np.isfinite(w)
    first = np.argmax(recorded, axis=0)
    zero_init = recorded.any(axis=0) & (w[first, np.arange(n_rows)] == 0)
    ok &= ~zero_init[None, :]
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(ok, g / np.where(ok, w, 1.0), np.nan)
        network = np.sqrt(np.where(ok, g * g, 0.0).sum(axis=1)) / np.sqrt(np.where(ok, w * w, 0.0).sum(axis=1))
        large = ok & (ratio >= limit) & (network >= limit)[:, None]
    return large, ratio, network


def held(trigger, hold):
    """``(starts, ends)`` of one layer's stretches: from a ``trigger`` write while ``trigger`` or ``hold`` lasts.

    Each maximal run of writes where ``trigger | hold`` is true and that
    holds a trigger write is one stretch, from its first trigger write to
    the write after the run (``len(trigger)`` when it lasts to the end).
    ``hold`` is the writes that carry a stretch on without starting one
    (non-finite gradients, whose norm says nothing).
    """
    on = (trigger | hold).astype(np.int8)
    edges = np.diff(np.concatenate([[0], on, [0]]))
    run_starts, run_ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    hits = np.flatnonzero(trigger)
    if not len(hits):
        return hits, hits
    run = np.searchsorted(run_starts, hits, side="right") - 1
    runs, first = np.unique(run, return_index=True)
    return hits[first].astype(np.int64), run_ends[runs].astype(np.int64)
