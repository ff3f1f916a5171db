"""One step's passes over each gradient: the per-variable reductions behind ``tb_gradcheck.tensorflow.statistics``.

Each reduction is the cheapest exact form for where the step runs, since
these passes are the writer's whole per-step cost:

- in a graph step (``graph_partials``, ``gather``), one fused op per
  statistic and variable, cast and combined once for all variables, the rare
  cases (a non-finite element, a sum of squares out of float32's band)
  behind one cond;
- in an XLA-compiled step (``compiled_columns``), the same numbers with no
  cond, the sums in the form XLA runs fast (``tb_gradcheck.tensorflow.full_sums``).

``stats`` lays their results out as the layer and variable rows.
"""

import numpy as np
import tensorflow as tf

from tb_gradcheck.tensorflow import branches
from tb_gradcheck.tensorflow import full_sums
from tb_gradcheck.tensorflow import units

# float32 squares of values below ~1e-19 underflow and above ~1e19 overflow,
# so a plain sum of squares would report a vanishing gradient as 0 and a large
# finite one as Inf. When the quick sum lands outside this band, the norm is
# recomputed as max|g| * ||g / max|g|||, which cannot under- or overflow.
_SUMSQ_LOW = 1e-30
_SUMSQ_HIGH = 1e30


def tensor_norms(values, compiled=False):
    """float64 L2 norm of each tensor of ``values`` (float32 or float64), exact at any scale.

    Used for the weights, whose max |w| is not reported: outside XLA it is
    computed only on the rare out-of-band path, and there for every tensor
    at once.
    """
    if compiled:
        return compiled_norms(values)
    sumsq = units.joined64([tf.nn.l2_loss(v) for v in values], tf.stack) * 2.0
    suspicious = (sumsq < _SUMSQ_LOW) | (sumsq > _SUMSQ_HIGH)
    return branches.cond(
        tf.reduce_any(suspicious),
        lambda: _robust_norms(values, sumsq, tf.stack([_max_abs(v) for v in values])),
        lambda: tf.sqrt(sumsq),
    )


def half_in_band(half_sumsq):
    """Where a quick sum of squares (given as half of it, ``l2_loss``'s) gives the exact norm.

    True where the sum is zero or inside float32's safe band (``_SUMSQ_LOW``,
    ``_SUMSQ_HIGH``); False for NaN and Inf, which a non-finite element
    makes of the sum. Halving the bounds is exact, so this is ``gather``'s
    test without the doubling.
    """
    return (half_sumsq <= _SUMSQ_HIGH / 2) & ((half_sumsq >= _SUMSQ_LOW / 2) | tf.equal(half_sumsq, 0.0))


def graph_partials(gradient, variable, unit_axes, full=True, known=None):
    """One gradient's dense values, half its sum of squares and (when full) per-unit max |g| and half its nonzero count.

    Each is one op (two for the count) in the values' dtype: the casts to
    float64 and the rest are done once for all variables by ``gather``,
    since on a CPU every small op costs microseconds whatever its size, and a
    per-variable op is paid once per variable.

    ``known``: the ``(values, half_sumsq)`` an earlier call with
    ``full=False`` made of the same gradient in this step (a window's write
    step: ``statistics.half_sums``), which are not made again.
    """
    shape = [int(d) for d in variable.shape]
    # These passes are the writer's whole per-step cost, so each is the
    # cheapest exact form TensorFlow has: l2_loss is one fused kernel (no
    # squared temporary), the per-unit max |g| is one reduction of an abs
    # (units.peaks), and the nonzero count is the cheap exact form of _half_nonzero.
    if known is None:
        values = _dense_values(gradient, shape, unit_axes)
        half_sumsq = tf.nn.l2_loss(values)
    else:
        values, half_sumsq = known
    if not full:
        return values, half_sumsq, None, None
    peak = units.peaks(values, int(np.prod(shape[len(shape) - unit_axes :])))
    return values, half_sumsq, peak, _half_nonzero(values, int(np.prod(shape)))


def _dense_values(gradient, shape, unit_axes):
    """The gradient's values as float32 or float64: the tensor itself, or a sliced gradient's distinct rows."""
    if isinstance(gradient, tf.IndexedSlices) and unit_axes >= len(shape):
        gradient = tf.convert_to_tensor(gradient)  # a sliced vector: its units are its rows
    if isinstance(gradient, tf.IndexedSlices):
        # Rows no slice touches are exact zeros of the dense gradient: they
        # add nothing to the sum of squares nor to the nonzero count.
        gradient, _ = _summed_slices(gradient)
    return as_float(gradient)


def compiled_columns(gradients, where, rows):
    """``gather``'s columns inside an XLA-compiled step: the same numbers, with no cond.

    Under XLA a cond is a computation of its own, and one that takes the
    gradients as operands keeps XLA from fusing around them: the rare-case
    cond of ``gather`` cost about 0.1x of a compiled 20-layer MLP step, more
    than the passes below. So the rare cases are covered at every step
    instead:

    - The sum of squares cannot under- or overflow (``compiled_norms``).
    - Non-finite elements are counted at every step (a count of a mask).
    - Nonzero elements are counted as ``g != 0``, which counts NaN as
      nonzero, as the graph path's recount does: no recount needed.
    """
    values = compiled_values(gradients, where, rows)
    peaks = [units.peaks(v, rows.variable_units[i]) for v, i in zip(values, where)]
    norms = compiled_norms(values)
    nonzero = tf.stack([full_sums.count(tf.not_equal(v, 0), compiled=True) for v in values])
    nonfinite = compiled_nonfinite(values)
    max_abs, dead_v, dead_l = units.fractions(peaks, where, rows)
    zeros = tf.constant([float(rows.variable_sizes[i]) for i in where], tf.float64) - nonzero
    return norms, max_abs, zeros, nonfinite, dead_v, dead_l


def compiled_values(gradients, where, rows):
    """The values (``_dense_values``) of the gradients at ``where``, which a compiled step reduces whole."""
    return [_dense_values(gradients[i], [int(d) for d in rows.variables[i].shape], rows.unit_axes[i]) for i in where]


def compiled_nonfinite(values):
    """float64 count of the non-finite elements of each tensor, with no cond (one count of a mask each)."""
    return tf.stack([_compiled_count(v) for v in values])


def _compiled_count(values):
    return full_sums.count(tf.logical_not(tf.math.is_finite(values)), compiled=True)


def compiled_flags(values, norms):
    """float64 per tensor, > 0 exactly where it has a non-finite element, read from its ``compiled_norms`` where it can be.

    A float32 (or narrower) element squared in float64 is at most 1.2e77, so
    that sum of squares is finite exactly when every element is: the flag
    costs no pass (between a window's writes, on the benchmark's MLP fit with
    XLA, the count's own pass was 0.03x of the step). A float64 element's
    square can overflow, so a float64 tensor is counted.
    """
    flags = [
        tf.cast(tf.logical_not(tf.math.is_finite(norms[k])), tf.float64) if v.dtype.size <= 4 else _compiled_count(v)
        for k, v in enumerate(values)
    ]
    return tf.stack(flags)


def compiled_norms(values):
    """float64 L2 norm of each tensor in a compiled step, with no cond and no under- or overflow that shows.

    The squares are taken in float64. A float32 square there can neither
    underflow nor overflow. A float64 square can, but only for elements
    below 1e-154 or above 1e154, and a norm made of such elements is 0 or
    Inf in the float32 it is stored as whichever way it is computed.
    """
    return tf.sqrt(tf.stack([full_sums.sumsq64(v, compiled=True) for v in values]))


def gather(parts, where, rows):
    """Per-variable norms, max |g|, zero and non-finite counts, dead-unit fractions; per-layer dead fractions.

    ``where`` are the indices (into ``rows``) of the variables in ``parts``.
    The per-unit vectors of all variables are concatenated and reduced with
    segment ops on static segment ids, so the op count does not grow with
    the number of variables.
    """
    values, half_sumsq, peak, nonzero = (list(x) for x in zip(*parts))
    sumsq = units.joined64(half_sumsq, tf.stack) * 2.0
    full = peak[0] is not None
    max_abs = dead_v = dead_l = None
    if full:
        nonzero = units.joined64(nonzero, tf.stack) * 2.0  # _half_nonzero's halves: exact
        max_abs, dead_v, dead_l = units.fractions(peak, where, rows)
    # Two things need a second look at the values, both rare: a non-finite
    # element (every one makes the sum of squares non-finite, so a finite sum
    # proves there are none and the count is paid for only on bad steps), and
    # a sum of squares outside float32's safe band. One cond covers both, so
    # a healthy step pays for a single branch.
    if full:
        finite_max = tf.math.is_finite(max_abs) & (max_abs > 0)
        suspicious = finite_max & ((sumsq < _SUMSQ_LOW) | (sumsq > _SUMSQ_HIGH))
    else:  # max |g| only on the rare path
        suspicious = ((sumsq > 0) & (sumsq < _SUMSQ_LOW)) | (sumsq > _SUMSQ_HIGH)
    rare = tf.reduce_any(suspicious) | tf.logical_not(tf.reduce_all(tf.math.is_finite(sumsq)))

    def careful():
        scale = max_abs if full else tf.stack([_max_abs(v) for v in values])
        out = [_robust_norms(values, sumsq, scale), tf.stack([_count_nonfinite(v) for v in values])]
        if full:  # the quick nonzero count is NaN where a NaN is among the values
            exact = units.joined64([tf.math.count_nonzero(v) for v in values], tf.stack)
            out.append(tf.where(tf.math.is_nan(nonzero), exact, nonzero))
        return tuple(out)

    def usual():
        return (tf.sqrt(sumsq), tf.zeros_like(sumsq)) + ((nonzero,) if full else ())

    norms, nonfinite, *rest = branches.cond(rare, careful, usual)
    # Elements that are not nonzero are zeros, the untouched rows of sliced
    # gradients included (their dense size is the variable's).
    zeros = tf.constant([float(rows.variable_sizes[i]) for i in where], tf.float64) - rest[0] if full else None
    return norms, max_abs, zeros, nonfinite, dead_v, dead_l


def _robust_norms(values, sumsq, max_abs):
    """max|g| * ||g / max|g||| for each tensor: no under- or overflow of the squares.

    Tensors whose max is 0, Inf or NaN keep sqrt(sumsq) (0, Inf or NaN).
    """
    finite_max = tf.math.is_finite(max_abs) & (max_abs > 0)
    scales = tf.unstack(where(finite_max, max_abs, 1.0))
    scaled = tf.stack([tf.reduce_sum(tf.square(tf.cast(v, tf.float64) / m)) for v, m in zip(values, scales)])
    return where(finite_max, max_abs * tf.sqrt(scaled), tf.sqrt(sumsq))


def _half_nonzero(values, bound):
    """Half the number of nonzero elements of ``values`` (at most ``bound``); NaN when one is NaN, for the caller to recount.

    ``l2_loss(sign(g))``: sign(g) squared is 1 where g is nonzero and 0 where
    it is zero, and ``l2_loss`` halves and sums those squares in one fused
    kernel, so the count takes one elementwise op and one reduction with no
    second temporary (|sign(g)| summed took two elementwise ops, and
    ``not_equal``, ``cast`` and an integer sum cost 3x that on a CPU). The
    float32 sum of halves is exact while the count stays below 2**24, so
    larger tensors take the integer form (``count_nonzero``: exact, int64,
    NaN counted as nonzero, as the caller's recount does).
    """
    if bound > 2**24:
        return tf.cast(tf.math.count_nonzero(values), tf.float64) * 0.5
    return tf.nn.l2_loss(tf.sign(values))


def _max_abs(values):
    if values.shape.num_elements() == 0:
        return tf.constant(0.0, tf.float64)
    # An empty set of slices reduces to -inf; the maximum with 0 fixes that
    # and keeps NaN (tf.maximum propagates NaN).
    return tf.maximum(tf.cast(tf.reduce_max(tf.abs(values)), tf.float64), 0.0)


def _count_nonfinite(values):
    count = tf.math.count_nonzero(tf.logical_not(tf.math.is_finite(values)), dtype=tf.int64)
    return tf.cast(count, tf.float64)


def as_float(values):
    # float16/bfloat16 squares overflow at |g| > 256: reduce in float32.
    return values if values.dtype in (tf.float32, tf.float64) else tf.cast(values, tf.float32)


def _summed_slices(slices):
    """The distinct rows of an IndexedSlices gradient, repeated indices summed."""
    unique, position = tf.unique(tf.reshape(slices.indices, [-1]))
    n_unique = tf.size(unique, out_type=tf.int64)
    summed = tf.math.unsorted_segment_sum(slices.values, position, tf.cast(n_unique, tf.int32))
    return summed, n_unique


def where(condition, x, y):
    """tf.where that gives Python numbers the dtype of the tensor beside them."""
    dtype = next(t.dtype for t in (x, y) if isinstance(t, (tf.Tensor, tf.Variable)))
    return tf.where(condition, tf.cast(x, dtype), tf.cast(y, dtype))
