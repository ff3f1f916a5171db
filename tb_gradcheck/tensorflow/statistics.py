"""Per-layer and per-variable gradient statistics, computed inside the training step.

``compute`` turns one step's gradients into two float32 matrices, one row per
layer and one row per variable (``variables.Rows``), one column per name in
``metadata.STORED_STAT_COLUMNS``. The passes over each gradient are in
``tb_gradcheck.tensorflow.reductions``; this module lays their results out. Missing
gradients are written as ``MISSING`` (-1): every gradient column is
non-negative by definition, so a negative value can only mean "no gradient".

Dead units: what a unit is for each kind of variable, and how a layer's units
are counted, is in ``tb_gradcheck.tensorflow.units``.
"""

import numpy as np
import tensorflow as tf

from tb_gradcheck.core import metadata
from tb_gradcheck.tensorflow import reductions
from tb_gradcheck.tensorflow import units

# Stored in every gradient column of a row whose gradient is None (the
# variable does not affect the loss). Distinct from NaN, which is data.
MISSING = -1.0

_COL = {c: i for i, c in enumerate(metadata.STORED_STAT_COLUMNS)}
# What a window reduces at every step (``quick``); the other gradient columns
# need passes of their own and are taken at the write step only.
WINDOW_COLUMNS = ("grad_norm", "grad_nonfinite", "grad_norm_finite")
_WEIGHT_NORM = _COL["weight_norm"]


def compute(gradients, rows, weights=True, onset=True, compiled=False, known=None):
    """Computes one step's statistics.

    Args:
      gradients: One checked gradient per variable (``validate.gradients``):
        a dense tensor, a ``tf.IndexedSlices`` (summed over repeated indices,
        as the optimizer would apply it) or None (recorded as missing).
      rows: The ``variables.Rows`` of the variables, in the order of ``gradients``.
      weights: Bool, default True. When False the weight column holds
        MISSING; the windowed writer takes ``weight_norms`` itself.
      onset: Bool, default True: include ``metadata.ONSET_STAT_COLUMNS``
        (a window's last slab needs them; a layout written every step does
        not store them).
      compiled: Bool, default False: the step is XLA-compiled. The numbers
        are the same; they are computed with no cond
        (``reductions.compiled_columns``) and with the sums that are cheap there
        (``tb_gradcheck.tensorflow.full_sums``).
      known: None, or what ``half_sums`` gave for these gradients in this
        step (its third item): their dense values and sums of squares are
        reused, not made again (a window's write step; not compiled).

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
            columns = reductions.compiled_columns(gradients, where, rows)
        else:
            known = known or [None] * n_var
            parts = [
                reductions.graph_partials(gradients[i], variables[i], rows.unit_axes[i], known=known[i]) for i in where
            ]
            columns = reductions.gather(parts, where, rows)
        norm_v, max_abs_v, zeros_v, nonfinite_v, dead_v, dead_l = columns
        norm_v, max_abs_v, zeros_v, nonfinite_v, dead_v = _spread(
            (norm_v, max_abs_v, zeros_v, nonfinite_v, dead_v), where, n_var
        )
    else:
        norm_v = max_abs_v = zeros_v = nonfinite_v = dead_v = tf.zeros([n_var], tf.float64)
        dead_l = tf.zeros([n_layer], tf.float64)
    # The weight norms go into their column as the rows are stacked (the
    # column is kept in rows without a gradient too); a layer whose
    # unit-defining variables all lack a gradient has no dead-unit fraction
    # even though other variables of it have one. Both are static masks, so
    # each matrix is stacked, masked and cast with three ops.
    layer_w, variable_w = _weight_norms64(rows, compiled) if weights else (None, None)
    variable_stats = _assemble(
        (norm_v, max_abs_v, zeros_v, nonfinite_v, dead_v), rows.variable_sizes, present, onset, variable_w
    )

    seg = tf.constant(rows.layer_of, tf.int32)
    # Rows without a gradient hold zeros here (_spread), so the layer sums
    # need no mask, except the sizes: a layer's zero fraction is over the
    # elements that have a gradient.
    present_sizes = np.where(present, rows.variable_sizes, 0).astype(np.float64)
    layer_stats = _assemble(
        (
            _combine_norms(norm_v, seg, n_layer, _narrow(gradients)),
            units.segment_max(max_abs_v, seg, n_layer),
            tf.math.unsorted_segment_sum(zeros_v, seg, n_layer),
            tf.math.unsorted_segment_sum(nonfinite_v, seg, n_layer),
            dead_l,
        ),
        np.bincount(rows.layer_of, present_sizes, n_layer),
        _layers_present(rows, present),
        onset,
        layer_w,
        blank=units.layers_without_units(rows, present) if where else (),
    )
    return layer_stats, variable_stats


def quick(gradients, rows, compiled=False, counted=True):
    """The statistics a window reduces at every step (``WINDOW_COLUMNS``): one fused pass per gradient.

    Args:
      gradients: As for ``compute``.
      rows: As for ``compute``.
      compiled: As for ``compute``: the same numbers with no cond (the
        non-finite elements counted at every step).
      counted: Compiled only: False gives ``grad_nonfinite`` as a flag, > 0
        exactly where the row has a non-finite element, which is all a
        window's sum, max and min keep of a step that is not written
        (``Window.add(counted=False)``), for the price of the norms alone
        (``reductions.compiled_flags``).

    Returns:
      ``(layer, variable)``: float32 ``[L, 3]`` and ``[V, 3]``, columns
      ``WINDOW_COLUMNS``, MISSING in rows without a gradient. A gradient
      whose squares all underflow to an exact 0 (every element below ~1e-23)
      reads as norm 0 here, outside XLA; ``compute`` scales it.
    """
    present = [g is not None for g in gradients]
    n_layer = len(rows.layer_names)
    norm_v, nonfinite_v = _norms_and_nonfinite(gradients, rows, compiled, nonfinite=True if counted else "flag")
    seg = tf.constant(rows.layer_of, tf.int32)
    layer = _window_columns(
        _combine_norms(norm_v, seg, n_layer, _narrow(gradients)),
        tf.math.unsorted_segment_sum(nonfinite_v, seg, n_layer),
        _layers_present(rows, present),
    )
    return layer, _window_columns(norm_v, nonfinite_v, present)


def half_sums(gradients, rows):
    """Between a window's writes: one ``l2_loss`` per gradient, and whether ``quick`` must look again.

    Args:
      gradients: As for ``compute``.
      rows: As for ``compute``.

    Returns:
      ``(half, rare, known)``: float64 ``[V]``, each gradient's half sum of
      squares (-1 where it has none); a bool scalar, true when one of them is
      non-finite or outside the band where its square root is the exact norm
      (``reductions.half_in_band``); and per variable the ``(values,
      half_sumsq)`` those came from (None where it has no gradient), for
      ``compute(known=...)`` at the write step. A step that is not rare has
      no non-finite element, and ``held_columns`` gives its ``quick`` columns
      from ``half`` alone; a rare one takes ``quick``, which looks at the
      values again.
    """
    n_var = len(rows.variables)
    where = [i for i, g in enumerate(gradients) if g is not None]
    known = [None] * n_var
    if not where:
        return tf.fill([n_var], tf.constant(MISSING, tf.float64)), tf.constant(False), known
    for i in where:
        known[i] = reductions.graph_partials(gradients[i], rows.variables[i], rows.unit_axes[i], full=False)[:2]
    half = units.joined64([known[i][1] for i in where], tf.stack)
    rare = tf.logical_not(tf.reduce_all(reductions.half_in_band(half)))
    if len(where) < n_var:
        half = tf.tensor_scatter_nd_update(
            tf.fill([n_var], tf.constant(MISSING, tf.float64)), [[i] for i in where], half
        )
    return half, rare, known


def held_columns(half, rows):
    """``quick``'s columns of steps that were not rare, from their ``half_sums``: float32 ``[R, D, 3]``.

    Args:
      half: float64 ``[D, V]``: ``half_sums`` of D steps, none of them rare.
      rows: The ``variables.Rows``.

    Returns:
      Rows (layers first) by steps by ``WINDOW_COLUMNS``, MISSING where a row
      has no gradient: the same numbers as ``quick`` of each step, computed
      for all D steps at once. A step that is not rare has a finite sum of
      squares, so no non-finite element and a finite norm.
    """
    n_layer = len(rows.layer_names)
    seg = tf.constant(rows.layer_of, tf.int32)
    here_v = tf.transpose(half >= 0)  # [V, D]
    norm_v = tf.sqrt(tf.transpose(tf.maximum(half, 0.0)) * 2.0)  # a row without a gradient adds 0 to its layer
    norm_l = _combine_norms(norm_v, seg, n_layer, _narrow(rows.variables))
    here_l = tf.math.unsorted_segment_max(tf.cast(here_v, tf.int32), seg, n_layer) > 0
    norm = tf.concat([norm_l, norm_v], 0)
    here = tf.concat([here_l, here_v], 0)
    columns = tf.stack([norm, tf.zeros_like(norm), norm], axis=-1)
    return tf.cast(tf.where(here[..., None], columns, MISSING), tf.float32)


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

    Compiled, the count is a pass of its own (``reductions.compiled_nonfinite``),
    taken only with ``nonfinite`` True (None with False; with ``"flag"``, a
    flag read from the norms, ``reductions.compiled_flags``). Outside XLA it
    comes with the norms: a finite sum of squares proves there are none, and
    only a bad step counts them (``reductions.gather``).
    """
    where = [i for i, g in enumerate(gradients) if g is not None]
    n_var = len(rows.variables)
    if not where:
        return tf.zeros([n_var], tf.float64), tf.zeros([n_var], tf.float64)
    if compiled:
        values = reductions.compiled_values(gradients, where, rows)
        norms = reductions.compiled_norms(values)
        if nonfinite == "flag":
            columns = (norms, reductions.compiled_flags(values, norms))
        else:
            columns = (norms,) + ((reductions.compiled_nonfinite(values),) if nonfinite else ())
    else:
        parts = [
            reductions.graph_partials(gradients[i], rows.variables[i], rows.unit_axes[i], full=False) for i in where
        ]
        norm_v, _, _, nonfinite_v, _, _ = reductions.gather(parts, where, rows)
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
    finite_norm = reductions.where(tf.math.is_finite(norm), norm, MISSING)
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
    layer, variable = _weight_norms64(rows, compiled)
    return tf.cast(layer, tf.float32), tf.cast(variable, tf.float32)


def _weight_norms64(rows, compiled=False):
    """``weight_norms`` before their cast to float32: float64 ``[L]`` and ``[V]``."""
    values = [reductions.as_float(tf.convert_to_tensor(v)) for v in rows.variables]
    w_norm_v = reductions.tensor_norms(values, compiled)
    seg = tf.constant(rows.layer_of, tf.int32)
    return _combine_norms(w_norm_v, seg, len(rows.layer_names), _narrow(rows.variables)), w_norm_v


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
    scale = tf.gather(reductions.where(finite_top, top, 1.0), segments)
    combined = top * tf.sqrt(tf.math.unsorted_segment_sum(tf.square(norms / scale), segments, n))
    # NaN anywhere stays NaN (NaN propagates through the sum); +Inf stays Inf.
    has_nan = tf.math.unsorted_segment_max(tf.cast(tf.math.is_nan(norms), tf.int32), segments, n) > 0
    return reductions.where(has_nan, np.nan, reductions.where(finite_top, combined, top))


def _narrow(tensors):
    """Whether every tensor (or variable) given is float32 or narrower (see ``_combine_norms``)."""
    return all(t.dtype != tf.float64 for t in tensors if t is not None)


def _assemble(columns, size, present, onset, weight=None, blank=()):
    """The rows' float32 statistics, columns ``metadata.STORED_STAT_COLUMNS`` (with ``onset``, the onset ones too).

    Args:
      columns: float64 ``[R]`` each: norm, max |g|, zero count, non-finite
        count, dead-unit fraction.
      size: numpy ``[R]``: the elements each row's zero count is over.
      present: Static list of R bools: rows without a gradient read MISSING,
        but for their weight norm.
      onset: Whether to add ``metadata.ONSET_STAT_COLUMNS``.
      weight: float64 ``[R]`` weight norms, or None for MISSING.
      blank: Rows whose dead-unit fraction reads MISSING.
    """
    norm, max_abs, zeros, nonfinite, dead = columns
    # A row of no elements has no zeros either: 0 / 1 is its fraction 0.
    zero_fraction = zeros / np.maximum(np.asarray(size, np.float64), 1.0)
    # Without weights the column is masked: any [R] vector stands in for it.
    cols = [norm, max_abs, zero_fraction, nonfinite, dead, norm if weight is None else weight]
    if onset:
        # The onset columns of a window of one step: its norm if finite, and
        # offset 0 (this step) if it had a non-finite element.
        cols.append(reductions.where(tf.math.is_finite(norm), norm, MISSING))
        cols.append(tf.where(nonfinite > 0, tf.zeros_like(nonfinite), MISSING))
    keep = np.repeat(np.asarray(present, bool)[:, None], len(cols), axis=1)
    keep[:, _WEIGHT_NORM] = weight is not None
    keep[list(blank), _COL["dead_unit_fraction"]] = False
    return tf.cast(reductions.where(keep, tf.stack(cols, axis=1), MISSING), tf.float32)
