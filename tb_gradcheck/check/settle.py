"""Settling what float32 leaves open: the rows a check did not convict, re-checked on the float64 twin; numpy only.

A float32 check resolves a directional derivative to ~0.3% (its error bar
is ~14 sqrt(u), u = 6e-8) against a 1% tolerance. Its two verdicts short of
a conviction say little at the twin's scale: "inconclusive" decides nothing,
and "ok" bounds the error along the probed directions at 1%, so a bug
confined to part of a layer (one of 48 rows 1.3x too large: ~0.1% along the
gradient) is "ok" in float32 at some seeds. The float64 twin of the same
model (the same weights, widened exactly, on the same batch) resolves ~1e-7
and its tolerance is 4.3e-7 (``algorithm.default_tolerance``). A conviction
in float32 stands at any finer tolerance; an "ok" does not. So ``settle``
runs the twin's check on exactly the rows the first check did not convict
(``open_rows``), with the same seed and number of probes, and puts the
twin's row (verdict, derivatives, error bar, power, location) in their
place, marked ``float64_recheck="float64"``. An "ok" row the twin cannot
decide either (a kink at the point in both) keeps float32's "ok", a true
claim at its own tolerance. Convicted rows are not touched.

Cost: the twin's check of those rows: 9 loss evaluations (the loss, then 8
for its noise), the rows' probes (4 each: 4 x probes, plus 4 for a zero-set
probe where the gradient has exact zeros, plus confirmation and bisection
where it convicts), and one backward pass; the framework may add the
float32-gap comparison (``float32_gap``: one loss, 8 noise evaluations and
one backward pass of the model). On a correct model that is about the cost
of a second check; ``dtype="float32"`` is the first check alone.

Where the twin cannot run (a model too large to copy in float64, a custom
op bound to float32, a closure over the model that cannot be rebuilt on a
copy), the inconclusive rows stay inconclusive, marked ``"unavailable"``,
with the reason after their own, and "ok" rows keep float32's verdict; the
check itself never fails for it.

A framework supplies only ``recheck``: ``only -> the twin's report over those
rows`` (``tb_gradcheck.torch.check``, ``tb_gradcheck.jax.check``,
``tb_gradcheck.tensorflow.fit_check``); this module decides which rows and
merges the answer.
"""

import dataclasses

from tb_gradcheck.check.report import INCONCLUSIVE
from tb_gradcheck.check.report import MISMATCH
from tb_gradcheck.check.report import OK
from tb_gradcheck.check.report import RECHECKS

NONE, FLOAT64, UNAVAILABLE = RECHECKS
# The float64 twin holds two copies' worth of float64 parameters and buffers
# (its weights, and the evaluator's saved values) beside the model's own; a
# twin that would take more than this share of the free memory is not made,
# so that the re-check never takes down the job it serves.
MEMORY_SHARE = 0.5


class TwinUnavailable(Exception):
    """The float64 twin cannot be made or run; the message says why, as a clause ("a float64 copy needs ...")."""


def open_rows(report):
    """The rows ``report`` did not convict, as ``{(granularity, name)}`` (what ``algorithm.run``'s ``only`` takes)."""
    return frozenset((r.granularity, r.name) for r in report.rows if r.status != MISMATCH)


def require_memory(needed, free, where):
    """Raises ``TwinUnavailable`` when a twin of ``needed`` bytes would take more than MEMORY_SHARE of ``free`` bytes.

    Args:
      needed: Bytes of the twin (its float64 parameters and buffers, and the
        check's float64 copy of the checked ones).
      free: Bytes free where the twin would live, or None when unknown
        (then nothing is refused: the attempt itself may still fail, and
        ``settle`` reports that).
      where: The device, for the message (``"cpu"``, ``"cuda:0"``).
    """
    if free is not None and needed > MEMORY_SHARE * free:
        raise TwinUnavailable(
            f"a float64 copy of the model needs {needed / 2**30:.3g} GiB, more than {MEMORY_SHARE:.0%} of the "
            f"{free / 2**30:.3g} GiB free on {where}"
        )


def settle(report, recheck):
    """``report`` with the rows it did not convict decided by the float64 twin where the twin can run.

    Args:
      report: The ``GradientCheckReport`` of the model in its own dtype.
      recheck: ``recheck(only)`` -> the twin's ``GradientCheckReport`` over
        the rows ``only`` (a set of ``(granularity, name)``), with the same
        seed and probes; raises ``TwinUnavailable`` (or anything else, from
        the twin's own evaluation: a custom op that refuses float64) when
        it cannot. The model's parameters, buffers, random state and mode are
        the framework's to leave as they were.

    Returns:
      The merged ``GradientCheckReport``: re-checked rows are the twin's,
      marked ``float64_recheck="float64"`` (an "ok" row the twin leaves
      undecided keeps its own), or, when the twin could not run, the
      report's own, the inconclusive ones marked ``"unavailable"`` with the
      reason; the evaluations are both checks'; a note says what was
      re-checked.
    """
    only = open_rows(report)
    if not only or report.dtype == FLOAT64:
        return report  # nothing open, or already float64: no finer twin to ask
    try:
        twin = recheck(only)
    except Exception as e:  # noqa: BLE001 - the twin failing must not fail the check it settles
        why = str(e) if isinstance(e, TwinUnavailable) else f"evaluating it raised {type(e).__name__}: {e}"
        reason = f"the float64 twin could not re-check it: {why}"

        def mark(row):
            if row.status != INCONCLUSIVE:
                return row
            return dataclasses.replace(row, float64_recheck=UNAVAILABLE, reason=f"{row.reason}; {reason}")

        undecided = sum(r.status == INCONCLUSIVE for r in report.rows)
        note = (
            f"{undecided} inconclusive and {len(only) - undecided} ok rows were not re-checked in float64 (an ok "
            f"is then {report.dtype}'s, within its tolerance {report.tolerance:.2g}): {why}"
        )
        return _merged(report, mark, report.evaluations, report.notes + (note,))
    by_key = {(r.granularity, r.name): r for r in twin.rows}

    def take(row):
        settled = by_key.get((row.granularity, row.name))
        if settled is None or (row.status == OK and settled.status == INCONCLUSIVE):
            return row  # not asked, or an ok the twin cannot sharpen: float32's claim still holds
        return dataclasses.replace(settled, float64_recheck=FLOAT64)

    note = (
        f"{len(by_key)} rows {report.dtype} did not convict were re-checked on the float64 twin "
        f"(tolerance {twin.tolerance:.2g}, {twin.evaluations} more loss evaluations); their verdicts are the twin's"
    )
    return _merged(report, take, report.evaluations + twin.evaluations, report.notes + twin.notes + (note,))


def _merged(report, change, evaluations, notes):
    layers = tuple(change(r) for r in report.layers)
    variables = None if report.variables is None else tuple(change(r) for r in report.variables)
    return dataclasses.replace(report, layers=layers, variables=variables, evaluations=evaluations, notes=notes)
