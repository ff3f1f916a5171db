"""Findings about what the optimizer did: clipping that binds, layers that do not learn, gradients never cleared; numpy only.

Rules over the optimizer columns (``tb_gradcheck.tensorflow.optimizer``) of a run's
layer-granularity stats matrix, called by ``diagnose.find``. A run without
those columns gets no finding from here.
"""

import dataclasses

import numpy as np

from tb_gradcheck.findings import finding
from tb_gradcheck.findings import still
from tb_gradcheck.findings import uncleared
from tb_gradcheck.findings import windows

KINDS = ("clipping", "not_learning", uncleared.KIND)


@dataclasses.dataclass(frozen=True)
class OptimizerThresholds:
    """When the optimizer's behaviour becomes a finding. ``diagnose.Thresholds`` fields of the same names win.

    Attributes:
      clip_tolerance: A layer's applied gradient norm below
        ``(1 - clip_tolerance)`` x its norm before clipping means clipping
        bound it at that step. 1e-3: clipping rescales in float32, which
        moves a norm by a few 1e-7 relative when nothing binds, and a bound
        that trims less than 0.1% of the gradient changes nothing worth
        reporting.
      clip_fraction: Clipping bound in at least this fraction of the written
        steps is a finding. 0.1: a clipping norm is meant to catch the rare
        outlier step (people set it near a high quantile of the norms seen
        in a healthy run); binding in one step in ten or more means the
        bound sits inside the ordinary range of norms, where it silently
        lowers the learning rate and hides a growing gradient as the clip
        norm. Information once it has stopped binding, early in the run
        (``finding.settle_ended``): an early transient that has ended.
      clip_drivers: The layers named as driving the norm over the bound are
        the fewest whose squared norms before clipping make up this share of
        the total over the bound steps. 0.5: those layers alone put the
        global norm over the bound more than the rest together.
      not_learning_floor: An update_to_weight below this moves (almost) no
        weight. 1e-7: float32 resolves a weight to about 2**-24 = 6e-8 of its
        magnitude, so an update of relative size below ~1e-7 rounds away in
        most elements (the measured update, w_after - w_before, is then 0 or
        a few scattered ulps).
      not_learning_orders: A layer whose update_to_weight sits this many
        orders of magnitude below the median of the other layers' at the same
        step does not learn at their pace. 3: the usual healthy ratio is near
        1e-3 per step, and layers of one healthy network stay within one or
        two orders of each other; a thousandfold gap means the layer's
        weights are effectively frozen while the rest train.
      not_learning_persistence: Fraction of a layer's steps (those in which
        some layer moved: a refused loss-scale step moves none) a condition
        must hold. 0.5: "most steps", as for vanishing gradients.
      slow_pace: The whole network does not learn when its pace (the median
        layer's update_to_weight, as a median over ``slow_pace_writes``
        writes) has never reached this. 1e-6: three orders below the usual
        healthy ~1e-3 per step, as ``not_learning_orders`` measures a layer
        against the others; at 1e-6 a weight needs 10,000 steps to change by
        1% of its size, so the learning rate is too small for the model
        (every layer equally slow, so none lags the rest, and above the
        float32 floor, so each does move). "Never": a run that learned and
        then slowed (a decayed learning rate, a converged loss) is not slow.
      slow_pace_writes: Writes the pace is a median over, and the least a
        run must have before it is called slow. 20: the trailing window the
        other slow rules use; one large first step moves no median of 20.
      slow_pace_spread: A layer shares the slow network's verdict only
        while its own pace (the same trailing median, of its own
        update_to_weight) has never reached ``slow_pace`` times 10 to this
        power. 1 order: layers that share one learning rate spread around
        the network's pace by factors of a few (those of one healthy network
        stay within one or two orders of each other), so a layer within an
        order of the bound is at the network's pace; one that moves ten
        times the bound or more is not held back by the learning rate, and
        "a learning rate too small" would be false of it.
      vanishing_ratio: A layer whose ||g|| / ||W|| is below this is vanishing
        whatever the other layers do. 6e-8, float32's half-ulp (2**-24): an
        SGD step lr * g with lr <= 1 then changes the weights by less than
        float32 can represent, so they do not move at all. Relative to the
        weights, so it holds at any weight scale. Where the run records the
        update it made (``update_to_weight``), that premise is measured
        instead: an update at or above ``not_learning_floor`` moved them
        (Adam's step is about lr per element whatever |g| is), and one
        within ``not_learning_orders`` of the other layers' median went
        where the learning rate took every layer
        (``vanishing._still_while_others_move``). Read here
        too: an update of exactly 0 is float32's only where the gradient
        is under this (``_frozen``).
    """

    clip_tolerance: float = 1e-3
    clip_fraction: float = 0.1
    clip_drivers: float = 0.5
    not_learning_floor: float = 1e-7
    not_learning_orders: float = 3.0
    not_learning_persistence: float = 0.5
    slow_pace: float = 1e-6
    slow_pace_writes: int = 20
    slow_pace_spread: float = 1.0
    vanishing_ratio: float = 6e-8


def find(run, stats, thresholds=None, dead=(), outside_optimizer=(), not_cleared_after=None):
    """The optimizer findings of one run.

    Args:
      run: Run name.
      stats: ``store.Matrix`` of kind stats at layer granularity.
      thresholds: ``diagnose.Thresholds`` or ``OptimizerThresholds`` (fields
        this module knows are read by name), or None for the defaults.
      dead: Names of layers already found dead. Their units get no gradient,
        so they do not move either: that is one cause, reported once, as
        dead, not again as ``not_learning``.
      outside_optimizer: Names of layers with a gradient that no parameter
        group of the optimizer holds (the writer saw the groups and stored
        it): a ``not_learning`` warning of their own, naming them, where
        the numbers alone would say "frozen by the optimizer".
      not_cleared_after: None, or the last step before the writer saw the
        gradients go uncleared between steps (``uncleared.find``).

    Returns:
      A list of ``finding.Finding`` (kinds ``KINDS``).
    """
    t = _thresholds(thresholds)
    if stats is None or not len(stats.steps):
        return []
    found = still.find(run, stats, t, _not_learning(run, stats, t, set(dead), set(outside_optimizer)))
    return _clipping(run, stats, t) + found + uncleared.find(run, stats, not_cleared_after)


def _thresholds(given):
    if isinstance(given, OptimizerThresholds):
        return given
    names = [f.name for f in dataclasses.fields(OptimizerThresholds)]
    return OptimizerThresholds(**{n: getattr(given, n) for n in names if given is not None and hasattr(given, n)})


def _clipping(run, stats, t):
    before, before_missing = finding.last_slab(stats, "grad_norm_before_clip")
    applied, applied_missing = finding.last_slab(stats, "grad_norm")
    if before is None:
        return []
    here = ~before_missing & ~applied_missing & np.isfinite(before) & np.isfinite(applied)
    bound = here & (applied < before * (1.0 - t.clip_tolerance))
    steps_here = here.any(axis=1)
    steps_bound = bound.any(axis=1)
    if not steps_here.any():
        return []
    fraction = steps_bound.sum() / steps_here.sum()
    if fraction < t.clip_fraction:
        return []
    # The layers that put the norm over the bound: the fewest whose squared
    # norms before clipping hold most of the total over the bound steps.
    energy = np.where(bound, before**2, 0.0).sum(axis=0)
    order = np.argsort(-energy)
    share = np.cumsum(energy[order]) / max(energy.sum(), np.finfo(float).tiny)
    drivers = sorted(order[: int(np.searchsorted(share, t.clip_drivers)) + 1])
    evidence = {}
    for j in drivers:
        steps = stats.steps[bound[:, j]]
        if not len(steps):
            continue
        ratio = applied[bound[:, j], j] / before[bound[:, j], j]
        evidence[stats.rows[j]] = {
            "share_of_squared_norm": float(energy[j] / energy.sum()),
            "median_norm_before_clip": float(np.median(before[bound[:, j], j])),
            "median_applied_over_before": float(np.median(ratio)),
            "steps_bound": len(steps),
            "fraction_of_steps": float(fraction),
            "first_step": int(steps[0]),
            "last_step": int(steps[-1]),
        }
    if not evidence:
        return []
    names = list(evidence)
    # Clipping that bound only while the network left its initialisation
    # (a run's largest gradients are usually its first) and not since is
    # history: information, by the rule every finding shares
    # (``finding.settle_ended``). Binding that goes on is a warning.
    for e in evidence.values():
        e["run_steps_bound"] = int(steps_bound.sum())
        e["run_steps_written"] = int(steps_here.sum())
    steps = [min(e["first_step"] for e in evidence.values()), max(e["last_step"] for e in evidence.values())]
    f = finding.Finding("clipping", "warning", run, names, steps, "grad_norm_before_clip", "last", "", evidence)
    f.message = describe(f)
    return [f]


def _not_learning(run, stats, t, dead, outside=frozenset()):
    ratio, missing = finding.last_slab(stats, "update_to_weight")
    if ratio is None:
        return []
    here = ~missing & np.isfinite(ratio)
    grad, no_gradient = finding.last_slab(stats, "grad_norm")
    if no_gradient is not None:
        # A layer the loss does not reach (a head without a loss, a branch
        # not in use) gets no gradient, so it moves 0. That is no finding,
        # with the update measured or not: the gradient columns say the same.
        here &= ~no_gradient
    # A step in which nothing moved (a refused loss-scale step, a zero
    # learning rate) says nothing about any one layer.
    moving = (here & (ratio > 0)).any(axis=1)
    here &= moving[:, None]
    to_weight, _ = finding.last_slab(stats, "grad_to_weight")
    frozen = _frozen(ratio, here, grad, no_gradient, to_weight, t)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratio = np.where(here, np.log10(ratio), np.nan)  # 0 -> -inf: no update at all
    slow, pace = _slow_network(ratio, here, t)
    others = windows.median_of_others(log_ratio)  # each layer's yardstick: the other layers' median
    weights, no_weights = finding.last_slab(stats, "weight_norm")
    evidence, unheld, held = {}, {}, {}
    for j, name in enumerate(stats.rows):
        present = here[:, j]
        if not present.any():
            continue
        # Wholly outside (its update 0), yet its weights moved: by something this run does not follow (_moved).
        if name in outside and not ratio[present, j].any() and _moved(weights, no_weights, j):
            continue
        # Outside the groups (the writer saw it, so no "intended freeze";
        # a layer only some of whose parameters are left out is named too).
        if name in outside or (frozen[j] and name not in dead):
            steps = stats.steps[present]
            (unheld if name in outside else held)[name] = {
                "median_update_to_weight": float(np.median(ratio[present, j])),
                "median_grad_norm": float(np.median(grad[present, j])),
                "first_step": int(steps[0]),
                "last_step": int(steps[-1]),
                "reason": OUTSIDE if name in outside else FROZEN,
            }
            continue
        if name in dead:
            continue
        network = _slow_evidence(ratio[:, j], present, slow, pace, stats.steps, t)
        below_floor = present & (ratio[:, j] < t.not_learning_floor)
        gap = others[:, j] - log_ratio[:, j]  # NaN where no other layer moved (a one-layer model: always)
        behind = present & np.isfinite(others[:, j]) & (gap > t.not_learning_orders)
        sick = below_floor | behind
        fraction = sick.sum() / present.sum()
        if fraction < t.not_learning_persistence:
            if network is not None:
                evidence[name] = network
            continue
        steps = stats.steps[sick]
        finite_gap = gap[behind][np.isfinite(gap[behind])]
        evidence[name] = {
            "median_update_to_weight": float(np.median(ratio[present, j])),
            "median_orders_below_other_layers": float(np.median(finite_gap)) if len(finite_gap) else None,
            "fraction_of_steps": float(fraction),
            "first_step": int(steps[0]),
            "last_step": int(steps[-1]),
            "reason": finding.BELOW_FLOAT32 if below_floor.sum() >= behind.sum() else finding.BEHIND_OTHERS,
        }
    out = []
    for severity, found in (("warning", evidence), ("warning", unheld), ("info", held)):
        if not found:
            continue
        steps = [min(e["first_step"] for e in found.values()), max(e["last_step"] for e in found.values())]
        f = finding.Finding("not_learning", severity, run, list(found), steps, "update_to_weight", "last", "", found)
        f.message = describe(f)
        out.append(f)
    return out


def _moved(weights, missing, j):
    """Whether layer ``j``'s weights changed between writes (stored norms): another optimizer (a GAN's other
    network), an EMA or a hand-written update moved it. Unmoved weights give the same norm bit for bit at every
    write; a change above 1e-6 of it (eight roundings of the stored float32) is movement."""
    if weights is None:
        return False
    norms = weights[~missing[:, j] & np.isfinite(weights[:, j]), j]
    return len(norms) > 1 and float(norms.max() - norms.min()) > 1e-6 * float(norms.max())


# The reason of a layer the optimizer does not update (``_frozen``); a layer no group holds has ``finding.OUTSIDE``.
FROZEN = "frozen by the optimizer"
OUTSIDE = finding.OUTSIDE


def _frozen(ratio, here, grad, no_gradient, to_weight, t):
    """bool ``[L]``: layers the optimizer does not update: a gradient float32 resolves, an update of exactly 0 at every write.

    Not a precision problem: float32 rounds a step away element by element,
    each against its own weight's ulp, and a trained or freshly initialised
    tensor holds elements near 0 whose ulp is far below any nonzero step, so
    a step that is not 0 moves some element and its update is not exactly 0.
    An update of exactly 0 in every write while the gradient is not 0 means
    the optimizer applied no step to the layer: a freeze (``optax.set_to_zero``,
    a learning rate of 0 for its group) or a parameter group that misses it.
    The numbers cannot tell those apart. A layer with a gradient of exactly 0
    is no part of this: no gradient moves nothing (the dead rule's case).

    A gradient under float32's resolution of the weights
    (``grad_to_weight`` below ``vanishing_ratio``) can round away whole: no
    SGD step with a learning rate up to 1 moves even the smallest elements
    by much. There the 0 may be float32's, so such a layer is left to the
    float32 reason (and to vanishing). One step that is not 0 can round away
    whole on a tensor whose elements all equal one constant (a norm's scale
    of 1) too; the learning rate that does it moves the other layers under
    the float32 floor or the slow pace, and those findings say so.
    """
    if grad is None or to_weight is None:
        return np.zeros(ratio.shape[1], bool)
    with np.errstate(invalid="ignore"):
        live = here & ~no_gradient & np.isfinite(grad) & (grad > 0) & (to_weight >= t.vanishing_ratio)
    still = np.where(live, ratio == 0, True)
    return live.any(axis=0) & still.all(axis=0) & (live == here).all(axis=0)


def _slow_network(ratio, here, t):
    """``(slow [S] bool, pace [S])``: the writes at which the whole network has never learned at ``slow_pace``.

    The pace at a write is the median update_to_weight of the layers that
    move there (an update above 0), as a median over the ``slow_pace_writes``
    writes that end at it. Layers that do not move at all (frozen by the
    optimizer, dead, cut off from the loss) are left out: the rule is about
    a learning rate too small for layers that are trained, and a network
    whose frozen backbone outnumbers its trained head would otherwise have a
    pace of 0. It is judged once that many writes have moved, against the
    largest pace so far, so the slow writes are the run's first ones, up to
    where it speeds up.
    """
    per_write = windows.nanmedian(np.where(here & (ratio > 0), ratio, np.nan), axis=1)  # [S], NaN where none moved
    pace = windows.through(per_write[:, None], t.slow_pace_writes, windows.nanmedian)[:, 0]
    best = np.maximum.accumulate(np.where(np.isnan(pace), -np.inf, pace))
    seen = np.cumsum(np.isfinite(per_write)) >= t.slow_pace_writes
    return seen & (best < t.slow_pace), pace


def _slow_evidence(ratio, present, slow, pace, steps, t):
    """A layer's evidence of the whole network's slow pace, or None when the network is not slow or the layer is not.

    The layer must be slow itself: its own pace, measured as the network's,
    never reached ``slow_pace_spread`` orders above ``slow_pace``.
    """
    own = windows.through(np.where(present, ratio, np.nan)[:, None], t.slow_pace_writes, windows.nanmedian)[:, 0]
    best = np.maximum.accumulate(np.where(np.isnan(own), -np.inf, own))
    flagged = slow & present & (best < t.slow_pace * 10.0**t.slow_pace_spread)
    if not flagged.any():
        return None
    return {
        "median_update_to_weight": float(np.median(ratio[present])),
        "median_orders_below_other_layers": None,
        "network_pace": float(np.nanmax(pace[flagged])),
        "fraction_of_steps": float(flagged.sum() / present.sum()),
        # From the run's first write: the pace was never higher.
        "first_step": int(steps[np.argmax(present)]),
        "confirmed_at_step": int(steps[flagged][0]),
        "last_step": int(steps[flagged][-1]),
        "reason": f"the whole network moves under {t.slow_pace:g} of its weights per step: "
        "a learning rate too small for it",
    }


def describe(found, quote=None):
    """The sentence of a ``clipping`` or ``not_learning`` finding, names passed through ``quote`` (``diagnose.describe``)."""
    if found.kind == uncleared.KIND or still.ours(found):
        return (uncleared if found.kind == uncleared.KIND else still).describe(found, quote)
    quote = quote or finding.isolate
    e = found.evidence
    names = finding.name_list(found.layers, quote)
    if found.kind == "clipping":
        first = next(iter(e.values()))
        return (
            f"Clipping bound in {first['fraction_of_steps']:.0%} of steps ({first['run_steps_bound']} of "
            f"{first['run_steps_written']}); {names} drove the norm over the bound (applied/before median "
            f"{min(x['median_applied_over_before'] for x in e.values()):.2g})."
        )
    if all(x["reason"] == OUTSIDE for x in e.values()):
        one = len(found.layers) == 1
        verb, them, their, they = (
            ("gets", "it", "its", "it never moves") if one else ("get", "them", "their", "they never move")
        )
        return (
            f"{names} {verb} a gradient (norm {finding.span([x['median_grad_norm'] for x in e.values()])}) but no parameter "
            f"group of the optimizer holds {them} (or some of {their} parameters): {they}, steps "
            f"{found.steps[0]}-{found.steps[1]}. Pass {them} to the optimizer (or add_param_group), or set "
            f"requires_grad=False to freeze {them}."
        )
    if found.severity == "info":
        return (
            f"{names} frozen by the optimizer: gradient norm {finding.span([x['median_grad_norm'] for x in e.values()])} "
            f"but an update of exactly 0 at every step, steps {found.steps[0]}-{found.steps[1]}: an intended freeze "
            "(a learning rate of 0, optax.set_to_zero), or a parameter group that misses it, which a PyTorch "
            "writer given the optimizer reports apart (information, not a problem if meant)."
        )
    medians = [x["median_update_to_weight"] for x in e.values()]
    return (
        f"{names} not learning: ||update|| / ||weights|| {min(medians):.2g}"
        + (f"-{max(medians):.2g}" if len(medians) > 1 else "")
        + f" in most steps ({'; '.join(sorted({x['reason'] for x in e.values()}))})."
    )
