"""What a unit is for ``dead_unit_fraction``, and its per-unit reductions.

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
- an EinsumDense's kernel and bias (a MultiHeadAttention projection's
  ``[dim, heads, key_dim]`` and ``[heads, key_dim]``): every output axis
  they carry, one unit per (head, dimension); ``unit_axes`` finds them too;
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

Cost: ``max |g|`` and dead units both come from one per-unit reduction of the
gradient, the largest ``|g|`` of each unit (``reduce_max`` of ``abs`` over
every axis but the unit axes): a unit is dead when its largest ``|g|`` is 0.
On a CPU the ``abs`` pass and one reduction over the rows of a Dense kernel
cost less than the two reductions (``reduce_max`` and ``reduce_min``) that
gave the same numbers before: measured on 256 x 256 float32 kernels, about
24 us against 31 us each, since a reduction over the leading axis is the
slow kind (docs/benchmarks.md, "The written step").
"""

import numpy as np
import tensorflow as tf

from tb_gradcheck.keras.variables import unit_axes  # noqa: F401  (re-exported: GradientWriter's docs name units.unit_axes)


def trailing_axes(shape, name, overrides):
    """How many trailing axes of a variable index its units: 1 from rank 1 up, 0 for a scalar, or the override."""
    return min(len(shape), overrides.get(name, 1))


def peaks(values, units):
    """Largest ``|element|`` of each unit of ``values`` (units on the trailing axes): ``[units]``.

    In the dtype of ``values``, not clamped (a unit with no elements reduces
    to -inf): ``fractions`` casts and clamps every variable's at once (each
    small op costs a few microseconds on a CPU, so per-variable work is kept
    to this reduction). NaN propagates (``reduce_max`` keeps it on a CPU and in XLA).
    """
    if units == 0:
        return tf.zeros([0], values.dtype)
    magnitude = tf.abs(values)
    if values.shape.rank == 1 and values.shape[0] == units:
        return magnitude  # a vector of units (a bias): each unit is one element, nothing to reduce
    # A matrix whose columns are the units (a Dense kernel) is reduced as it is: no reshape op.
    per_unit = magnitude if values.shape.rank == 2 and values.shape[1] == units else tf.reshape(magnitude, [-1, units])
    return tf.reduce_max(per_unit, axis=0)


def joined64(tensors, join=tf.concat):
    """``join(tensors, 0)`` (``tf.concat`` or ``tf.stack``) as float64: one cast for all of them when they share a dtype."""
    if len({t.dtype for t in tensors}) == 1:
        return tf.cast(join(tensors, 0), tf.float64)
    return join([tf.cast(t, tf.float64) for t in tensors], 0)


def fractions(peak, where, rows):
    """max |g| and dead-unit fraction per present variable, and dead-unit fraction per layer.

    Args:
      peak: Per present variable, ``[units]``: each unit's largest
        ``|element|`` of the gradient (``peaks``).
      where: Indices (into ``rows``) of the present variables.
      rows: The ``variables.Rows``.

    Returns:
      ``(max_abs [P], dead_fraction [P], layer_dead_fraction [L])``, float64.


    A layer's unit j is dead when unit j is dead in every present variable of
    the layer that has the layer's unit count (see the module docstring).
    """
    n = len(where)
    units = [rows.variable_units[i] for i in where]
    unit_var = tf.constant(np.repeat(np.arange(n), units), tf.int32)
    # Clamped at 0: a unit with no elements (no slices, a zero-length axis)
    # reduces to -inf, and is dead, as untouched slice rows (zeros) are.
    # Clamping cannot make a live unit look dead (that needs max |g| = 0, so
    # every element 0). NaN stays NaN (tf.maximum keeps it), and is not 0.
    peak = tf.maximum(joined64(peak), 0.0)
    # Empty segments reduce to -inf; the outer maximum with 0 fixes that and keeps NaN.
    max_abs = tf.maximum(segment_max(peak, unit_var, n), 0.0)
    dead = tf.cast(tf.equal(peak, 0.0), tf.float64)
    dead_v = tf.math.unsorted_segment_sum(dead, unit_var, n) / np.maximum(units, 1)
    # Layer units: slot offset[layer] + j for unit j of a variable with the
    # layer's unit count; every other unit goes to one spare slot at the end.
    offsets = np.concatenate([[0], np.cumsum(rows.layer_units)])
    spare = int(offsets[-1])
    slots = np.concatenate(
        [
            offsets[rows.layer_of[i]] + np.arange(u) if u == rows.layer_units[rows.layer_of[i]] else np.full(u, spare)
            for i, u in zip(where, units)
        ]
    ).astype(np.int32)
    all_dead = tf.math.unsorted_segment_min(dead, tf.constant(slots), spare + 1)[:spare]
    # A slot no present variable covers reduces to +inf; its layer's value is
    # blanked by the caller, so clamp only to keep the sum finite.
    all_dead = tf.minimum(all_dead, 1.0)
    slot_layer = tf.constant(np.repeat(np.arange(len(rows.layer_units)), rows.layer_units), tf.int32)
    dead_l = tf.math.unsorted_segment_sum(all_dead, slot_layer, len(rows.layer_units)) / np.maximum(rows.layer_units, 1)
    return max_abs, dead_v, dead_l


def layers_without_units(rows, present):
    """Layers none of whose present variables has the layer's unit count."""
    covered = {
        rows.layer_of[i]
        for i, p in enumerate(present)
        if p and rows.variable_units[i] == rows.layer_units[rows.layer_of[i]]
    }
    return [j for j in range(len(rows.layer_names)) if j not in covered]


def segment_max(values, segments, n):
    """unsorted_segment_max that propagates NaN (the op itself keeps or drops a NaN depending on order)."""
    has_nan = tf.math.unsorted_segment_max(tf.cast(tf.math.is_nan(values), tf.int32), segments, n) > 0
    return tf.where(has_nan, tf.constant(np.nan, values.dtype), tf.math.unsorted_segment_max(values, segments, n))
