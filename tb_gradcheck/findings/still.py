"""A network whose weights never move: no update reaches any layer that gets a gradient; numpy only.

Gradients computed and never applied are the commonest way a loop trains
nothing: ``optimizer.step()`` left out of a PyTorch loop, the parameters a
jitted JAX step returns dropped (``params, opt_state = step(...)`` kept only
the state), ``apply_gradients`` missing from a TensorFlow loop, a learning
rate of 0 everywhere. Every gradient is then real and of a healthy size,
so no rule over the gradients can see it; what shows it is the weights.
Every writer stores each layer's ``weight_norm`` at each written step,
taken before that step's update, so two writes with no update between
them store the same norm bit for bit (the same reduction over the same
values). A weight that moves changes its norm: even an update orthogonal
to the weights changes it, at second order, and a float32 norm resolves a
relative change of 6e-8, so a network that trains at any usable pace
changes the stored norm of some layer between any two writes. This rule
needs *every* layer that gets a gradient to keep its norm, for a whole
window of writes: a part of the network frozen on purpose (``set_to_zero``,
a group at learning rate 0, a frozen backbone) leaves the rest moving.

A schedule that anneals to 0 is not such a loop. At the end of a cosine or
linear decay to 0 (or after repeated plateau reductions) the updates
shrink until float32 stops resolving them in any layer's norm: a healthy
run of 20,000 steps with a cosine schedule to 0, written every step, held
its weights' norms bit for bit over its last 220 writes. Its motion faded
into that stillness, by orders, over the writes before it. A loop that
does not apply its updates stops at once, at its first step or at the
line that was dropped, after moving at its usual pace. So a stretch that
follows writes whose largest relative change of a layer's norm had fallen
``FADE_ORDERS`` orders below the run's typical change (the median over
its moving writes before), or to a few units in float32's last place (a
run slow all along reaches that floor with less to fall), is a fade, not
this finding.
"""

import numpy as np

from tb_gradcheck.findings import finding

KIND = "not_learning"
STILL = finding.STILL
# Orders by which the motion just before a still stretch must have fallen
# below the run's typical motion for the stillness to be an annealed end.
FADE_ORDERS = 2
# Moving writes just before a stretch whose motion is compared to the typical one.
RECENT_WRITES = 3
# A relative change of a norm of a few units in float32's last place (2**-23
# each): motion at the limit of what float32 resolves, however slow the run.
LAST_PLACES = 4 * 2.0**-23


def find(run, stats, t, found):
    """``found`` (the optimizer's not_learning findings) with this rule's finding, if any, replacing what it covers.

    Args:
      run: Run name.
      stats: ``store.Matrix`` of kind stats at layer granularity.
      t: ``optimizer.OptimizerThresholds``: ``slow_pace_writes`` (the
        writes the weights must stay the same over: the window every
        not-learning rule judges a state on) and ``not_learning_floor``.
      found: The not_learning findings of the other rules. A layer frozen
        by the optimizer (update exactly 0, information) is one of the
        still network's layers here, not an intended freeze of a part: it
        is dropped from them.

    Returns:
      A list of ``finding.Finding``.
    """
    still = _still(stats, t)
    if still is None:
        return found
    first, last, layers, evidence = still
    names = set(layers)
    kept = []
    for f in found:
        if f.severity == "info" and set(f.layers) <= names:
            continue
        kept.append(f)
    f = finding.Finding(KIND, "warning", run, layers, [first, last], "weight_norm", "last", "", evidence)
    f.message = describe(f)
    return kept + [f]


def _still(stats, t):
    """``(first step, last step, layers, evidence)`` of the weights' longest unbroken stillness, or None.

    A write is still when at least one layer has a finite gradient above 0
    there and at the write before, and every such layer stored the same
    weight norm at both. A layer whose recorded update at the earlier write
    was above 0 but under ``not_learning_floor`` is left to the float32 rule
    (an update float32 rounds away, which ``not_learning`` names): such a
    write is not counted here.
    """
    weights, no_weights = finding.last_slab(stats, "weight_norm")
    grad, no_grad = finding.last_slab(stats, "grad_norm")
    if weights is None or grad is None or len(stats.steps) <= t.slow_pace_writes:
        return None
    with np.errstate(invalid="ignore"):
        here = ~no_weights & ~no_grad & np.isfinite(weights) & np.isfinite(grad) & (grad > 0)
    both = here[1:] & here[:-1]
    same = np.where(both, weights[1:] == weights[:-1], True)
    update, no_update = finding.last_slab(stats, "update_to_weight")
    if update is not None:
        with np.errstate(invalid="ignore"):
            tiny = ~no_update[:-1] & (update[:-1] > 0) & (update[:-1] < t.not_learning_floor)
        same &= ~(both & tiny)
    still = both.any(axis=1) & same.all(axis=1)  # [S - 1]: write i + 1 holds write i's weights
    with np.errstate(invalid="ignore", divide="ignore"):
        change = np.where(both, np.abs(weights[1:] - weights[:-1]) / np.abs(weights[:-1]), 0.0)
    motion = np.nan_to_num(change, nan=0.0, posinf=0.0).max(axis=1, initial=0.0)  # [S - 1]
    best = None
    i = 0
    while i < len(still):
        if not still[i]:
            i += 1
            continue
        j = i
        while j < len(still) and still[j]:
            j += 1
        long_enough = j - i >= t.slow_pace_writes and (best is None or j - i >= best[1] - best[0])
        if long_enough and not _faded(motion[:i]):
            best = (i, j)
        i = j
    if best is None:
        return None
    i, j = best
    rows = both[i:j].any(axis=0)
    layers = [name for name, r in zip(stats.rows, rows) if r]
    steps = np.asarray(stats.steps)
    evidence = {}
    for k in np.flatnonzero(rows):
        at = both[i:j, k]
        g = grad[i + 1 : j + 1, k][at]
        e = {
            "weight_norm": float(weights[i, k]),
            "median_grad_norm": float(np.median(g)),
            "writes_unchanged": int(at.sum()) + 1,  # the writes that held the same weights
            "first_step": int(steps[i]),
            "last_step": int(steps[j]),
            "reason": STILL,
        }
        if update is not None:
            u = update[i:j, k][~no_update[i:j, k]]
            e["median_update_to_weight"] = float(np.median(u)) if len(u) else None
        evidence[stats.rows[k]] = e
    return int(steps[i]), int(steps[j]), layers, evidence


def _faded(before):
    """Whether the motion before a still stretch (per write, the largest relative change of a norm) faded into it.

    The last ``RECENT_WRITES`` moving writes against the median of all the
    moving writes before the stretch; none before it (still from the first
    write) is no fade.
    """
    moving = before[before > 0]
    if not len(moving):
        return False
    recent = moving[-RECENT_WRITES:].max()
    return bool(recent < np.median(moving) * 10.0**-FADE_ORDERS or recent <= LAST_PLACES)


def ours(found):
    """Whether ``found`` is this rule's finding."""
    return found.kind == KIND and any(e.get("reason") == STILL for e in found.evidence.values())


def describe(found, quote=None):
    """The sentence of this rule's finding, names passed through ``quote``."""
    quote = quote or finding.isolate
    e = found.evidence
    first, last = found.steps
    writes = max(x["writes_unchanged"] for x in e.values())
    grads = finding.span([x["median_grad_norm"] for x in e.values()])
    updates = [x.get("median_update_to_weight") for x in e.values()]
    if all(u is None for u in updates):
        what = ""
    elif all(u == 0 for u in updates if u is not None):
        what = " The optimizer applied an update of exactly 0 to every layer."
    else:
        known = [u for u in updates if u]
        what = (
            f" The optimizer computed updates (||update|| / ||weights|| {min(known):.2g}-{max(known):.2g}), but the "
            "weights the next steps saw were the old ones: the updated weights were not kept."
            if known
            else ""
        )
    n = len(found.layers)
    every = "every layer" if n > 1 else "the one layer"
    return (
        f"No weights move: {every} that gets a gradient ({finding.name_list(found.layers, quote)}; gradient norm "
        f"{grads}) kept exactly the same weights over {writes} writes, steps {first}-{last}, so nothing is "
        f"learned.{what} Expected an update after each backward pass: optimizer.step() called (in PyTorch, "
        "after write()), the new parameters kept (JAX: params, opt_state = train_step(params, opt_state, ...)), "
        "apply_gradients called (TensorFlow), a learning rate large enough to change float32 weights."
    )
