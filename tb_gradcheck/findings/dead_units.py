"""The dead rule: units that die, layers (mostly) dead or cut off, and idle units shown as information; numpy only.

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
- **mostly dead**: most of the layer gets no gradient in every write of a
  whole trailing window, more than a coin flip per unit leaves idle,
  whatever it had at the start (a bias or weight scale initialised wrong
  kills units at step 0 that never come back);
- **silent**: (almost) every unit of the layer gets no gradient, so (almost)
  nothing passes through it to the layers before it.

Those are warnings while they last. A share that is there from the start at
the levels healthy networks show and does not grow (idle units), and a
phase that is over by the layer's latest writes (recovered: the share is
back under ``dead_mostly``), are information: shown, never in an exit code.

A layer behind a later one none of whose units passes any gradient at a
write is *cut off* there: it gets no gradient, and its writes say nothing
of its own units. It is never "recovered": if
it was dying, mostly dead or silent before it was cut off it is named so
(with the step it was cut off from), and otherwise it is left to the
silent layer, whose evidence counts it (``layers_cut_off_behind``). Where
its outputs were measured (``act_dead_fraction``) its units are known
there anyway, and it is judged by them.
"""

import numpy as np

from tb_gradcheck.findings import finding
from tb_gradcheck.findings import rules
from tb_gradcheck.findings import windows

IDLE, DYING, MOSTLY, SILENT = "idle", "dying", "mostly_dead", "silent"
RECOVERED, PARTLY = "recovered", "partly_recovered"
SICK = (DYING, MOSTLY, SILENT)


def dead(v, t, sparse):
    """Dead units of each layer, from ``dead_unit_fraction``: dying, mostly dead and silent layers (warning), idle and recovered ones (info).

    Reads the writer's dead-unit statistic (units whose every parameter has
    an exactly-zero gradient), not the share of zero elements: sparse inputs
    zero whole kernel rows of a live layer, and a dead layer zeroes the rows
    of the layer after it. Rows with sparse (IndexedSlices) gradients are
    exempt. A log without the statistic gets no dead finding.

    Args:
      v: A ``rules.StatsView``.
      t: ``diagnose.Thresholds`` (``dying_share``, ``dead_silent``,
        ``dead_mostly``, ``dead_units``, ``baseline_writes``, ``min_writes``).
      sparse: Names of rows with sparse gradients.

    Returns:
      A ``rules.Verdict`` whose severity is ``"warning"`` for a layer dying,
      mostly dead or silent at its latest write (or when it was cut off) and
      ``"info"`` for the others it names.
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
    # A write at which every layer is wholly silent at once, while the layer
    # nearest the output had most of its units alive at the next write (or,
    # at the end of the run, the last write) with a gradient, says nothing of
    # any layer's units: with no gradient anywhere no gradient step moved a
    # weight in between, so those units did not die and come back; the batch
    # or the loss gave no gradient (sample weights of 0 on a padded batch,
    # every target masked, a loss at exactly 0). Those writes are left out.
    # A layer already mostly dead whose last live units are silent on a batch
    # is its dead units, and a network silent up to its last write is still
    # read as its output layer's dead units (a ReLU on the output), unless the
    # run has already shown silences as long that ended (the same padded tail
    # in its last epoch).
    batch_without_gradient = _batches_without_gradient(here, whole, v.dead, t.dead_mostly)
    here &= ~batch_without_gradient[:, None]
    whole &= ~batch_without_gradient[:, None]
    # A wholly silent layer behind a later wholly silent one says nothing of
    # its own units: no gradient reaches it. Its writes are the later
    # layer's (in a chain, the one nearest the output is the cause: a
    # saturated head, a dead layer in front of live ones). Wholly silent
    # itself too: a layer with a path around the later one (a residual
    # branch) still gets its gradient.
    later = np.flip(np.logical_or.accumulate(np.flip(whole, axis=1), axis=1), axis=1)
    cut_off = whole & np.concatenate([later[:, 1:], np.zeros((s, 1), bool)], axis=1)
    cause = whole & ~cut_off  # the layer a write's cut-off layers are behind
    no_gradient = cut_off.copy()  # what the silent layers' evidence counts, whatever else is known
    fraction = v.dead
    if v.dead_by_output is not None:
        # Where its outputs were measured, a cut-off layer's own units are
        # known: a ReLU unit with no positive output on the batch is one its
        # own ReLU gives no gradient, the share its gradient would show if
        # the layers after it passed any. There it is judged by them, so a
        # chain of dead layers names each, not only the one nearest the output.
        with np.errstate(invalid="ignore"):
            seen = cut_off & (v.dead_by_output >= 0) & (v.dead_by_output <= 1)
        fraction = np.where(seen, v.dead_by_output, v.dead)
        cut_off &= ~seen
        whole = np.where(seen, fraction >= 1, whole)
    valid = here.copy()
    here &= ~cut_off
    whole &= ~cut_off
    share = np.where(here, fraction, np.nan)
    # The lowest share over the trailing window, not the share at one write:
    # a trained ReLU unit can be selective (active on 2% of the inputs is
    # silent on a batch of 64 one time in four), but a dead unit is silent on
    # every batch, so the share dead is at most the window's minimum, and the
    # minimum over enough batches leaves the selective units out.
    lowest = windows.through(share, t.baseline_writes, windows.nanmin)  # writes (t - window, t]
    enough = windows.through(here, t.baseline_writes, windows.count) >= t.min_writes
    start = _start(share, here, t.min_writes)
    # A layer none of whose units gets any gradient on min_writes batches in
    # a row is silent without waiting for a whole window: selectivity leaves
    # some unit of a live layer active on some example of a batch.
    in_a_row = windows.through(whole, t.min_writes, windows.count) >= t.min_writes
    with np.errstate(invalid="ignore"):
        died = lowest - start  # of the layer's units, since the first writes
        dying = here & enough & (died > 0) & (died >= t.dying_share * (1 - start))
        silent = here & (enough & (lowest >= t.dead_silent) | in_a_row)
        mostly = here & enough & (lowest >= t.dead_mostly)
        idle = here & enough & (lowest >= t.dead_units)
    sick = dying | mostly | silent
    flags = sick | idle
    # Each layer's latest write with a share, and whether no gradient reached it there.
    last_valid = s - 1 - np.argmax(np.flip(valid, axis=0), axis=0)
    ends_cut = valid.any(axis=0) & cut_off[last_valid, np.arange(n_rows)]
    severity, evidence = {}, {}
    for j in rules.flagged_columns(flags):
        name = v.rows[j]
        was = DYING if dying[:, j].any() else SILENT if silent[:, j].any() else MOSTLY if mostly[:, j].any() else IDLE
        if ends_cut[j] and was == IDLE:
            continue  # idle, then cut off: the silent layer after it speaks for it
        last = int(np.flatnonzero(here[:, j])[-1])
        shown = sick[:, j] if was != IDLE else idle[:, j]
        if ends_cut[j]:
            # Cut off, never recovered: named as what it was before the cut.
            state = was
        elif not shown[last]:
            # Alive again: back under the share a healthy layer leaves idle
            # (dead_units); partly, where an idle-sized share is left.
            state = RECOVERED if not lowest[last, j] >= t.dead_units else PARTLY
        else:
            state = SILENT if silent[last, j] else DYING if was == DYING else MOSTLY if mostly[last, j] else was
        # The rule is sure only once a window has passed; the layer was in
        # this state from the first write of the unbroken run that led there.
        bar = {DYING: None, SILENT: t.dead_silent, MOSTLY: t.dead_mostly, IDLE: t.dead_units}[was]
        with np.errstate(invalid="ignore"):
            if bar is None:
                held = share[:, j] - start[:, j] >= t.dying_share * (1 - start[:, j])
            else:
                held = share[:, j] >= bar
        confirmed = int(np.argmax(shown))
        onset = windows.run_start(here[:, j] & held, confirmed)
        steps = v.steps[shown]
        e = {
            "state": state,
            "start_dead_unit_fraction": float(start[confirmed, j]),
            "median_dead_unit_fraction": float(np.median(fraction[shown, j])),
            "lowest_dead_unit_fraction": float(np.min(lowest[shown, j])),
            "max_dead_unit_fraction": float(np.max(fraction[shown, j])),
            "fraction_of_steps": float(shown.sum() / here[:, j].sum()),
            "first_step": int(v.steps[onset]),
            "confirmed_at_step": int(steps[0]),
            "last_step": int(steps[-1]),
        }
        if state in SICK:
            # Most of it dead since the first writes: units that never fired.
            e["since"] = "initialisation" if start[confirmed, j] >= t.dead_mostly else "training"
        if state in (RECOVERED, PARTLY):
            # The window's lowest: the share that is at most truly dead now.
            e["latest_dead_unit_fraction"] = float(lowest[last, j])
        if ends_cut[j]:
            tail = windows.run_start(cut_off[:, j], int(last_valid[j]))
            e["cut_off_from_step"] = int(v.steps[tail])
            e["cut_off_behind"] = v.rows[j + 1 + int(np.argmax(cause[last_valid[j], j + 1 :]))]
            e["last_step"] = int(v.steps[last_valid[j]])
            flags[tail : last_valid[j] + 1, j] = True
        evidence[name] = e
        severity[name] = "warning" if state in SICK else "info"
    cut_rows = rules.flagged_columns(no_gradient)
    if evidence:
        # For each named layer, the layers it cut off: those without any
        # gradient at a write where it was the wholly silent layer nearest
        # the output (every cut-off layer of a write is behind that one).
        # One product over the writes, not a loop over pairs of rows (2,000
        # rows x 10,000 steps).
        named = [j for j, name in enumerate(v.rows) if name in evidence]
        together = no_gradient[:, cut_rows].T.astype(np.float32) @ cause[:, named].astype(np.float32) > 0
        cutting = cause[:, named] & no_gradient.any(axis=1)[:, None]
        for i, (k, count) in enumerate(zip(named, together.sum(axis=0))):
            evidence[v.rows[k]]["layers_cut_off_behind"] = int(count)
            if count:
                evidence[v.rows[k]]["last_step_cutting_off"] = int(v.steps[np.flatnonzero(cutting[:, i])[-1]])
    quiet = frozenset(v.rows[j] for j in cut_rows if v.rows[j] not in evidence)
    return rules.Verdict(flags, severity, evidence, "last", quiet)


def describe(f, quote):
    """The sentence of a ``dead`` finding, names passed through ``quote`` (``diagnose.describe``)."""
    e = f.evidence
    names = finding.name_list(f.layers, quote)
    first, last = f.steps

    def shares(key, among=None):
        values = [e[n][key] for n in among or f.layers]
        lo, hi = f"{min(values):.0%}", f"{max(values):.0%}"
        return lo if lo == hi else f"{lo}-{hi}"

    def those(state):
        return [n for n in f.layers if e[n]["state"] == state]

    states = {x["state"] for x in e.values()}
    if f.severity == "info":
        return _info_sentence(f, names, quote, those, shares)
    behind = max(x.get("layers_cut_off_behind", 0) for x in e.values())
    after = ""
    if behind:
        until = max(x.get("last_step_cutting_off", -1) for x in e.values())
        when = "" if until >= last else f"at times, until step {until}, "
        after = (
            f"; {when}no gradient {'reaches' if not when else 'reached'} the {finding.count(behind, 'layer')} before it"
        )
    cut = [n for n in f.layers if "cut_off_from_step" in e[n]]
    if cut:
        after += (
            f"; {finding.name_list(cut, quote)} then cut off from step "
            f"{min(e[n]['cut_off_from_step'] for n in cut)} behind "
            f"{finding.name_list(sorted({e[n]['cut_off_behind'] for n in cut}), quote)}"
        )
    if states == {SILENT} and all(x.get("lowest_dead_unit_fraction") == 1 for x in e.values()):
        # Every unit, every write: the stored numbers cannot say why. Units
        # dead behind a ReLU look the same as a path after the layer that
        # multiplies its gradient by 0 (a zero gate, a branch scaled by 0,
        # a saturated tanh), so the sentence names both; and JAX's zeros for
        # a parameter the loss does not use, where no depth_order of the
        # loss has marked it (tb_gradcheck.jax.reach).
        return (
            f"No gradient through {names}: every unit gets an exactly zero gradient on whole batches, "
            f"steps {first}-{last} (dead units, a path after it that multiplies the gradient by 0, or, in JAX, "
            f"no path from the loss, which jax.grad fills with zeros: a depth_order of the loss tells){after}."
        )
    how = []
    if those(DYING):
        how.append(
            f"dying in {finding.name_list(those(DYING), quote)}, up from "
            f"{shares('start_dead_unit_fraction', those(DYING))} in the first writes"
        )
    from_start = [n for n in f.layers if e[n].get("since") == "initialisation"]
    if from_start:
        how.append(
            f"dead from initialisation in {finding.name_list(from_start, quote)} and never back: "
            "a bias or weight scale initialised wrong"
        )
    if those(SILENT):
        how.append(f"so (almost) no gradient passes through {finding.name_list(those(SILENT), quote)}")
    if not how:
        how.append("more than a healthy layer leaves idle")
    return (
        f"Dead units in {names}: {shares('median_dead_unit_fraction')} of the units get an exactly zero "
        f"gradient on whole batches ({'; '.join(how)}), steps {first}-{last}{after}."
    )


def _info_sentence(f, names, quote, those, shares):
    first, last = f.steps
    idle, partly = those(IDLE), those(PARTLY)
    back = those(RECOVERED) + partly
    if not back:
        return (
            f"Idle units in {names}: {shares('median_dead_unit_fraction')} of the units get no gradient on whole "
            f"batches, steps {first}-{last} ({shares('start_dead_unit_fraction')} in the first writes: idle from the "
            "start, or drifted there, not dying); common in healthy ReLU networks (information, not a problem)."
        )
    word = "partly recovered" if partly else "recovered"
    text = (
        f"Units without gradient in {finding.name_list(back, quote)} {word}: "
        f"{shares('median_dead_unit_fraction', back)} of the units got no gradient on whole batches at steps "
        f"{min(f.evidence[n]['first_step'] for n in back)}-{max(f.evidence[n]['last_step'] for n in back)}, "
        f"{shares('latest_dead_unit_fraction', back)} at the latest writes"
    )
    if idle:
        text += f"; idle units in {finding.name_list(idle, quote)}"
    return text + " (information, not a problem)."


def _batches_without_gradient(here, whole, dead, mostly):
    """Per write, whether every layer was wholly silent there because the batch gave no gradient (``dead``'s comment)."""
    s = len(here)
    measured = here.any(axis=1)
    everything = measured & (whole | ~here).all(axis=1)
    flowing = np.flatnonzero(measured & ~everything)
    out = np.zeros(s, bool)
    tail = []
    for w in np.flatnonzero(everything):
        row = np.flatnonzero(here[w])[-1]  # the measured layer nearest the output
        k = np.searchsorted(flowing, w)
        if k < len(flowing):
            out[w] = _mostly_alive(here, dead, flowing[k], row, mostly)
        elif k > 0 and _mostly_alive(here, dead, flowing[k - 1], row, mostly):
            tail.append(w)
    if tail and len(tail) <= _longest_run(out):
        out[tail] = True
    return out


def _mostly_alive(here, dead, w, row, mostly):
    return bool(here[w, row] and dead[w, row] < mostly)


def _longest_run(flags):
    """The longest run of True in a 1-D bool array (0 if none)."""
    best = length = 0
    for flag in flags:
        length = length + 1 if flag else 0
        best = max(best, length)
    return best


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
