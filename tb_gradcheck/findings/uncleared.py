"""The finding of a loop that never clears its gradients (no ``zero_grad()``); numpy only.

Not a rule over the numbers: an accumulated gradient is a sum of real
gradients, and its norm grows the way a real one can. The PyTorch writer
sees it happen (``tb_gradcheck.torch.cleared``) and marks the layouts it
writes from then on (``gradients_not_cleared``); the reader hands the last
step before the first marked layout here (``RunIndex.not_cleared_after``).
TensorFlow's tape and JAX's ``grad`` return a fresh gradient at every step,
so their runs never carry the mark.
"""

import numpy as np

from tb_gradcheck.findings import finding

KIND = "not_cleared"


def find(run, stats, after):
    """The ``not_cleared`` finding of a run marked after step ``after`` (-1: from the start), or none (``after`` None).

    One error over every row, from the first written step after ``after``
    to the run's last: every step from then on applies the sum of the
    gradients so far, whatever each layer's numbers look like. Its
    evidence is each row's gradient norm at the first and last of those
    steps, the growth a user sees in the heatmap.
    """
    if after is None or stats is None:
        return []
    steps = np.asarray(stats.steps)
    marked = np.flatnonzero(steps > after)
    if not len(marked) or "grad_norm" not in stats.columns or "last" not in stats.aggregates:
        return []
    norms, missing = stats.slab("grad_norm", "last")
    first, last = int(marked[0]), int(marked[-1])
    evidence = {}
    for j, name in enumerate(stats.rows):
        seen = marked[~missing[marked, j]]
        if not len(seen):
            continue
        evidence[name] = {
            "grad_norm_first": float(norms[seen[0], j]),
            "grad_norm_last": float(norms[seen[-1], j]),
            "first_step": int(steps[seen[0]]),
            "last_step": int(steps[seen[-1]]),
        }
    if not evidence:
        return []
    f = finding.Finding(
        KIND, "error", run, list(evidence), [int(steps[first]), int(steps[last])], "grad_norm", "last", "", evidence
    )
    f.message = describe(f)
    return [f]


def describe(found, quote=None):
    """The sentence of a ``not_cleared`` finding (``optimizer.describe`` passes it on); it names no layer: all are."""
    e = found.evidence
    before = float(np.sqrt(sum(x["grad_norm_first"] ** 2 for x in e.values())))
    after = float(np.sqrt(sum(x["grad_norm_last"] ** 2 for x in e.values())))
    return (
        f"Gradients never cleared between optimizer steps, steps {found.steps[0]}-{found.steps[1]}: each backward() "
        "added into the gradients the optimizer had already applied (the PyTorch writer saw it), so every step "
        "applies the sum of all gradients so far, and every row records that sum (the whole gradient's norm went "
        f"from {before:.3g} to {after:.3g}). Call optimizer.zero_grad() once per step, before backward()."
    )
