"""The spans of a layout (``tags.tag_for``) read as one tag: which points a restart preempted; numpy only.

A stats layout is written as one tag per span of steps, so that a tag stops
growing. TensorBoard sees separate tags, and applies its rule for a
restarted job (a point written later at a step at or below another's drops
that other) within each tag only. ``standing`` applies it across the tags of
one layout, for the store (``store.py``) and the run listing
(``queries.runs``); what stands is then merged as before (``merge.py``).
"""

import numpy as np

from tb_gradcheck.core import tags


def preempted(steps, times):
    """Which points of one layout's tags still stand, by TensorBoard's rule for a restarted job.

    A job restarted from a checkpoint writes steps it had written before.
    TensorBoard's Rust data server then drops the tag's points at that step
    and after ("preemption"): a point is dropped when a point written later
    has a step at or below its own. A layout written as spans of steps
    (``tags.tag_for``) is several tags, and the server applies the rule
    within each only: a rewind into an earlier span leaves the later spans'
    points, which belong to the run that was abandoned. This applies the
    rule across all the spans of a layout, so a layout reads as one tag
    would. It also applies it within a tag, which the Python loader does not
    do for ``tf.summary`` logs (it purges only at a ``SessionLog.START``):
    both loaders then show the same points.

    Args:
      steps: Per tag, int64 ``[S_i]``, its readable points' steps, ascending.
      times: Per tag, float64 ``[S_i]``, their wall times.

    Returns:
      Per tag, None when every point stands, else bool ``[S_i]``: the
      points that stand.
    """
    sizes = [len(s) for s in steps]
    out = [None] * len(steps)
    if sum(sizes) < 2:
        return out
    # The points in the order they were written. Tags ordered by their first
    # write, each in its own (step) order: the common case, nothing ever
    # rewound, is then one ascending run of both steps and times, checked
    # without sorting.
    first = [t[0] if len(t) else np.inf for t in times]
    order = sorted(range(len(steps)), key=lambda i: first[i])
    all_steps = np.concatenate([np.asarray(steps[i], np.int64) for i in order])
    all_times = np.concatenate([np.asarray(times[i], np.float64) for i in order])
    if np.all(np.diff(all_times) >= 0) and np.all(np.diff(all_steps) > 0):
        return out
    written = np.argsort(all_times, kind="stable")
    later = all_steps[written]
    # The smallest step written after each point (after the last: none).
    after = np.empty_like(later)
    after[:-1] = np.minimum.accumulate(later[::-1])[::-1][1:]
    after[-1] = np.iinfo(np.int64).max
    stands = np.empty(len(later), bool)
    stands[written] = later < after
    start = 0
    for i in order:
        keep = stands[start : start + sizes[i]]
        start += sizes[i]
        if not keep.all():
            out[i] = keep
    return out


def standing(layouts, summaries):
    """Per tag, the points a later write did not preempt: None (all of them) or a bool mask of its steps.

    The rule (``preempted``) applies to the tags of one layout: its
    spans (``tags.span_of``), or its one tag when written before spans.

    Args:
      layouts: ``Series`` of one run, kind and granularity.
      summaries: Their ``Summary`` objects, in the same order.
    """
    groups = {}
    for i, s in enumerate(layouts):
        groups.setdefault(tags.span_of(s.tag)[0], []).append(i)
    out = [None] * len(layouts)
    for members in groups.values():
        masks = preempted([summaries[i].steps for i in members], [summaries[i].times for i in members])
        for i, mask in zip(members, masks):
            out[i] = mask
    return out


def last_counts(layouts, summaries):
    """Per tag, ``(step, write counter)`` at its layout's last standing step if the tag holds it, else None.

    What one tag would say: its last point's counter, after what a restart
    preempted. Of a layout's spans only the one holding the newest standing
    step answers, so a later span left by an abandoned run does not.
    """
    stands = standing(layouts, summaries)
    newest = {}  # layout tag -> (step, index)
    for i, (s, summary, keep) in enumerate(zip(layouts, summaries, stands)):
        steps = summary.steps if keep is None else summary.steps[keep]
        if len(steps) and summary.count is not None:
            base = tags.span_of(s.tag)[0]
            newest[base] = max(newest.get(base, (steps[-1], i)), (steps[-1], i))
    out = [None] * len(layouts)
    for _, i in newest.values():
        summary, keep = summaries[i], stands[i]
        steps, counts = (summary.steps, summary.counts) if keep is None else (summary.steps[keep], summary.counts[keep])
        out[i] = int(steps[-1]), float(counts[-1])
    return out
