"""Numeric-vs-analytic gradient check per layer for TensorFlow: directional derivatives by central differences.

``check_gradients`` compares, for each layer (grouped as the writer groups
them, see ``Rows``) and optionally each variable, the analytic
directional derivative <g, d> from one backward pass with a numeric one from
central differences of the loss along the same direction d. The algorithm
and its numerics live in ``check.algorithm`` (written once, for every framework);
this module validates TensorFlow's arguments, turns TensorFloat-32 off, and
runs it on a ``Evaluator`` (tracing, snapshot, restoration).
PyTorch's front is ``tb_gradcheck.torch.check_gradients``.

Nothing is lost: every variable the loss reads is snapshot before the first
evaluation and restored bit for bit in a ``finally``, also when ``loss_fn``
raises. This module does no I/O; ``GradientWriter.write_check`` writes reports.
"""

import warnings

import tensorflow as tf

from tb_gradcheck.check import algorithm
from tb_gradcheck.check import settle
from tb_gradcheck.check.algorithm import DEFAULT_PROBES
from tb_gradcheck.check.algorithm import DEFAULT_TOLERANCE  # noqa: F401  (public here, as before)
from tb_gradcheck.check.algorithm import default_tolerance  # noqa: F401  (public here, as before)
from tb_gradcheck.check.report import INCONCLUSIVE
from tb_gradcheck.check.report import MISMATCH
from tb_gradcheck.check.report import OK
from tb_gradcheck.check.report import STATUSES
from tb_gradcheck.check.report import CheckRow
from tb_gradcheck.check.report import GradientCheckReport
from tb_gradcheck.check.report import Probe
from tb_gradcheck.core import validate
from tb_gradcheck.tensorflow import float64_twin
from tb_gradcheck.tensorflow.evaluator import Evaluator
from tb_gradcheck.tensorflow.evaluator import tf_variable
from tb_gradcheck.tensorflow.variables import Rows
from tb_gradcheck.tensorflow.variables import checked_variables

__all__ = ["INCONCLUSIVE", "MISMATCH", "OK", "STATUSES", "CheckRow", "GradientCheckReport", "Probe", "check_gradients"]


def check_gradients(
    loss_fn,
    variables,
    *,
    dtype=None,
    twin=None,
    probes=DEFAULT_PROBES,
    epsilon=None,
    seed=None,
    granularity="layer",
    tolerance=None,
    thorough=False,
):
    """Checks the analytic gradient of ``loss_fn`` against central differences, per layer.

    Example:

        report = tb_gradcheck.check_gradients(
            lambda: loss_object(y, model(x, training=False)), model.trainable_variables, seed=0)
        print(report)          # one row per layer
        assert report.ok, report.failures

    Args:
      loss_fn: Zero-argument callable returning a scalar floating-point loss
        that reads ``variables``; a ``tf.function`` is used as it is, any
        other callable is traced with ``tf.function`` for this call (as
        Keras's ``fit`` does), or evaluated eagerly if it cannot be traced.
        It must be deterministic: call Keras models with ``training=False``,
        or fix the seeds of dropout.
      variables: The variables to check (for a Keras model,
        ``model.trainable_variables``), grouped into layers as
        ``GradientWriter`` groups them.
      dtype: None (default) or ``"float32"``. None re-checks the rows the
        check does not convict (inconclusive, or ok only within float32's
        1%) on the float64 twin given as ``twin``
        (``tb_gradcheck.check.settle``: their verdict, error and power are
        then the twin's, ``CheckRow.float64_recheck == "float64"``); without
        ``twin`` they keep their own, the inconclusive ones marked
        ``"unavailable"``, with the reason. ``"float32"``: the check of ``loss_fn`` alone, as it was.
      twin: None (default), or ``(twin_loss_fn, twin_variables)``: the same
        loss of a float64 twin of the model (``tb_gradcheck.keras.float64_twin``,
        its weights copied by ``sync_twin`` before the call) and its
        variables, position by position ``variables``. Only read when some
        row is not convicted; the model's own gradient is then also held against
        the twin's on those rows (``float64_twin.float32_gap``).
      probes: Int, default 3. Directions per row: the first along the row's
        analytic gradient, the rest random. Each costs 4 loss evaluations.
        A row whose analytic gradient has exact zeros (a cut path, a dead
        unit, an unused embedding row) also gets a probe over those elements,
        where the analytic derivative is zero: a numeric one resolved there
        is a mismatch once confirmed (4 evaluations, 12-16 more when it
        disagrees).
      epsilon: Float or None (default). The finite-difference step as a
        fraction of the row's scale: the norm of its parameters, or sqrt(n)
        times the RMS of all checked parameters if that is larger (so a bias
        near zero is not probed with a vanishing step). None chooses the step
        per probe from the measured noise and the size of the derivative.
      seed: Int or None (default). Seed of the random directions; the same
        seed on the same state gives the same report. None draws one, which
        the report records.
      granularity: ``"layer"`` (default) checks each layer along joint
        directions; ``"variable"`` also checks every variable on its own.
      tolerance: Float or None (default). Relative error above which a
        resolved difference is reported as a mismatch. None: 0.01 when the
        loss or a checked variable is float32 or coarser, 4.3e-7 when all are
        float64 (the same three error bars; see ``default_tolerance``).
      thorough: Bool, default False. Also probe every variable block by
        block (blocks of at most 64 elements), each along a direction
        orthogonal to the block's gradient, so an error confined to a few
        elements is not drowned by the rest of the row: one element of a
        4,096-parameter float32 kernel wrong by 100% is caught at >= 95% of
        seeds. Cost: 4 more loss evaluations per block, i.e. about
        n / 16 for n parameters (compute_gradient makes 2 n), plus 12-16 per
        block that disagrees. No false mismatch was seen over the clean
        models of benchmarks/check_power.py.

    A row that is a mismatch is then narrowed by bisection along the
    convicting direction to the variable, rows, columns or element at fault
    (``CheckRow.location``): 4 evaluations per halving, at most ~4 log2(n).

    TensorFloat-32 execution (on by default on recent NVIDIA GPUs) is turned
    off during the check, so float32 models are checked in float32, and put
    back as it was.

    Returns:
      A ``GradientCheckReport``.

    Raises:
      TypeError: ``loss_fn`` is not callable or does not return a
        floating-point tensor; ``variables`` hold something else than
        floating-point variables; an argument has the wrong type.
      ValueError: An empty or repeated variable list, a non-scalar loss, an
        argument out of range, or a call inside ``tf.function``.
      Anything ``loss_fn`` raises, after every variable has been restored.
    """
    if tf.inside_function():
        raise ValueError(
            "Expected check_gradients to be called eagerly, outside tf.function (it compares concrete loss "
            "values). Received: a call while tracing a tf.function"
        )
    if not callable(loss_fn):
        raise TypeError(f"Expected `loss_fn` to be a zero-argument callable. Received: {type(loss_fn).__name__}")
    opts = algorithm.options(probes, epsilon, seed, granularity, tolerance, thorough)
    dtype = validate.one_of(dtype, "dtype", (None, "float32"))
    if twin is not None and (not isinstance(twin, (tuple, list)) or len(twin) != 2 or not callable(twin[0])):
        raise TypeError(f"Expected `twin` to be a pair (twin_loss_fn, twin_variables). Received: {type(twin).__name__}")
    report = run(loss_fn, variables, opts)
    if dtype is None:
        report = settle.settle(report, lambda only: _recheck(loss_fn, variables, twin, opts, only))
    return report


def _recheck(loss_fn, variables, twin, opts, only):
    """The twin's report over the rows ``only`` (``settle``'s ``recheck``), or why there is none."""
    if twin is None:
        raise settle.TwinUnavailable(
            "check_gradients(loss_fn, variables) has no model to copy in float64; pass twin=(its loss on a float64 "
            "twin, the twin's variables), e.g. from tb_gradcheck.keras.float64_twin"
        )
    twin_loss_fn, twin_variables = twin
    report = run(twin_loss_fn, twin_variables, opts, only)
    if any(tf_variable(v).dtype != tf.float32 for v in variables):
        return report  # float16 or bfloat16 arithmetic is inexact by design; float64 is the twin's own
    return float64_twin.float32_gap(report, loss_fn, variables, twin_loss_fn, twin_variables)


def run(loss_fn, variables, opts, only=None):
    """``check_gradients`` with its options validated (``algorithm.Options``), over the rows ``only`` or all.

    The float64 re-check of the rows a float32 check left open
    (``tb_gradcheck.check.settle``) runs the twin's check through here.
    """
    variables = checked_variables(variables)  # non-empty, distinct, floating-point variables
    rows = Rows(variables)
    checked = [tf_variable(v) for v in variables]
    # On Ampere and newer GPUs TensorFlow runs float32 matmuls and
    # convolutions in TensorFloat-32 by default: inputs rounded to 10 mantissa
    # bits (relative 2**-11 = 4.9e-4), coarser than a float32 step of sqrt(u)
    # = 2.4e-4, so most perturbed weights would not change inside the matmul
    # and the difference would not be a derivative at all. That rounding is
    # not a gradient bug: the check runs in true float32 and puts the
    # caller's setting back afterwards (a no-op without such a GPU).
    tf32 = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        evaluator = Evaluator(loss_fn, checked)
        try:
            report = algorithm.run(evaluator, rows, opts, only)
        finally:
            changed = evaluator.restore_all()
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(tf32)
    if changed:
        warnings.warn(
            "loss_fn changed variables other than the ones checked "
            f"({', '.join(sorted(changed))}), e.g. BatchNormalization moving statistics in training mode; "
            "check_gradients restored them bit for bit. Call the model with training=False in loss_fn "
            "to check the inference-mode gradient without this.",
            stacklevel=3,
        )
    return report
