"""Per-layer and per-variable gradient statistics, computed inside the training step.

``Rows`` groups variables into layers (static, from Python objects); ``compute``
turns one step's gradients into two float32 matrices, one row per layer and one
row per variable, one column per name in ``metadata.STORED_STAT_COLUMNS``. Missing
gradients are written as ``MISSING`` (-1): every gradient column is
non-negative by definition, so a negative value can only mean "no gradient".

Units (``dead_unit_fraction``). A unit is one output of a layer: the
parameters that only it uses. Which axes of a variable index its units:

- a Dense kernel ``[in, out]``, a Conv kernel ``[..., in, out]``, a recurrent
  kernel ``[units, 4 * units]``, any other variable of rank 2 or more: the last
  axis (one unit per output channel, all its input weights together);
- a vector (a bias, LayerNormalization and BatchNormalization's gamma and
  beta): each element;
- a DepthwiseConv kernel ``[kh, kw, in, multiplier]`` (and SeparableConv's
  ``depthwise_kernel``): the last two axes, one unit per (input channel,
  multiplier) output channel. Shapes cannot tell it from a Conv kernel, so
  this needs the model: ``unit_axes(model)`` finds them, and
  ``GradientCallback`` passes it on;
- a scalar: one unit.

A unit is dead at a step when every gradient element of it is exactly zero.
A variable's ``dead_unit_fraction`` is its dead units over its units. A
layer's units are those of its last variable (the bias, when the layer has
one: Keras creates it after the kernel), and a unit of the layer is dead when
it is dead in every variable of the layer with that many units (Dense: kernel
column j and bias j). Variables with another unit count (SeparableConv's
depthwise kernel) are left out of the layer's fraction; their own rows still
have theirs. A unit fed by a dead unit is not dead: only its kernel row from
the dead unit is zero, the rest of its column is not.

A NaN or Inf element makes its unit not dead (it is not zero). Sparse
gradients (``tf.IndexedSlices``, from embeddings) get units by the same rule
(the last axis; untouched rows are zeros), but a table row of a sparse input
is zero by nature, so readers exempt those rows (``sparse_rows``).

Cost: ``max |g|`` and dead units both come from a per-unit max and min of the
gradient (``reduce_max`` / ``reduce_min`` over every axis but the unit axes):
no full-size ``abs`` temporary; ``max |g|`` is the larger of the top max and
minus the bottom min.
"""

import numpy as np
import tensorflow as tf

from tb_gradcheck import metadata
from tb_gradcheck import validate

# Stored in every gradient column of a row whose gradient is None (the
# variable does not affect the loss). Distinct from NaN, which is data.
MISSING = -1.0

_COL = {c: i for i, c in enumerate(metadata.STORED_STAT_COLUMNS)}
_GRAD_NORM = _COL["grad_norm"]
_NONFINITE = _COL["grad_nonfinite"]
# The column of the window's first non-finite step (see metadata).
FIRST_NONFINITE = _COL["first_nonfinite_offset"]
# What compute(full=False) leaves out: the statistics that need passes of
# their own (max |g| and dead units: the per-unit max and min; the zero count).
_NOT_CHEAP = [_COL[c] for c in ("grad_max_abs", "grad_zero_fraction", "dead_unit_fraction")]
_WEIGHT_NORM = _COL["weight_norm"]
# The gradient columns: reduced per step over a window. The weight columns
# after them are taken at the write step.
GRADIENT_COLUMNS = len(metadata.GRADIENT_STAT_COLUMNS)

# float32 squares of values below ~1e-19 underflow and above ~1e19 overflow,
# so a plain sum of squares would report a vanishing gradient as 0 and a large
# finite one as Inf. When the quick sum lands outside this band, the norm is
# recomputed as max|g| * ||g / max|g|||, which cannot under- or overflow.
_SUMSQ_LOW = 1e-30
_SUMSQ_HIGH = 1e30


def unit_axes(model):
    """``{variable path: 2}`` for the depthwise kernels of a Keras model (see the module docstring).

    Every other variable's units follow from its shape. Walks nested models
    and layers through their ``layers`` attribute.
    """
    import keras

    depthwise = tuple(
        getattr(keras.layers, name)
        for name in ("DepthwiseConv1D", "DepthwiseConv2D", "SeparableConv1D", "SeparableConv2D")
        if hasattr(keras.layers, name)
    )
    out = {}
    stack, seen = [model], set()
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        if isinstance(layer, depthwise):
            kernel = getattr(layer, "depthwise_kernel", None) or getattr(layer, "kernel", None)
            if kernel is not None:
                out[validate.variable_name(kernel)] = 2
        stack.extend(getattr(layer, "layers", None) or [])
    return out


class Rows:
    """How variables map to rows: layers in depth order, and the variables themselves.

    A Keras 3 variable belongs to the layer that owns it (the parent of its
    ``path``, so ``sequential/dense/kernel`` is in ``sequential/dense``); a
    plain ``tf.Variable`` is its own layer. Layers are ordered by their first
    variable's position in ``variables``. Names that repeat (two plain
    variables both called ``Variable``) get ``#2``, ``#3``... appended, so
    every row name is unique.

    Args:
      variables: The checked variables (``validate.variables``).
      unit_axes: ``{variable name: number of trailing axes that index a
        unit}`` for variables whose units do not follow from their shape
        (``unit_axes(model)``); None for none.

    Attributes:
      layer_names: Layer row names, depth order.
      variable_names: Variable row names, in the order given.
      layer_of: For each variable, the index of its layer row.
      variable_sizes: Element count of each variable.
      layer_sizes: Element count of each layer.
      variable_units: Unit count of each variable.
      layer_units: Unit count of each layer (its last variable's).
    """

    def __init__(self, variables, unit_axes=None):
        variables = list(variables)
        unit_axes = unit_axes or {}
        names = [validate.variable_name(v) for v in variables]
        self.variable_names = _unique(names)
        owners = [_owner(v, name) for v, name in zip(variables, self.variable_names)]
        self.layer_names = []
        index = {}
        for owner in owners:
            if owner not in index:
                index[owner] = len(self.layer_names)
                self.layer_names.append(owner)
        self.layer_names = _unique(self.layer_names)
        self.layer_of = [index[o] for o in owners]
        shapes = [tuple(int(d) for d in v.shape) for v in variables]
        self.variable_sizes = [int(np.prod(s)) for s in shapes]
        self.layer_sizes = [0] * len(self.layer_names)
        for size, layer in zip(self.variable_sizes, self.layer_of):
            self.layer_sizes[layer] += size
        # Trailing axes that index a unit: the last one from rank 1 up (a
        # vector's elements, a kernel's output channels), none for a scalar.
        self.unit_axes = [min(len(s), unit_axes.get(n, 1)) for s, n in zip(shapes, names)]
        self.variable_units = [int(np.prod(s[len(s) - k :])) for s, k in zip(shapes, self.unit_axes)]
        self.layer_units = [0] * len(self.layer_names)
        for units, layer in zip(self.variable_units, self.layer_of):
            self.layer_units[layer] = units  # the last variable of the layer wins


def compute(gradients, variables, rows, weights=True, full=True):
    """Computes one step's statistics.

    Args:
      gradients: One checked gradient per variable (``validate.gradients``):
        a dense tensor, a ``tf.IndexedSlices`` (summed over repeated indices,
        as the optimizer would apply it) or None (recorded as missing).
      variables: The variables, in the order ``rows`` was built from.
      rows: The ``Rows`` of ``variables``.
      weights: Bool, default True. When False the weight columns hold
        MISSING; the windowed writer fills them in at write steps only
        (``with_weights``), since weights barely move within a window.
      full: Bool, default True. When False only ``grad_norm``,
        ``grad_nonfinite`` and the two onset columns are computed (one fused
        pass per gradient, the cost a windowed writer pays at every step) and
        the other gradient columns hold MISSING. A gradient whose squares all
        underflow to an exact 0 (every element below ~1e-23) then reads as
        norm 0.

    Returns:
      ``(layer_stats, variable_stats)``: float32 tensors of shape
      ``[len(rows.layer_names), C]`` and ``[len(rows.variable_names), C]``,
      ``C = len(metadata.STORED_STAT_COLUMNS)``. ``first_nonfinite_offset``
      is 0 (this step) where the gradient has a non-finite element.
    """
    present = [g is not None for g in gradients]
    where = [i for i, p in enumerate(present) if p]
    parts = [_partials(gradients[i], variables[i], rows.unit_axes[i], full) for i in where]
    n_var = len(variables)
    if parts:
        norm_v, max_abs_v, zeros_v, nonfinite_v, dead_v, dead_l = _gather_partials(parts, where, rows)
        if not full:
            max_abs_v = zeros_v = dead_v = tf.zeros_like(norm_v)  # placeholders, blanked below
            dead_l = tf.zeros([len(rows.layer_names)], tf.float64)
        if not all(present):
            # Scatter the present variables into full-length vectors; missing
            # rows get zeros here and the MISSING marker in _assemble.
            idx = [[i] for i in where]
            norm_v, max_abs_v, zeros_v, nonfinite_v, dead_v = (
                tf.scatter_nd(idx, x, [n_var]) for x in (norm_v, max_abs_v, zeros_v, nonfinite_v, dead_v)
            )
    else:
        norm_v = max_abs_v = zeros_v = nonfinite_v = dead_v = tf.zeros([n_var], tf.float64)
        dead_l = tf.zeros([len(rows.layer_names)], tf.float64)
    present_v = tf.constant(present)
    size_v = tf.constant(rows.variable_sizes, tf.float64)
    variable_stats = _assemble(norm_v, max_abs_v, zeros_v, nonfinite_v, dead_v, size_v, present_v)

    seg = tf.constant(rows.layer_of, tf.int32)
    n_layer = len(rows.layer_names)
    mask = tf.cast(present_v, tf.float64)
    layer_present = [any(present[v] for v in range(n_var) if rows.layer_of[v] == j) for j in range(n_layer)]
    layer_stats = _assemble(
        _combine_norms(norm_v * mask, seg, n_layer),
        _segment_max(max_abs_v * mask, seg, n_layer),
        tf.math.unsorted_segment_sum(zeros_v * mask, seg, n_layer),
        tf.math.unsorted_segment_sum(nonfinite_v * mask, seg, n_layer),
        dead_l,
        # A layer's zero fraction is over the elements that have a gradient.
        tf.math.unsorted_segment_sum(size_v * mask, seg, n_layer),
        tf.constant(layer_present),
    )
    if not full:
        layer_stats, variable_stats = _blank(layer_stats, _NOT_CHEAP), _blank(variable_stats, _NOT_CHEAP)
    elif parts:
        # A layer whose unit-defining variables all lack a gradient has no
        # dead-unit fraction even though other variables of it have one.
        layer_stats = _blank_cells(layer_stats, _COL["dead_unit_fraction"], _layers_without_units(rows, present))
    if weights:
        layer_w, variable_w = weight_norms(variables, rows)
        layer_stats = with_weights(layer_stats, layer_w)
        variable_stats = with_weights(variable_stats, variable_w)
    return layer_stats, variable_stats


def weight_norms(variables, rows):
    """Returns ``(per_layer, per_variable)`` L2 norms of the variables' values (float32 vectors)."""
    values = [_as_float(tf.convert_to_tensor(v)) for v in variables]
    sumsq = tf.stack([tf.cast(tf.nn.l2_loss(v), tf.float64) * 2.0 for v in values])
    # Weights' max |w| is not reported, so it is computed only on the rare
    # out-of-band path, and there for every variable at once.
    suspicious = (sumsq < _SUMSQ_LOW) | (sumsq > _SUMSQ_HIGH)
    w_norm_v = tf.cond(
        tf.reduce_any(suspicious),
        lambda: _robust_norms(values, sumsq, tf.stack([_max_abs(v) for v in values])),
        lambda: tf.sqrt(sumsq),
    )
    seg = tf.constant(rows.layer_of, tf.int32)
    w_norm_l = _combine_norms(w_norm_v, seg, len(rows.layer_names))
    return tf.cast(w_norm_l, tf.float32), tf.cast(w_norm_v, tf.float32)


def with_weights(stats, weight_norm):
    """Fills the ``weight_norm`` column of ``stats``.

    Args:
      stats: float32 ``[..., R, C]`` statistics (any leading aggregate axes).
      weight_norm: float32 ``[R]`` weight norms.

    Returns:
      ``stats`` with column ``weight_norm`` set in every slab.
    """
    w = tf.broadcast_to(weight_norm, tf.shape(stats[..., _WEIGHT_NORM]))
    return tf.concat([stats[..., :_WEIGHT_NORM], w[..., None], stats[..., _WEIGHT_NORM + 1 :]], axis=-1)


def present(stats):
    """Boolean ``[..., R]``: which rows of ``stats`` have a gradient.

    A missing row holds exactly MISSING in grad_norm; a present one holds a
    norm >= 0 or NaN (NaN != MISSING), and grad_norm is computed in every mode.
    """
    return tf.not_equal(stats[..., _GRAD_NORM], MISSING)


def _partials(gradient, variable, unit_axes, full=True):
    """One gradient's dense values, sum of squares and (when full) per-unit max and min and zero count."""
    shape = [int(d) for d in variable.shape]
    size = int(np.prod(shape))
    if isinstance(gradient, tf.IndexedSlices) and unit_axes >= len(shape):
        gradient = tf.convert_to_tensor(gradient)  # a sliced vector: its units are its rows
    if isinstance(gradient, tf.IndexedSlices):
        values, unique_rows = _summed_slices(gradient)
        # Rows no slice touches are exact zeros of the dense gradient.
        untouched = tf.cast(size - unique_rows * int(np.prod(shape[1:])), tf.float64)
    else:
        values, untouched = gradient, tf.constant(0.0, tf.float64)
    values = _as_float(values)
    # These passes are the writer's whole per-step cost, so each is the
    # cheapest exact form TensorFlow has: l2_loss is one fused kernel (no
    # squared temporary), the per-unit max and min reduce without an abs
    # temporary, and an int32 count is exact to 2**31 elements.
    sumsq = tf.cast(tf.nn.l2_loss(values), tf.float64) * 2.0
    if not full:
        return values, sumsq, None, None, None
    units = int(np.prod(shape[len(shape) - unit_axes :]))
    if units == 0:
        top = bottom = tf.zeros([0], tf.float64)
    else:
        per_unit = tf.reshape(values, [-1, units])
        # Clamped at 0: an empty gradient (no slices, a zero-length axis)
        # reduces to -inf/+inf, and untouched slice rows are zeros. Clamping
        # cannot make a live unit look dead (that needs max == min == 0, so
        # every element 0), nor change max |g| = max(top, -bottom) >= 0.
        top = tf.maximum(tf.cast(tf.reduce_max(per_unit, axis=0), tf.float64), 0.0)
        bottom = tf.minimum(tf.cast(tf.reduce_min(per_unit, axis=0), tf.float64), 0.0)
    zeros = tf.cast(tf.reduce_sum(tf.cast(tf.equal(values, 0), tf.int32)), tf.float64)
    return values, sumsq, top, bottom, zeros + untouched


def _gather_partials(parts, where, rows):
    """Per-variable norms, max |g|, zero and non-finite counts, dead-unit fractions; per-layer dead fractions.

    ``where`` are the indices (into ``rows``) of the variables in ``parts``.
    The per-unit vectors of all variables are concatenated and reduced with
    segment ops on static segment ids, so the op count does not grow with
    the number of variables.
    """
    values, sumsq, top, bottom, zeros = (list(x) for x in zip(*parts))
    sumsq = tf.stack(sumsq)
    full = top[0] is not None
    max_abs = dead_v = dead_l = None
    if full:
        zeros = tf.stack(zeros)
        max_abs, dead_v, dead_l = _unit_stats(top, bottom, where, rows)
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
        return _robust_norms(values, sumsq, scale), tf.stack([_count_nonfinite(v) for v in values])

    norms, nonfinite = tf.cond(rare, careful, lambda: (tf.sqrt(sumsq), tf.zeros_like(sumsq)))
    return norms, max_abs, zeros, nonfinite, dead_v, dead_l


def _unit_stats(top, bottom, where, rows):
    """max |g| and dead-unit fraction per present variable, and dead-unit fraction per layer.

    A layer's unit j is dead when unit j is dead in every present variable of
    the layer that has the layer's unit count (see the module docstring).
    """
    n = len(where)
    units = [rows.variable_units[i] for i in where]
    unit_var = tf.constant(np.repeat(np.arange(n), units), tf.int32)
    top, bottom = tf.concat(top, 0), tf.concat(bottom, 0)
    # Empty segments reduce to -inf (max) and +inf (min); the outer maximum
    # with 0 fixes both and keeps NaN.
    max_abs = tf.maximum(_segment_max(tf.maximum(top, -bottom), unit_var, n), 0.0)
    dead = tf.cast((top == 0) & (bottom == 0), tf.float64)
    dead_v = tf.math.unsorted_segment_sum(dead, unit_var, n) / np.maximum(units, 1)
    # Layer units: slot offset[layer] + j for unit j of a variable with the
    # layer's unit count; every other unit goes to one spare slot at the end.
    offsets = np.concatenate([[0], np.cumsum(rows.layer_units)])
    spare = int(offsets[-1])
    slots = np.concatenate([
        offsets[rows.layer_of[i]] + np.arange(u) if u == rows.layer_units[rows.layer_of[i]] else np.full(u, spare)
        for i, u in zip(where, units)
    ]).astype(np.int32)
    all_dead = tf.math.unsorted_segment_min(dead, tf.constant(slots), spare + 1)[:spare]
    # A slot no present variable covers reduces to +inf; its layer's value is
    # blanked by the caller, so clamp only to keep the sum finite.
    all_dead = tf.minimum(all_dead, 1.0)
    slot_layer = tf.constant(np.repeat(np.arange(len(rows.layer_units)), rows.layer_units), tf.int32)
    dead_l = tf.math.unsorted_segment_sum(all_dead, slot_layer, len(rows.layer_units)) / np.maximum(
        rows.layer_units, 1
    )
    return max_abs, dead_v, dead_l


def _segment_max(values, segments, n):
    """unsorted_segment_max that propagates NaN (the op itself keeps or drops a NaN depending on order)."""
    has_nan = tf.math.unsorted_segment_max(tf.cast(tf.math.is_nan(values), tf.int32), segments, n) > 0
    return _where(has_nan, np.nan, tf.math.unsorted_segment_max(values, segments, n))


def _layers_without_units(rows, present):
    """Layers none of whose present variables has the layer's unit count."""
    covered = {rows.layer_of[i] for i, p in enumerate(present)
               if p and rows.variable_units[i] == rows.layer_units[rows.layer_of[i]]}
    return [j for j in range(len(rows.layer_names)) if j not in covered]


def _robust_norms(values, sumsq, max_abs):
    """max|g| * ||g / max|g||| for each tensor: no under- or overflow of the squares.

    Tensors whose max is 0, Inf or NaN keep sqrt(sumsq) (0, Inf or NaN).
    """
    finite_max = tf.math.is_finite(max_abs) & (max_abs > 0)
    scales = tf.unstack(_where(finite_max, max_abs, 1.0))
    scaled = tf.stack([tf.reduce_sum(tf.square(tf.cast(v, tf.float64) / m)) for v, m in zip(values, scales)])
    return _where(finite_max, max_abs * tf.sqrt(scaled), tf.sqrt(sumsq))


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


def _combine_norms(norms, segments, n):
    """L2 norm of each segment from the norms of its parts, without under- or overflow."""
    top = tf.math.unsorted_segment_max(norms, segments, n)
    top = tf.maximum(top, 0.0)  # empty segments reduce to -inf
    finite_top = tf.math.is_finite(top) & (top > 0)
    scale = tf.gather(_where(finite_top, top, 1.0), segments)
    combined = top * tf.sqrt(tf.math.unsorted_segment_sum(tf.square(norms / scale), segments, n))
    # NaN anywhere stays NaN (NaN propagates through the sum); +Inf stays Inf.
    has_nan = tf.math.unsorted_segment_max(tf.cast(tf.math.is_nan(norms), tf.int32), segments, n) > 0
    return _where(has_nan, np.nan, _where(finite_top, combined, top))


def _assemble(norm, max_abs, zeros, nonfinite, dead, size, present):
    """Stacks the gradient columns, float32, MISSING where absent; the weight column MISSING."""
    zero_fraction = _where(size > 0, zeros / tf.maximum(size, 1.0), 0.0)
    # The onset columns of a window of one step: its norm if finite, and
    # offset 0 (this step) if it had a non-finite element.
    finite_norm = _where(tf.math.is_finite(norm), norm, MISSING)
    first_nonfinite = tf.where(nonfinite > 0, tf.zeros_like(nonfinite), MISSING)
    cols = tf.stack([norm, max_abs, zero_fraction, nonfinite, dead, finite_norm, first_nonfinite], axis=1)
    cols = _where(present[:, None], cols, MISSING)
    weight_col = tf.fill([tf.shape(cols)[0], 1], tf.constant(MISSING, tf.float64))
    return tf.cast(tf.concat([cols, weight_col], axis=1), tf.float32)


def _blank(stats, columns):
    """``stats`` with ``columns`` set to MISSING."""
    keep = np.ones(stats.shape[-1], bool)
    keep[list(columns)] = False
    return tf.where(keep, stats, MISSING)


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


def _owner(v, name):
    if isinstance(getattr(v, "path", None), str) and "/" in name:
        return name.rsplit("/", 1)[0]
    return name


def _unique(names):
    counts = {}
    out = []
    for n in names:
        counts[n] = counts.get(n, 0) + 1
        out.append(n if counts[n] == 1 else f"{n}#{counts[n]}")
    return out
