"""Per-layer and per-variable gradient statistics, computed inside the training step.

``Rows`` groups variables into layers (static, from Python objects); ``compute``
turns one step's gradients into two float32 matrices, one row per layer and one
row per variable, one column per name in ``metadata.STORED_STAT_COLUMNS``. Missing
gradients are written as ``MISSING`` (-1): every gradient column is
non-negative by definition, so a negative value can only mean "no gradient".
"""

import numpy as np
import tensorflow as tf

from tb_gradcheck import metadata

# Stored in every gradient column of a row whose gradient is None (the
# variable does not affect the loss). Distinct from NaN, which is data.
MISSING = -1.0

_ZERO_FRACTION = metadata.STORED_STAT_COLUMNS.index("grad_zero_fraction")
_WEIGHT_NORM = metadata.STORED_STAT_COLUMNS.index("weight_norm")
# The gradient columns: reduced per step over a window. The weight columns
# after them are taken at the write step.
GRADIENT_COLUMNS = _WEIGHT_NORM

# float32 squares of values below ~1e-19 underflow and above ~1e19 overflow,
# so a plain sum of squares would report a vanishing gradient as 0 and a large
# finite one as Inf. When the quick sum lands outside this band, the norm is
# recomputed as max|g| * ||g / max|g|||, which cannot under- or overflow.
_SUMSQ_LOW = 1e-30
_SUMSQ_HIGH = 1e30


class Rows:
    """How variables map to rows: layers in depth order, and the variables themselves.

    A Keras 3 variable belongs to the layer that owns it (the parent of its
    ``path``, so ``sequential/dense/kernel`` is in ``sequential/dense``); a
    plain ``tf.Variable`` is its own layer. Layers are ordered by their first
    variable's position in ``variables``. Names that repeat (two plain
    variables both called ``Variable``) get ``#2``, ``#3``... appended, so
    every row name is unique.

    Attributes:
      layer_names: Layer row names, depth order.
      variable_names: Variable row names, in the order given.
      layer_of: For each variable, the index of its layer row.
      variable_sizes: Element count of each variable.
      layer_sizes: Element count of each layer.
    """

    def __init__(self, variables):
        variables = list(variables)
        if not variables:
            raise ValueError("Expected at least one variable. Received: an empty list of variables.")
        seen = {}
        for i, v in enumerate(variables):
            if not isinstance(v, tf.Variable) and not _is_keras_variable(v):
                raise TypeError(
                    "Expected tf.Variable or keras.Variable objects in `variables`. "
                    f"Received: variables[{i}] of type {type(v).__name__}"
                )
            if id(v) in seen:
                raise ValueError(
                    "Expected each variable once. "
                    f"Received: variables[{seen[id(v)]}] and variables[{i}] are the same variable {_name(v)!r}"
                )
            seen[id(v)] = i
            dtype = tf.as_dtype(v.dtype)  # a string for Keras variables
            if not dtype.is_floating:
                raise TypeError(
                    "Expected floating-point variables (gradients exist only for those). "
                    f"Received: variables[{i}] {_name(v)!r} with dtype {dtype.name}"
                )
        self.variable_names = _unique([_name(v) for v in variables])
        owners = [_owner(v, name) for v, name in zip(variables, self.variable_names)]
        self.layer_names = []
        index = {}
        for owner in owners:
            if owner not in index:
                index[owner] = len(self.layer_names)
                self.layer_names.append(owner)
        self.layer_names = _unique(self.layer_names)
        self.layer_of = [index[o] for o in owners]
        self.variable_sizes = [int(np.prod(v.shape)) for v in variables]
        self.layer_sizes = [0] * len(self.layer_names)
        for size, layer in zip(self.variable_sizes, self.layer_of):
            self.layer_sizes[layer] += size

    def names(self, granularity):
        return self.layer_names if granularity == "layer" else self.variable_names

    def sizes(self, granularity):
        return self.layer_sizes if granularity == "layer" else self.variable_sizes


def compute(gradients, variables, rows, weights=True):
    """Computes one step's statistics.

    Args:
      gradients: One gradient per variable: a dense tensor, a
        ``tf.IndexedSlices`` (summed over repeated indices, as the optimizer
        would apply it) or None (recorded as missing).
      variables: The variables, in the order ``rows`` was built from.
      rows: The ``Rows`` of ``variables``.
      weights: Bool, default True. When False the weight columns hold
        MISSING; the windowed writer fills them in at write steps only
        (``with_weights``), since weights barely move within a window.

    Returns:
      ``(layer_stats, variable_stats)``: float32 tensors of shape
      ``[len(rows.layer_names), C]`` and ``[len(rows.variable_names), C]``,
      ``C = len(metadata.STORED_STAT_COLUMNS)``.
    """
    gradients = list(gradients)
    if len(gradients) != len(variables):
        raise ValueError(
            "Expected one gradient per variable. "
            f"Received: len(gradients)={len(gradients)}, len(variables)={len(variables)}"
        )
    present = [g is not None for g in gradients]
    parts = [_partials(g, v) for g, v in zip(gradients, variables) if g is not None]
    n_var = len(variables)
    if parts:
        norm_v, max_abs_v, zeros_v, nonfinite_v = _gather_partials(parts)
        if not all(present):
            # Scatter the present variables into full-length vectors; missing
            # rows get zeros here and the MISSING marker in _assemble.
            idx = [[i] for i, p in enumerate(present) if p]
            norm_v, max_abs_v, zeros_v, nonfinite_v = (
                tf.scatter_nd(idx, x, [n_var]) for x in (norm_v, max_abs_v, zeros_v, nonfinite_v)
            )
    else:
        norm_v = max_abs_v = zeros_v = nonfinite_v = tf.zeros([n_var], tf.float64)
    present_v = tf.constant(present)
    size_v = tf.constant(rows.variable_sizes, tf.float64)
    variable_stats = _assemble(norm_v, max_abs_v, zeros_v, nonfinite_v, size_v, present_v)

    seg = tf.constant(rows.layer_of, tf.int32)
    n_layer = len(rows.layer_names)
    mask = tf.cast(present_v, tf.float64)
    layer_stats = _assemble(
        _combine_norms(norm_v * mask, seg, n_layer),
        tf.math.unsorted_segment_max(max_abs_v * mask, seg, n_layer),
        tf.math.unsorted_segment_sum(zeros_v * mask, seg, n_layer),
        tf.math.unsorted_segment_sum(nonfinite_v * mask, seg, n_layer),
        # A layer's zero fraction is over the elements that have a gradient.
        tf.math.unsorted_segment_sum(size_v * mask, seg, n_layer),
        tf.math.unsorted_segment_max(tf.cast(present_v, tf.int32), seg, n_layer) > 0,
    )
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

    Read from the zero fraction, the one gradient column that is never NaN
    (a NaN gradient has a NaN norm but still a well-defined zero count).
    """
    return stats[..., _ZERO_FRACTION] >= 0


def _partials(gradient, variable):
    """The dense values, sum of squares, max |g| and zero count of one gradient."""
    size = int(np.prod(variable.shape))
    if isinstance(gradient, tf.IndexedSlices):
        values, unique_rows = _summed_slices(gradient)
        row_size = int(np.prod(variable.shape[1:]))
        # Rows no slice touches are exact zeros of the dense gradient.
        untouched = tf.cast(size - unique_rows * row_size, tf.float64)
    else:
        values = tf.convert_to_tensor(gradient)
        if values.shape.is_fully_defined() and values.shape != variable.shape:
            raise ValueError(
                "Expected each gradient to have its variable's shape. "
                f"Received: gradient of shape {values.shape} for variable {_name(variable)!r} "
                f"of shape {variable.shape}"
            )
        untouched = tf.constant(0.0, tf.float64)
    if not values.dtype.is_floating:
        raise TypeError(
            "Expected floating-point gradients. "
            f"Received: dtype {values.dtype.name} for variable {_name(variable)!r}"
        )
    values = _as_float(values)
    # These three full passes are the writer's whole per-step cost, so each is
    # the cheapest exact form TensorFlow has: l2_loss is one fused kernel (no
    # squared temporary), and an int32 count is exact to 2**31 elements.
    sumsq = tf.cast(tf.nn.l2_loss(values), tf.float64) * 2.0
    zeros = tf.cast(tf.reduce_sum(tf.cast(tf.equal(values, 0), tf.int32)), tf.float64)
    return values, sumsq, _max_abs(values), zeros + untouched


def _gather_partials(parts):
    """Stacks per-variable partials into norms, max |g|, zero and non-finite counts."""
    values, sumsq, max_abs, zeros = (list(x) for x in zip(*parts))
    sumsq, max_abs, zeros = tf.stack(sumsq), tf.stack(max_abs), tf.stack(zeros)
    # Two things need a second look at the values, both rare: a non-finite
    # element (every one makes the sum of squares non-finite, so a finite sum
    # proves there are none and the count is paid for only on bad steps), and
    # a sum of squares outside float32's safe band. One cond covers both, so
    # a healthy step pays for a single branch.
    finite_max = tf.math.is_finite(max_abs) & (max_abs > 0)
    suspicious = finite_max & ((sumsq < _SUMSQ_LOW) | (sumsq > _SUMSQ_HIGH))
    rare = tf.reduce_any(suspicious) | tf.logical_not(tf.reduce_all(tf.math.is_finite(sumsq)))
    norms, nonfinite = tf.cond(
        rare,
        lambda: (_robust_norms(values, sumsq, max_abs), tf.stack([_count_nonfinite(v) for v in values])),
        lambda: (tf.sqrt(sumsq), tf.zeros_like(sumsq)),
    )
    return norms, max_abs, zeros, nonfinite


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


def _assemble(norm, max_abs, zeros, nonfinite, size, present):
    """Stacks the gradient columns, float32, MISSING where absent; the weight column MISSING."""
    zero_fraction = _where(size > 0, zeros / tf.maximum(size, 1.0), 0.0)
    cols = tf.stack([norm, max_abs, zero_fraction, nonfinite], axis=1)
    cols = _where(present[:, None], cols, MISSING)
    weight_col = tf.fill([tf.shape(cols)[0], 1], tf.constant(MISSING, tf.float64))
    return tf.cast(tf.concat([cols, weight_col], axis=1), tf.float32)


def _where(condition, x, y):
    """tf.where that gives Python numbers the dtype of the tensor beside them."""
    dtype = next(t.dtype for t in (x, y) if isinstance(t, (tf.Tensor, tf.Variable)))
    return tf.where(condition, tf.cast(x, dtype), tf.cast(y, dtype))


def _is_keras_variable(v):
    return isinstance(getattr(v, "path", None), str) and hasattr(v, "dtype") and hasattr(v, "shape")


def _name(v):
    path = getattr(v, "path", None)
    if isinstance(path, str) and path:
        return path
    name = getattr(v, "name", None) or "variable"
    return name[:-2] if name.endswith(":0") else name


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
