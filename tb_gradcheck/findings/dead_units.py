"""The dead rule: units that die, layers that fall (almost) silent, and idle units shown as information; numpy only.

A ReLU unit that is inactive on every example of a batch gets an exactly
zero gradient on that batch (the writer's ``dead_unit_fraction``). That alone
is no pathology: with correlated inputs (non-negative features, pooled
activations, averaged embeddings) each unit's response to their common
component has a sign fixed at initialisation, a coin flip per unit, so a
healthy network can start with a large share of units idle on every input
and train well on the rest. What goes wrong is different and it shows over
time:

- **dying**: units that were alive stop, and stay stopped (the classic dying
  ReLU after a learning-rate jump or one bad step): a large part of the
  units that were alive in the run's first writes gets no gradient in every
  write of a whole trailing window;
- **silent**: (almost) every unit of the layer gets no gradient, so (almost)
  nothing passes through it to the layers before it, whatever it had at the
  start.

Those are warnings while they last. A share that is there from the start and
does not grow (idle units), and a dying or silent phase that is over by the
layer's latest write (recovered), are information: shown, never in an exit
code.
"""

import numpy as np

from tb_gradcheck.findings import rules
from tb_gradcheck.findings import windows as trailing

IDLE, DYING, SILENT, RECOVERED = "idle", "dying", "silent", "recovered"


def dead(v, t, sparse):
    """Dead units of each layer, from ``dead_unit_fraction``: dying and silent layers (warning), idle and recovered ones (info).

    Reads the writer's dead-unit statistic (units whose every parameter has
    an exactly-zero gradient), not the share of zero elements: sparse inputs
    zero whole kernel rows of a live layer, and a dead layer zeroes the rows
    of the layer after it. Rows with sparse (IndexedSlices) gradients are
    exempt. A log without the statistic gets no dead finding.

    Args:
      v: A ``rules.StatsView``.
      t: ``diagnose.Thresholds`` (``dying_share``, ``dead_silent``,
        ``dead_units``, ``baseline_writes``, ``min_writes``).
      sparse: Names of rows with sparse gradients.

    Returns:
      A ``rules.Verdict`` whose severity is ``"warning"`` for a layer dying or
      silent at its latest write and ``"info"`` for the others it names.
    """
    s, n_rows = v.norm.shape
    flags = np.zeros((s, n_rows), bool)
    if v.dead is None:
        return rules.Verdict(flags, {}, {}, "last")
    here = np.isfinite(v.dead) & (v.dead >= 0) & (v.dead <= 1)  # a share; anything else is a damaged log
    if v.weight_norm is not None:
        # Weights that are NaN or Inf (non_finite says so) give units no
        # meaning: ReLU(NaN) is 0 in a compiled step, a zero gradient that
        # says nothing of the layer's units.
        here &= ~(v.present & ~np.isfinite(v.weight_norm))
    exempt = np.array([name in sparse for name in v.rows])
    here &= ~exempt[None, :]
    with np.errstate(invalid="ignore"):
        whole = here & (v.dead >= 1)
    # A wholly silent layer behind a later wholly silent one says nothing of
    # its own units: no gradient reaches it. Its writes are the later
    # layer's (in a chain, the one nearest the output is the cause: a
    # saturated head, a dead layer in front of live ones).
    later = np.flip(np.logical_or.accumulate(np.flip(whole, axis=1), axis=1), axis=1)
    cut_off = whole & np.concatenate([later[:, 1:], np.zeros((s, 1), bool)], axis=1)
    here &= ~cut_off
    whole &= ~cut_off
    share = np.where(here, v.dead, np.nan)
    # The lowest share over the trailing window, not the share at one write:
    # a trained ReLU unit can be selective (active on 2% of the inputs is
    # silent on a batch of 64 one time in four), but a dead unit is silent on
    # every batch, so the share dead is at most the window's minimum, and the
    # minimum over enough batches leaves the selective units out.
    lowest = trailing.through(share, t.baseline_writes, trailing.nanmin)  # writes (t - window, t]
    enough = trailing.through(here, t.baseline_writes, trailing.count) >= t.min_writes
    start = _start(share, here, t.min_writes)
    # A layer none of whose units gets any gradient on min_writes batches in
    # a row is silent without waiting for a whole window: selectivity leaves
    # some unit of a live layer active on some example of a batch.
    in_a_row = trailing.through(whole, t.min_writes, trailing.count) >= t.min_writes
    with np.errstate(invalid="ignore"):
        died = lowest - start  # of the layer's units, since the first writes
        dying = here & enough & (died > 0) & (died >= t.dying_share * (1 - start))
        silent = here & (enough & (lowest >= t.dead_silent) | in_a_row)
        idle = here & enough & (lowest >= t.dead_units)
    sick = dying | silent
    flags = sick | idle
    severity, evidence = {}, {}
    for j in rules.flagged_columns(flags):
        name = v.rows[j]
        last = int(np.flatnonzero(here[:, j])[-1])
        # What the layer went through (its worst), and whether that still
        # holds at its latest write; a phase over by then has recovered.
        was = DYING if dying[:, j].any() else SILENT if silent[:, j].any() else IDLE
        shown = sick[:, j] if was != IDLE else idle[:, j]
        state = was if shown[last] else RECOVERED
        if state == DYING and silent[last, j]:
            state = SILENT
        # The rule is sure only once a window has passed; the layer was in
        # this state from the first write of the unbroken run that led there.
        with np.errstate(invalid="ignore"):
            if was == DYING:
                held = share[:, j] - start[:, j] >= t.dying_share * (1 - start[:, j])
            else:
                held = share[:, j] >= (t.dead_silent if was == SILENT else t.dead_units)
        confirmed = int(np.argmax(shown))
        onset = trailing.run_start(here[:, j] & held, confirmed)
        steps = v.steps[shown]
        e = {
            "state": state,
            "start_dead_unit_fraction": float(start[confirmed, j]),
            "median_dead_unit_fraction": float(np.median(v.dead[shown, j])),
            "lowest_dead_unit_fraction": float(np.min(lowest[shown, j])),
            "max_dead_unit_fraction": float(np.max(v.dead[shown, j])),
            "fraction_of_steps": float(shown.sum() / here[:, j].sum()),
            "first_step": int(v.steps[onset]),
            "confirmed_at_step": int(steps[0]),
            "last_step": int(steps[-1]),
        }
        if state == RECOVERED:
            e["latest_dead_unit_fraction"] = float(v.dead[last, j])
        evidence[name] = e
        severity[name] = "warning" if state in (DYING, SILENT) else "info"
    quiet_rows = [j for j in rules.flagged_columns(cut_off) if v.rows[j] not in evidence]
    if evidence:
        # For each named layer, the quiet layers before it that got no
        # gradient while it was silent: one product over the writes, not a
        # loop over pairs of rows (2,000 rows x 10,000 steps).
        named = [j for j, name in enumerate(v.rows) if name in evidence]
        together = cut_off[:, quiet_rows].T.astype(np.float32) @ flags[:, named].astype(np.float32) > 0
        before = np.array(quiet_rows, np.int64)[:, None] < np.array(named, np.int64)[None, :]
        for k, count in zip(named, (together & before).sum(axis=0)):
            evidence[v.rows[k]]["layers_cut_off_behind"] = int(count)
    quiet = frozenset(v.rows[j] for j in quiet_rows)
    return rules.Verdict(flags, severity, evidence, "last", quiet)


def _start(share, here, count):
    """``[S, L]``: each layer's lowest share over its first ``count`` writes with a share, as known at each write.

    The start of the run is the reference a dying layer rises from. The
    lowest, as for the trailing window: the selective units out, and the
    units that die in those first writes (a learning rate that kills from
    the first step) do not raise it.
    """
    seen = np.cumsum(here, axis=0)
    early = here & (seen <= count)
    return np.fmin.accumulate(np.where(early, share, np.nan), axis=0)
