"""Per-layer and per-variable gradient statistics, computed inside the training step.

``compute`` turns one step's gradients into two float32 matrices, one row per
layer and one row per variable (``grouping.Rows``), one column per name in
``metadata.STORED_STAT_COLUMNS``. Missing
gradients are written as ``MISSING`` (-1): every gradient column is
non-negative by definition, so a negative value can only mean "no gradient".

Dead units: what a unit is for each kind of variable, and how a layer's units
are counted, is in ``tb_gradcheck.units``.
"""

import numpy as np
import tensorflow as tf

from tb_gradcheck import conds
from tb_gradcheck import metadata
from tb_gradcheck import sums
from tb_gradcheck import units

# Stored in every gradient column of a row whose gradient is None (the
# variable does not affect the loss). Distinct from NaN, which is data.
MISSING = -1.0

_COL = {c: i for i, c in enumerate(metadata.STORED_STAT_COLUMNS)}
# What a window reduces at every step (``quick``); the other gradient columns
# need passes of their own and are taken at the write step only.
WINDOW_COLUMNS = ("grad_norm", "grad_nonfinite", "grad_norm_finite")
_WEIGHT_NORM = _COL["weight_norm"]

# float32 squares of values below ~1e-19 underflow and above ~1e19 overflow,
# so a plain sum of squares would report a vanishing gradient as 0 and a large
# finite one as Inf. When the quick sum lands outside this band, the norm is
# recomputed as max|g| * ||g / max|g|||, which cannot under- or overflow.
_SUMSQ_LOW = 1e-30
_SUMSQ_HIGH = 1e30


def compute(gradients, rows, weights=True, onset=True, compiled=False):
    """Computes one step's statistics.

    Args:
      gradients: One checked gradient per variable (``validate.gradients``):
        a dense tensor, a ``tf.IndexedSlices`` (summed over repeated indices,
        as the optimizer would apply it) or None (recorded as missing).
      rows: The ``grouping.Rows`` of the variables, in the order of ``gradients``.
      weights: Bool, default True. When False the weight column holds
        MISSING; the windowed writer takes ``weight_norms`` itself.
      onset: Bool, default True: include ``metadata.ONSET_STAT_COLUMNS``
        (a window's last slab needs them; a layout written every step does
        not store them).
      compiled: Bool, default False: the step is XLA-compiled. The numbers
        are the same; they are computed with no cond (``_compiled_columns``)
        and with the sums that are cheap there (``tb_gradcheck.sums``).

    Returns:
      ``(layer_stats, variable_stats)``: float32 tensors of shape
      ``[len(rows.layer_names), C]`` and ``[len(rows.variable_names), C]``,
      columns ``metadata.stored_columns(1)``, then with ``onset`` the onset
      columns: ``first_nonfinite_offset`` is 0 (this step) where the
      gradient has a non-finite element.
    """
    variables = rows.variables
    present = [g is not None for g in gradients]
    where = [i for i, p in enumerate(present) if p]
    n_var, n_layer = len(variables), len(rows.layer_names)
    if where:
        if compiled:
            columns = _compiled_columns(gradients, where, rows)
        else:
            parts = [_partials(gradients[i], variables[i], rows.unit_axes[i]) for i in where]
            columns = _gather_partials(parts, where, rows)
        norm_v, max_abs_v, zeros_v, nonfinite_v, dead_v, dead_l = columns
        norm_v, max_abs_v, zeros_v, nonfinite_v, dead_v = _spread(
            (norm_v, max_abs_v, zeros_v, nonfinite_v, dead_v), where, n_var
        )
    else:
        norm_v = max_abs_v = zeros_v = nonfinite_v = dead_v = tf.zeros([n_var], tf.float64)
        dead_l = tf.zeros([n_layer], tf.float64)
    present_v = tf.constant(present)
    size_v = tf.constant(rows.variable_sizes, tf.float64)
    variable_stats = _assemble(norm_v, max_abs_v, zeros_v, nonfinite_v, dead_v, size_v, present_v, onset)

    seg = tf.constant(rows.layer_of, tf.int32)
    # Rows without a gradient hold zeros here (_spread), so the layer sums
    # need no mask, except the sizes: a layer's zero fraction is over the
    # elements that have a gradient.
    present_sizes = np.where(present, rows.variable_sizes, 0).astype(np.float64)
    layer_stats = _assemble(
        _combine_norms(norm_v, seg, n_layer, _narrow(gradients)),
        units.segment_max(max_abs_v, seg, n_layer),
        tf.math.unsorted_segment_sum(zeros_v, seg, n_layer),
        tf.math.unsorted_segment_sum(nonfinite_v, seg, n_layer),
        dead_l,
        tf.constant(np.bincount(rows.layer_of, present_sizes, n_layer)),
        tf.constant(_layers_present(rows, present)),
        onset,
    )
    if where:
        # A layer whose unit-defining variables all lack a gradient has no
        # dead-unit fraction even though other variables of it have one.
        layer_stats = _blank_cells(layer_stats, _COL["dead_unit_fraction"], units.layers_without_units(rows, present))
    if weights:
        layer_w, variable_w = weight_norms(rows, compiled)
        layer_stats = _with_weights(layer_stats, layer_w)
        variable_stats = _with_weights(variable_stats, variable_w)
    return layer_stats, variable_stats


def quick(gradients, rows, compiled=False):
    """The statistics a window reduces at every step (``WINDOW_COLUMNS``): one fused pass per gradient.

    Args:
      gradients: As for ``compute``.
      rows: As for ``compute``.
      compiled: As for ``compute``: the same numbers with no cond (the
        non-finite elements counted at every step).

    Returns:
      ``(layer, variable)``: float32 ``[L, 3]`` and ``[V, 3]``, columns
      ``WINDOW_COLUMNS``, MISSING in rows without a gradient. A gradient
      whose squares all underflow to an exact 0 (every element below ~1e-23)
      reads as norm 0 here, outside XLA; ``compute`` scales it.
    """
    present = [g is not None for g in gradients]
    n_layer = len(rows.layer_names)
    norm_v, nonfinite_v = _norms_and_nonfinite(gradients, rows, compiled)
    seg = tf.constant(rows.layer_of, tf.int32)
    layer = _window_columns(
        _combine_norms(norm_v, seg, n_layer, _narrow(gradients)),
        tf.math.unsorted_segment_sum(nonfinite_v, seg, n_layer),
        _layers_present(rows, present),
    )
    return layer, _window_columns(norm_v, nonfinite_v, present)


def norms(gradients, rows, compiled=False):
    """Per-layer and per-variable gradient norms alone: float32 ``[L]`` and ``[V]``, MISSING where missing.

    ``compiled``: as for ``quick``, whose norms these are; compiled, the
    non-finite elements are not counted.
    """
    present = [g is not None for g in gradients]
    norm_v, _ = _norms_and_nonfinite(gradients, rows, compiled, nonfinite=False)
    seg = tf.constant(rows.layer_of, tf.int32)
    norm_l = _combine_norms(norm_v, seg, len(rows.layer_names), _narrow(gradients))
    return _missing_where_absent(norm_l, _layers_present(rows, present)), _missing_where_absent(norm_v, present)


def _norms_and_nonfinite(gradients, rows, compiled, nonfinite=True):
    """float64 ``[V]``: each variable's gradient norm and non-finite element count, 0 where it has no gradient.

    Compiled, the count is a pass of its own (``_compiled_nonfinite``), taken
    only with ``nonfinite`` (None without it). Outside XLA it comes with the
    norms: a finite sum of squares proves there are none, and only a bad
    step counts them (``_gather_partials``).
    """
    where = [i for i, g in enumerate(gradients) if g is not None]
    n_var = len(rows.variables)
    if not where:
        return tf.zeros([n_var], tf.float64), tf.zeros([n_var], tf.float64)
    if compiled:
        values = _compiled_values(gradients, where, rows)
        columns = (_compiled_norms(values),) + ((_compiled_nonfinite(values),) if nonfinite else ())
    else:
        parts = [_partials(gradients[i], rows.variables[i], rows.unit_axes[i], full=False) for i in where]
        norm_v, _, _, nonfinite_v, _, _ = _gather_partials(parts, where, rows)
        columns = (norm_v, nonfinite_v)
    columns = _spread(columns, where, n_var)
    return columns[0], columns[1] if len(columns) > 1 else None


def _missing_where_absent(values, present):
    """float32 ``values`` (``[R]`` or ``[R, C]``), MISSING in the rows not ``present`` (a static list)."""
    values = tf.cast(values, tf.float32)
    if all(present):
        return values
    rows = tf.reshape(tf.constant(present), [-1] + [1] * (values.shape.rank - 1))
    return tf.where(rows, values, MISSING)


def window_columns(full):
    """``WINDOW_COLUMNS`` of ``compute(..., onset=True)``'s statistics: what ``quick`` gives, from one pass."""
    return tf.gather(full, [_COL[c] for c in WINDOW_COLUMNS], axis=1)


def _window_columns(norm, nonfinite, present):
    """float32 ``[R, 3]``: ``WINDOW_COLUMNS`` of one step, MISSING where not ``present`` (a static list)."""
    finite_norm = _where(tf.math.is_finite(norm), norm, MISSING)
    return _missing_where_absent(tf.stack([norm, nonfinite, finite_norm], axis=1), present)


def _spread(vectors, where, n):
    """Each ``[len(where)]`` vector scattered to length ``n`` (zeros elsewhere); as is when nothing is missing."""
    if len(where) == n:
        return tuple(vectors)
    idx = [[i] for i in where]
    return tuple(tf.scatter_nd(idx, x, [n]) for x in vectors)


def _layers_present(rows, present):
    return [any(p for p, layer in zip(present, rows.layer_of) if layer == j) for j in range(len(rows.layer_names))]


def weight_norms(rows, compiled=False):
    """Returns ``(per_layer, per_variable)`` L2 norms of the variables' values (float32 vectors)."""
    values = [_as_float(tf.convert_to_tensor(v)) for v in rows.variables]
    if compiled:
        w_norm_v = _compiled_norms(values)
    else:
        sumsq = units.joined64([tf.nn.l2_loss(v) for v in values], tf.stack) * 2.0
        # Weights' max |w| is not reported, so it is computed only on the rare
        # out-of-band path, and there for every variable at once.
        suspicious = (sumsq < _SUMSQ_LOW) | (sumsq > _SUMSQ_HIGH)
        w_norm_v = conds.cond(
            tf.reduce_any(suspicious),
            lambda: _robust_norms(values, sumsq, tf.stack([_max_abs(v) for v in values])),
            lambda: tf.sqrt(sumsq),
        )
    seg = tf.constant(rows.layer_of, tf.int32)
    w_norm_l = _combine_norms(w_norm_v, seg, len(rows.layer_names), _narrow(rows.variables))
    return tf.cast(w_norm_l, tf.float32), tf.cast(w_norm_v, tf.float32)


def _with_weights(stats, weight_norm):
    """Fills the ``weight_norm`` column of ``stats``.

    Args:
      stats: float32 ``[..., R, C]`` statistics (any leading aggregate axes).
      weight_norm: float32 ``[R]`` weight norms.

    Returns:
      ``stats`` with column ``weight_norm`` set in every slab.
    """
    w = tf.broadcast_to(weight_norm, tf.shape(stats[..., _WEIGHT_NORM]))
    return tf.concat([stats[..., :_WEIGHT_NORM], w[..., None], stats[..., _WEIGHT_NORM + 1 :]], axis=-1)


def _partials(gradient, variable, unit_axes, full=True):
    """One gradient's dense values, half its sum of squares and (when full) per-unit max and min and nonzero count.

    Each is one op (two for the count) in the values' dtype: the casts to
    float64 and the rest are done once for all variables by
    ``_gather_partials``, since on a CPU every small op costs microseconds
    whatever its size, and a per-variable op is paid once per variable.
    """
    shape = [int(d) for d in variable.shape]
    values = _values(gradient, shape, unit_axes)
    # These passes are the writer's whole per-step cost, so each is the
    # cheapest exact form TensorFlow has: l2_loss is one fused kernel (no
    # squared temporary), the per-unit max and min reduce without an abs
    # temporary, and the nonzero count is the cheap exact form of _nonzero.
    half_sumsq = tf.nn.l2_loss(values)
    if not full:
        return values, half_sumsq, None, None, None
    top, bottom = units.extremes(values, int(np.prod(shape[len(shape) - unit_axes :])))
    return values, half_sumsq, top, bottom, _nonzero(values, int(np.prod(shape)))


def _values(gradient, shape, unit_axes):
    """The gradient's values as float32 or float64: the tensor itself, or a sliced gradient's distinct rows."""
    if isinstance(gradient, tf.IndexedSlices) and unit_axes >= len(shape):
        gradient = tf.convert_to_tensor(gradient)  # a sliced vector: its units are its rows
    if isinstance(gradient, tf.IndexedSlices):
        # Rows no slice touches are exact zeros of the dense gradient: they
        # add nothing to the sum of squares nor to the nonzero count.
        gradient, _ = _summed_slices(gradient)
    return _as_float(gradient)


def _compiled_columns(gradients, where, rows):
    """``_gather_partials``' columns inside an XLA-compiled step: the same numbers, with no cond.

    Under XLA a cond is a computation of its own, and one that takes the
    gradients as operands keeps XLA from fusing around them: the rare-case
    cond of ``_gather_partials`` cost about 0.1x of a compiled 20-layer MLP
    step, more than the passes below. So the rare cases are covered at
    every step instead:

    - The sum of squares cannot under- or overflow (``_compiled_norms``).
    - Non-finite elements are counted at every step (a count of a mask).
    - Nonzero elements are counted as ``g != 0``, which counts NaN as
      nonzero, as the graph path's recount does: no recount needed.
    """
    values = _compiled_values(gradients, where, rows)
    tops, bottoms = zip(*[units.extremes(v, rows.variable_units[i]) for v, i in zip(values, where)])
    norms = _compiled_norms(values)
    nonzero = tf.stack([sums.count(tf.not_equal(v, 0), compiled=True) for v in values])
    nonfinite = _compiled_nonfinite(values)
    max_abs, dead_v, dead_l = units.fractions(tops, bottoms, where, rows)
    zeros = tf.constant([float(rows.variable_sizes[i]) for i in where], tf.float64) - nonzero
    return norms, max_abs, zeros, nonfinite, dead_v, dead_l


def _compiled_values(gradients, where, rows):
    """The values (``_values``) of the gradients at ``where``, which a compiled step reduces whole."""
    return [_values(gradients[i], [int(d) for d in rows.variables[i].shape], rows.unit_axes[i]) for i in where]


def _compiled_nonfinite(values):
    """float64 count of the non-finite elements of each tensor, with no cond (one count of a mask each)."""
    return tf.stack([sums.count(tf.logical_not(tf.math.is_finite(v)), compiled=True) for v in values])


def _compiled_norms(values):
    """float64 L2 norm of each tensor in a compiled step, with no cond and no under- or overflow that shows.

    The squares are taken in float64. A float32 square there can neither
    underflow nor overflow. A float64 square can, but only for elements
    below 1e-154 or above 1e154, and a norm made of such elements is 0 or
    Inf in the float32 it is stored as whichever way it is computed.
    """
    return tf.sqrt(tf.stack([sums.sumsq64(v, compiled=True) for v in values]))


def _gather_partials(parts, where, rows):
    """Per-variable norms, max |g|, zero and non-finite counts, dead-unit fractions; per-layer dead fractions.

    ``where`` are the indices (into ``rows``) of the variables in ``parts``.
    The per-unit vectors of all variables are concatenated and reduced with
    segment ops on static segment ids, so the op count does not grow with
    the number of variables.
    """
    values, half_sumsq, top, bottom, nonzero = (list(x) for x in zip(*parts))
    sumsq = units.joined64(half_sumsq, tf.stack) * 2.0
    full = top[0] is not None
    max_abs = dead_v = dead_l = None
    if full:
        nonzero = units.joined64(nonzero, tf.stack)
        max_abs, dead_v, dead_l = units.fractions(top, bottom, where, rows)
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

    norms, nonfinite, *rest = conds.cond(rare, careful, usual)
    # Elements that are not nonzero are zeros, the untouched rows of sliced
    # gradients included (their dense size is the variable's).
    zeros = tf.constant([float(rows.variable_sizes[i]) for i in where], tf.float64) - rest[0] if full else None
    return norms, max_abs, zeros, nonfinite, dead_v, dead_l


def _robust_norms(values, sumsq, max_abs):
    """max|g| * ||g / max|g||| for each tensor: no under- or overflow of the squares.

    Tensors whose max is 0, Inf or NaN keep sqrt(sumsq) (0, Inf or NaN).
    """
    finite_max = tf.math.is_finite(max_abs) & (max_abs > 0)
    scales = tf.unstack(_where(finite_max, max_abs, 1.0))
    scaled = tf.stack([tf.reduce_sum(tf.square(tf.cast(v, tf.float64) / m)) for v, m in zip(values, scales)])
    return _where(finite_max, max_abs * tf.sqrt(scaled), tf.sqrt(sumsq))


def _nonzero(values, bound):
    """The number of nonzero elements of ``values`` (at most ``bound``); NaN when one is NaN, for the caller to recount.

    |sign(g)| summed: two elementwise ops and a sum, measured 3x cheaper on a
    CPU than ``not_equal``, ``cast`` and an integer sum. The float32 sum of
    zeros and ones is exact while the count stays below 2**24, so larger
    tensors take the integer form (``count_nonzero``: exact, int64, NaN
    counted as nonzero, as the caller's recount does).
    """
    if bound > 2**24:
        return tf.math.count_nonzero(values)
    return tf.reduce_sum(tf.abs(tf.sign(values)))


def _max_abs(values):
    if values.shape.num_elements() == 0:
        return tf.constant(0.0, tf.float64)
    # An empty set of slices reduces to -inf; the maximum with 0 fixes that
    # and keeps NaN (tf.maximum propagates NaN).
    return tf.maximum(tf.cast(tf.reduce_max(tf.abs(values)), tf.float64), 0.0)


def _count_nonfinite(values):
    count = tf.math.count_nonzero(tf.logical_not(tf.math.is_finite(values)), dtype=tf.int64)
    return tf.cast(count, tf.float64)


def _as_float(values):
    # float16/bfloat16 squares overflow at |g| > 256: reduce in float32.
    return values if values.dtype in (tf.float32, tf.float64) else tf.cast(values, tf.float32)


def _summed_slices(slices):
    """The distinct rows of an IndexedSlices gradient, repeated indices summed."""
    unique, position = tf.unique(tf.reshape(slices.indices, [-1]))
    n_unique = tf.size(unique, out_type=tf.int64)
    summed = tf.math.unsorted_segment_sum(slices.values, position, tf.cast(n_unique, tf.int32))
    return summed, n_unique


def _combine_norms(norms, segments, n, narrow):
    """L2 norm of each segment from the float64 norms of its parts, without under- or overflow.

    ``narrow``: every part is float32 or narrower. Such a norm is below
    ~1e43 and, if nonzero, above ~1e-45, so its float64 square neither
    overflows nor underflows, and the squares are summed as they are (three
    ops). Norms of float64 values are scaled by their segment's largest first.
    NaN anywhere in a segment gives NaN, +Inf (without NaN) gives +Inf.
    """
    if narrow:
        return tf.sqrt(tf.math.unsorted_segment_sum(tf.square(norms), segments, n))
    top = tf.math.unsorted_segment_max(norms, segments, n)
    top = tf.maximum(top, 0.0)  # empty segments reduce to -inf
    finite_top = tf.math.is_finite(top) & (top > 0)
    scale = tf.gather(_where(finite_top, top, 1.0), segments)
    combined = top * tf.sqrt(tf.math.unsorted_segment_sum(tf.square(norms / scale), segments, n))
    # NaN anywhere stays NaN (NaN propagates through the sum); +Inf stays Inf.
    has_nan = tf.math.unsorted_segment_max(tf.cast(tf.math.is_nan(norms), tf.int32), segments, n) > 0
    return _where(has_nan, np.nan, _where(finite_top, combined, top))


def _narrow(tensors):
    """Whether every tensor (or variable) given is float32 or narrower (see ``_combine_norms``)."""
    return all(t.dtype != tf.float64 for t in tensors if t is not None)


def _assemble(norm, max_abs, zeros, nonfinite, dead, size, present, onset):
    """Stacks the columns, float32, MISSING where absent; the weight column MISSING."""
    zero_fraction = _where(size > 0, zeros / tf.maximum(size, 1.0), 0.0)
    cols = [norm, max_abs, zero_fraction, nonfinite, dead, tf.fill(tf.shape(norm), tf.constant(MISSING, tf.float64))]
    if onset:
        # The onset columns of a window of one step: its norm if finite, and
        # offset 0 (this step) if it had a non-finite element.
        cols.append(_where(tf.math.is_finite(norm), norm, MISSING))
        cols.append(tf.where(nonfinite > 0, tf.zeros_like(nonfinite), MISSING))
    return tf.cast(_where(present[:, None], tf.stack(cols, axis=1), MISSING), tf.float32)


def _blank_cells(stats, column, rows_):
    """``stats`` with ``column`` set to MISSING in rows ``rows_``."""
    if not rows_:
        return stats
    mask = np.zeros(stats.shape, bool)
    mask[rows_, column] = True
    return tf.where(mask, MISSING, stats)


def _where(condition, x, y):
    """tf.where that gives Python numbers the dtype of the tensor beside them."""
    dtype = next(t.dtype for t in (x, y) if isinstance(t, (tf.Tensor, tf.Variable)))
    return tf.where(condition, tf.cast(x, dtype), tf.cast(y, dtype))
