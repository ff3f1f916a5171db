"""The statistics' definitions, once for every framework that is not TensorFlow: per-parameter reductions -> rows.

A framework adapter (``tb_gradcheck.torch``, ``tb_gradcheck.jax``) reduces
each gradient on its own device to a few numbers per parameter
(``Reductions``) and hands them over at a written step; this module turns
them into the stored layer and variable rows (``docs/stored_format.md``),
with the same definitions as TensorFlow's in-graph ``tb_gradcheck.tensorflow.statistics`` (twin tests hold the two):

- ``grad_norm``: the L2 norm; a layer's is the norm of all its parameters'
  gradients together (``sqrt`` of the sum of their squared norms);
- ``grad_max_abs``: the largest |g| (NaN if any element is NaN);
- ``grad_zero_fraction``: exact zeros over the elements that have a gradient (NaN counts as nonzero);
- ``grad_nonfinite``: NaN and Inf elements;
- ``dead_unit_fraction``: units whose every gradient element is exactly 0, over the units; a layer's unit j is dead
  when it is dead in every present parameter with the layer's unit count (``tb_gradcheck.tensorflow.units``); pruned
  units are left out (``deadunits``);
- ``weight_norm``: the L2 norm of the weights, a layer's as for grad_norm;
- the activation columns, from a layer's forward outputs (``activation_values``).

The window (``every_n_steps > 1``) is reduced on the adapter's device by ``running``, in NumPy/PyTorch/JAX's operations.
"""

import dataclasses
import math

import numpy as np

from tb_gradcheck.core import deadunits
from tb_gradcheck.core import metadata

# Stored in every gradient column of a row without a gradient; distinct from NaN, which is data.
MISSING = -1.0
_COL = {c: i for i, c in enumerate(metadata.STORED_STAT_COLUMNS)}
# What a window reduces at every step: one fused norm pass per gradient, and the non-finite count.
WINDOW_COLUMNS = ("grad_norm", "grad_nonfinite", "grad_norm_finite")


@dataclasses.dataclass
class Reductions:
    """One step's per-parameter reductions, on the host, float64, for the present parameters only.

    Attributes:
      present: bool ``[V]``: the parameter has a gradient this step.
      norm: ``[P]`` L2 norms of the present parameters' gradients (P = present.sum()).
      max_abs: ``[P]`` largest |g|, or None (a window's step between writes).
      nonzero: ``[P]`` nonzero element counts (NaN counts), or None.
      nonfinite: ``[P]`` NaN and Inf element counts.
      dead: bool ``[sum of the present parameters' units]``: per unit, in
        parameter order, whether its every element is exactly 0; or None.
      pruned: None, or bool like ``dead``: the unit is masked out (``deadunits``).
    """

    present: np.ndarray
    norm: np.ndarray
    nonfinite: np.ndarray
    max_abs: np.ndarray = None
    nonzero: np.ndarray = None
    dead: np.ndarray = None
    pruned: np.ndarray = None


def combine_norms(norms, structure):
    """float64 ``[L]``: each layer's norm from its parameters' ``norms`` ``[V]`` (0 where absent).

    Scaled by the layer's largest norm first, so float64 squares neither under- nor
    overflow; NaN anywhere in a layer gives NaN, +Inf (without NaN) +Inf.
    """
    norms = np.asarray(norms, np.float64)
    n = len(structure.layer_names)
    seg = np.asarray(structure.layer_of)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        top = np.zeros(n)
        np.maximum.at(top, seg, np.where(np.isnan(norms), 0.0, norms))
        scale = np.where(np.isfinite(top) & (top > 0), top, 1.0)
        squares = np.bincount(seg, (norms / scale[seg]) ** 2, n)
        out = np.where(np.isfinite(top), scale * np.sqrt(squares), top)
        out = np.where(top == 0, 0.0, out)
    has_nan = np.bincount(seg, np.isnan(norms), n) > 0
    return np.where(has_nan, np.nan, out)


def rows(reductions, structure, weight_norms=None, onset=False):
    """One step's stored statistics.

    Args:
      reductions: ``Reductions`` with every field.
      structure: The ``structure.Structure`` of the parameters.
      weight_norms: float64 ``[V]`` weight norms, or None for MISSING.
      onset: Include ``metadata.ONSET_STAT_COLUMNS`` (a window's ``last`` slab).

    Returns:
      ``(layer [L, C], variable [V, C])`` float32, columns
      ``metadata.stored_columns(1)`` (and the onset columns with ``onset``).
    """
    r = reductions
    present = np.asarray(r.present, bool)
    where = np.flatnonzero(present)
    n_var, n_layer = len(structure.variable_names), len(structure.layer_names)
    seg = np.asarray(structure.layer_of)
    sizes = np.asarray(structure.variable_sizes, np.float64)

    def spread(values, fill=0.0):
        out = np.full(n_var, fill, np.float64)
        out[where] = values
        return out

    norm_v, max_v = spread(r.norm), spread(r.max_abs)
    zeros_v = spread(sizes[where] - np.asarray(r.nonzero, np.float64))
    nonfinite_v = spread(r.nonfinite)
    dead_v, dead_l = deadunits.fractions(np.asarray(r.dead, bool), where, structure, r.pruned)
    present_l = np.bincount(seg, present, n_layer) > 0
    max_l = np.full(n_layer, 0.0)
    np.maximum.at(max_l, seg, np.where(np.isnan(max_v), 0.0, max_v))
    max_l = np.where(np.bincount(seg, np.isnan(max_v), n_layer) > 0, np.nan, max_l)
    variable = _assemble(norm_v, max_v, zeros_v, nonfinite_v, spread(dead_v), sizes * present, present, onset)
    layer = _assemble(
        combine_norms(norm_v, structure),
        max_l,
        np.bincount(seg, zeros_v, n_layer),
        np.bincount(seg, nonfinite_v, n_layer),
        dead_l,
        np.bincount(seg, sizes * present, n_layer),
        present_l,
        onset,
    )
    if weight_norms is not None:
        variable[:, _COL["weight_norm"]] = np.asarray(weight_norms, np.float32)
        layer[:, _COL["weight_norm"]] = combine_norms(weight_norms, structure).astype(np.float32)
    return layer, variable


def window_step(norm_v, nonfinite_v, present, structure):
    """float64 ``[L + V, 3]``: one step's ``WINDOW_COLUMNS`` (layers first), MISSING in rows without a gradient.

    ``norm_v`` and ``nonfinite_v`` are ``[V]`` (anything where absent). The
    NumPy form of what ``running.step_columns`` computes on a device; used
    for tests and for ``running``'s partial windows.
    """
    present = np.asarray(present, bool)
    norm_v = np.where(present, norm_v, 0.0)
    nonfinite_v = np.where(present, nonfinite_v, 0.0)
    seg = np.asarray(structure.layer_of)
    n_layer = len(structure.layer_names)
    norm = np.concatenate([combine_norms(norm_v, structure), norm_v])
    nonfinite = np.concatenate([np.bincount(seg, nonfinite_v, n_layer), nonfinite_v])
    here = np.concatenate([np.bincount(seg, present, n_layer) > 0, present])
    out = np.stack([norm, nonfinite, np.where(np.isfinite(norm), norm, MISSING)], axis=1)
    return np.where(here[:, None], out, MISSING)


def window_slabs(state, step, weight_norms, last=None):
    """``[A, L + V, C]`` float32 in ``metadata.AGGREGATES`` order from a window's state.

    Args:
      state: ``running.State`` as NumPy arrays (``running.to_numpy``).
      step: The write step, which onset offsets count back from.
      weight_norms: float32 ``[L + V]`` weight norms of the write step (every slab), or None for MISSING.
      last: ``[L + V, C]`` full statistics of the write step for the ``last``
        slab (``rows(..., onset=True)``, layers then variables), or None.
        Where it is MISSING the windowed column stays.

    Definitions as TensorFlow's ``window.Window``: NaN propagates through
    sum, max and min (a window that saw a NaN looks healthy in no
    aggregate); grad_norm_finite leaves non-finite steps out; the first
    non-finite step is stored as its offset before the write step.
    """
    count = np.asarray(state.count)
    seen = count > 0
    reduced = {
        "last": np.asarray(state.last),
        "mean": np.where(seen, state.sum / np.maximum(count, 1.0), MISSING),
        "max": np.where(seen, state.max, MISSING),
        "min": np.where(seen, state.min, MISSING),
        "sum": np.where(seen, state.sum, MISSING),
    }
    n_rows = count.shape[0]
    out = np.full((len(metadata.AGGREGATES), n_rows, len(metadata.STORED_STAT_COLUMNS)), MISSING, np.float64)
    for a, name in enumerate(metadata.AGGREGATES):
        for k, column in enumerate(WINDOW_COLUMNS):
            out[a, :, _COL[column]] = reduced[name][:, k]
    first = np.asarray(state.first_nonfinite)
    out[:, :, _COL["first_nonfinite_offset"]] = np.where(first >= 0, int(step) - first, MISSING)[None]
    if weight_norms is not None:
        out[:, :, _COL["weight_norm"]] = np.asarray(weight_norms)[None]
    if last is not None:
        last = np.asarray(last, np.float64)
        keep = np.zeros(len(metadata.STORED_STAT_COLUMNS), bool)
        keep[[_COL["first_nonfinite_offset"], _COL["weight_norm"]]] = True
        out[0] = np.where(keep | (last == MISSING), out[0], last)
    return out.astype(np.float32)


def optimizer_rows(names, structure, update_norms=None, weight_norms=None, before_clip=None):
    """float64 ``[L + V, len(names)]``: a write step's optimizer columns ``names``, layers first.

    The definitions of TensorFlow's ``tb_gradcheck.tensorflow.optimizer``: ``update_norm``
    is the norm of the change the step made to the weights (a layer's over
    all its parameters), ``update_to_weight`` that over the weights' norm
    before the update (MISSING where the weights are all 0: undefined, not
    Inf), ``grad_norm_before_clip`` the norm of the gradient before clipping.

    Args:
      names: Optimizer columns (``metadata.OPTIMIZER_STAT_COLUMNS``), in stored order.
      structure: The ``structure.Structure`` of the parameters.
      update_norms, weight_norms, before_clip: float64 ``[V]`` per-parameter
        norms, or None: the columns that need them are MISSING.
    """
    out = np.full((len(structure.layer_names) + len(structure.variable_names), len(names)), MISSING)

    def both(norms):
        norms = np.asarray(norms, np.float64)
        return np.concatenate([combine_norms(norms, structure), norms])

    values = {}
    if update_norms is not None:
        values["update_norm"] = both(update_norms)
        if weight_norms is not None:
            update, weight = values["update_norm"], both(weight_norms)
            with np.errstate(invalid="ignore", divide="ignore"):
                values["update_to_weight"] = np.where(weight > 0, update / np.where(weight > 0, weight, 1.0), MISSING)
    if before_clip is not None:
        values["grad_norm_before_clip"] = both(before_clip)
    for k, name in enumerate(names):
        if name in values:
            out[:, k] = values[name]
    return out


def with_last_columns(slabs, columns):
    """float32 ``[A, R, C + K]``: ``slabs`` ``[A, R, C]`` with ``columns`` ``[R, K]`` in the ``last`` slab, MISSING in the others.

    How the optimizer columns are stored (``docs/stored_format.md``): taken
    at the write step, so only the ``last`` slab has them.
    """
    slabs = np.asarray(slabs, np.float32)
    extra = np.full(slabs.shape[:2] + (np.shape(columns)[1],), MISSING, np.float32)
    extra[0] = columns
    return np.concatenate([slabs, extra], axis=2)


def _assemble(norm, max_abs, zeros, nonfinite, dead, size, present, onset):
    """Stacks the columns as float32, MISSING in absent rows; the weight column MISSING."""
    with np.errstate(invalid="ignore", divide="ignore"):
        zero_fraction = np.where(size > 0, zeros / np.maximum(size, 1.0), 0.0)
    cols = [norm, max_abs, zero_fraction, nonfinite, dead, np.full(len(norm), MISSING)]
    if onset:
        cols.append(np.where(np.isfinite(norm), norm, MISSING))
        cols.append(np.where(nonfinite > 0, 0.0, MISSING))
    out = np.stack(cols, axis=1)
    return np.where(np.asarray(present, bool)[:, None], out, MISSING).astype(np.float32)


def optimizer_values(structure, weight_norms, update_squares=None, before_clip=None, loss_scale=None, refused=None):
    """``{column: (layer [L], variable [V])}`` float32 of a write step's optimizer columns (``tb_gradcheck.tensorflow.optimizer``).

    Args:
      structure: The ``structure.Structure``.
      weight_norms: float64 ``[V]`` weight norms before the update.
      update_squares: float64 ``[V]`` squared norms of each parameter's
        update, or None (no update measured: those columns are left out,
        and so MISSING when filled in).
      before_clip: float64 ``[V]`` gradient norms before clipping, NaN or
        MISSING where a parameter had no gradient; or None.
      loss_scale: The loss scale this step's gradients were made with, or None.
      refused: Steps the loss scaler refused since the previous write (with ``loss_scale``).

    Definitions as ``tb_gradcheck.tensorflow.optimizer``: a layer's update and weight
    norms from its parameters' squared norms; ``update_to_weight`` is
    MISSING where the weights are all zero (undefined, not Inf).
    """
    seg = np.asarray(structure.layer_of)
    n_layer, n_var = len(structure.layer_names), len(structure.variable_names)
    out = {}
    if update_squares is not None:
        squares = np.asarray(update_squares, np.float64)
        weights = np.asarray(weight_norms, np.float64)
        update = (np.sqrt(bincount_layers(squares, structure)), np.sqrt(squares))
        weight = (np.sqrt(bincount_layers(weights**2, structure)), weights)
        out["update_norm"] = update
        out["update_to_weight"] = tuple(_ratio(u, w) for u, w in zip(update, weight))
    if before_clip is not None:
        norms = np.asarray(before_clip, np.float64)
        present = norms != MISSING
        layer = combine_norms(np.where(present, norms, 0.0), structure)
        layer_present = np.bincount(seg, present, n_layer) > 0
        out["grad_norm_before_clip"] = (np.where(layer_present, layer, MISSING), np.where(present, norms, MISSING))
    if loss_scale is not None:
        for name, value in (("loss_scale", loss_scale), ("refused_steps", refused)):
            out[name] = (np.full(n_layer, value), np.full(n_var, value))
    return {k: (np.asarray(a, np.float32), np.asarray(b, np.float32)) for k, (a, b) in out.items()}


def bincount_layers(values, structure):
    """float64 ``[L]``: the sum of ``values`` ``[V]`` over each layer's parameters."""
    return np.bincount(np.asarray(structure.layer_of), np.asarray(values, np.float64), len(structure.layer_names))


def _ratio(num, den):
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((num >= 0) & (den > 0), num / np.where(den > 0, den, 1.0), MISSING)


# What a framework hands over per layer row for the activation columns (``activation_columns``): sums over every
# forward call of the row's module at the written step, so several calls (gradient accumulation, a module used twice)
# combine exactly. MISSING in a row whose module did not run (elements 0), and in the unit and saturation pairs where
# no ReLU or Tanh/Sigmoid module follows.
ACTIVATION_SUMS = (
    "squares",  # sum of a**2
    "elements",  # elements summed
    "max_abs",  # largest |a|, NaN if any is NaN
    "nonfinite",  # NaN and Inf elements
    "dead_units",  # units with no positive value (nor a NaN) in any call
    "units",  # units of the output a ReLU module takes (0: none does)
    "saturated",  # elements of a following Tanh/Sigmoid's output near a bound
    "squashed",  # elements of that output (0: no Tanh/Sigmoid follows)
)
# Saturated: within this fraction of a tanh's or sigmoid's range from a bound (docs/stored_format.md says why); the
# bounds it makes on the activation's output (|tanh|, sigmoid's distance from 1/2) and, for a hook before it, input.
SATURATION_BAND = 0.01
TANH_OUTPUT, SIGMOID_OUTPUT = 1 - 2 * SATURATION_BAND, 0.5 - SATURATION_BAND
TANH_INPUT, SIGMOID_INPUT = math.atanh(TANH_OUTPUT), math.log((1 - SATURATION_BAND) / SATURATION_BAND)


def activation_values(structure, sums):
    """``{column: (layer [L], variable [V])}`` float32 of ``activation_columns``, on the host, from the sums ``[L, 8]``.

    Variable rows (``structure.variable_names``) are MISSING: an output is a module's, not one parameter's.
    """
    sums = np.asarray(sums, np.float64).reshape(len(structure.layer_names), len(ACTIVATION_SUMS))
    with np.errstate(invalid="ignore", divide="ignore"):
        layer = activation_columns(sums, np)
    missing_v = np.full(len(structure.variable_names), MISSING, np.float32)
    return {k: (np.asarray(v, np.float32), missing_v) for k, v in layer.items()}


def activation_columns(sums, xp):
    """``metadata.ACTIVATION_STAT_COLUMNS`` defined: ``{column: float64 [L]}`` from float64 sums ``[L, 8]``, in ``xp``.

    ``xp``: NumPy on the host, or ``keras.ops`` inside a traced TensorFlow step (the same definitions, compiled with
    it). ``act_rms`` is ``sqrt(squares / elements)``: NaN or Inf anywhere gives NaN or Inf, as data; a row whose
    module did not run is MISSING.
    """
    col = {name: sums[:, k] for k, name in enumerate(ACTIVATION_SUMS)}
    ran = col["elements"] > 0

    def share(part, whole):
        return xp.where(ran & (col[whole] > 0), col[part] / xp.maximum(col[whole], 1.0), MISSING)

    return {
        "act_rms": xp.where(ran, xp.sqrt(col["squares"] / xp.maximum(col["elements"], 1.0)), MISSING),
        "act_max_abs": xp.where(ran, col["max_abs"], MISSING),
        "act_nonfinite": xp.where(ran, col["nonfinite"], MISSING),
        "act_dead_fraction": share("dead_units", "units"),
        "act_saturated_fraction": share("saturated", "squashed"),
    }


def fill(layer, variable, names, values):
    """``[A, R, C]`` stats with the optimizer columns ``names`` appended: the value in the ``last`` slab, MISSING in the others.

    The NumPy form of ``tb_gradcheck.tensorflow.optimizer.fill``. ``values`` is
    ``optimizer_values``' dict (None: every column MISSING, a partial
    window written at close); a name it lacks is MISSING.
    """
    values = values or {}
    out = []
    for k, part in enumerate((np.asarray(layer, np.float32), np.asarray(variable, np.float32))):
        extra = np.full(part.shape[:2] + (len(names),), MISSING, np.float32)
        for j, name in enumerate(names):
            if name in values:
                extra[0, :, j] = values[name][k]
        out.append(np.concatenate([part, extra], axis=-1))
    return tuple(out)
