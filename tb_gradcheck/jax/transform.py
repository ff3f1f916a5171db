"""``monitor``: an optax ``GradientTransformation`` that takes per-layer gradient statistics inside ``jit``.

It passes the gradients through unchanged (or, wrapping an optimizer, the optimizer's updates) and keeps
in its own optax state what the host writer (``tb_gradcheck.jax.GradientWriter``) writes: the per-parameter
reductions of the last written step (``Held``) and, with ``every_n_steps > 1``, the running window since the
previous write (``tb_gradcheck.core.running``, the same code as the PyTorch writer's, in ``jax.numpy``). The
state comes back with the step's outputs like any optax state, so nothing leaves the device at steps that are
not written: no host callback, no transfer; the writer reads the held statistics at written steps only.

A written step is one whose update index (the monitor's own count, from 0,
kept in its state, so it survives a checkpoint) is a multiple of
``every_n_steps``. What each step costs:

- ``every_n_steps=1``: every reduction at every step (``reductions.full``: a
  per-unit pass and a scaled norm pass per gradient, the weights' norms,
  and the updates' norms when it wraps an optimizer);
- a window's other steps: one pass per gradient for its sum of squares and
  sum of |g| (``reductions.quick``) and one ``lax.cond`` whose taken branch is empty, unless the step is
  written or a sum fell outside float32's exact band (a NaN, an Inf, a
  vanishing gradient): then the branch takes every reduction, so the
  window's norms are exact at any scale and its NaN counts exact.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tb_gradcheck.core import running
from tb_gradcheck.jax import applied
from tb_gradcheck.jax import layout
from tb_gradcheck.jax import reductions
from tb_gradcheck.jax import stacks


class Held(NamedTuple):
    """The reductions of the last written step, rows in depth order (``layout.Layout``).

    ``step``: the monitor's count at that step (-1 before the first).
    ``norm``, ``max_abs``: float ``[V]`` (``norm`` -1: no gradient, ``advance``); ``nonzero``, ``nonfinite``: integer
    ``[V]``; ``dead``: bool ``[sum of units]``; ``weight``: ``[V]`` weight
    norms before the update (-1 when the optimizer was not given params);
    ``update``: ``[V]`` norms of the wrapped optimizer's updates (-1 when it
    wraps none); ``window``: the ``running.State`` that ended at that step,
    or None when every step is written.
    """

    step: object
    norm: object
    max_abs: object
    nonzero: object
    nonfinite: object
    dead: object
    weight: object
    update: object
    window: object


@jax.tree_util.register_pytree_with_keys_class
class MonitorState:
    """The monitor's optax state. Its ``Layout`` rides as pytree aux data, so the host writer needs nothing else.

    Attributes:
      layout: The ``layout.Layout`` of the parameters (static).
      count: int32 scalar, updates seen.
      held: ``Held``, the last written step.
      window: ``running.State`` of the window under way, or None.
      inner: The wrapped optimizer's state, or ``optax.EmptyState()``.
    """

    _FIELDS = ("count", "held", "window", "inner")

    def __init__(self, layout, count, held, window, inner):
        self.layout = layout
        self.count = count
        self.held = held
        self.window = window
        self.inner = inner

    def tree_flatten_with_keys(self):
        return tuple((jax.tree_util.GetAttrKey(f), getattr(self, f)) for f in self._FIELDS), self.layout

    @classmethod
    def tree_unflatten(cls, layout, children):
        return cls(layout, *children)

    def __repr__(self):
        return f"MonitorState(rows={len(self.layout.names)}, every_n_steps={self.layout.every_n_steps})"


def monitor(optimizer=None, *, every_n_steps=1, order=None, unit_axes=None, stacked=None):
    """Per-layer gradient statistics for the Gradients tab, as an optax transformation.

    Chained in front of an optimizer it records the gradients it is given
    and passes them on unchanged; wrapped around one it also records what
    the optimizer did (``update_norm``, ``update_to_weight``):

        tx = optax.chain(tb_gradcheck.jax.monitor(every_n_steps=10), optax.adamw(1e-3))
        tx = tb_gradcheck.jax.monitor(optax.adamw(1e-3), every_n_steps=10)

    In front of ``optax.clip_by_global_norm`` (or around a chain that
    clips), the gradients it records are those before clipping. Call
    ``GradientWriter.write(opt_state, step)`` after every step (it reads
    the device only at written steps).

    Args:
      optimizer: An ``optax.GradientTransformation`` to wrap, or None.
      every_n_steps: Int, default 1. Write every step, or every N steps with
        the last, mean, max, min and sum of the gradient norm and NaN/Inf
        count over the N steps, as ``tb_gradcheck.GradientWriter`` does.
      order: Parameter names in depth order (``depth_order``), or None for
        the natural order of their paths (``layout``). A ``depth_order`` of
        the loss also says which parameters it has no gradient path to:
        their gradient rows are MISSING (``jax.grad``'s zeros there are not
        measured as a dead layer). A whole model's
        order serves a monitor that sees part of it (inside
        ``optax.masked`` or ``optax.multi_transform``): the names it does
        not see are passed over.
      unit_axes: ``{parameter name: 2}`` for parameters whose units are
        their last two axes (depthwise kernels), or None.
      stacked: ``{name prefix: axes}``: the parameters under each prefix
        stack ``axes`` leading axes of layers (a block run by
        ``lax.scan``), and each slice gets a row of its own
        (``{"ScanBlock_0": 1}``: ``ScanBlock_0/3/Dense_0/kernel`` is layer
        3's kernel; ``stacks``). None: what ``order`` found, when it is a
        ``depth_order``; else none ({} turns that off).

    Returns:
      An ``optax.GradientTransformation`` whose state is a ``MonitorState``
      (with the wrapped optimizer's state inside it).

    Raises:
      TypeError: ``optimizer`` is not a GradientTransformation, ``order`` a list of names, ``stacked`` a dict.
      ValueError: ``every_n_steps`` is not a positive integer.
    """
    from tb_gradcheck.core import validate

    every_n_steps = validate.positive_int(every_n_steps, "every_n_steps")
    if optimizer is not None and not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        raise TypeError(
            "Expected `optimizer` to be an optax.GradientTransformation (with init and update) or None. "
            f"Received: {type(optimizer).__name__}"
        )
    # What depth_order found may be of a whole model the monitor sees part
    # of (optax.masked): make passes over stacks not in this pytree. What
    # the caller names must be there.
    found = stacks.normalise(getattr(order, "stacked", None)) if stacked is None else {}
    unreached = tuple(getattr(order, "unreached", ()))
    stacked = stacks.normalise(stacked)
    if order is not None and (isinstance(order, str) or not all(isinstance(n, str) for n in order)):
        raise TypeError(
            "Expected `order` to be a list of parameter names (tb_gradcheck.jax.depth_order's) or None. "
            f"Received: {type(order).__name__} {str(order)[:80]!r}"
        )
    order = None if order is None else tuple(order)
    unit_axes = dict(unit_axes or {})

    def init(params):
        model = applied.model_params(params)  # an optax.lookahead's fast weights
        lay = layout.make(model, every_n_steps, optimizer is not None, order, unit_axes, stacked, found, unreached)
        inner = optimizer.init(params) if optimizer is not None else optax.EmptyState()
        return initial_state(lay, _float_dtype(jax.tree_util.tree_leaves(params)), inner=inner)

    def update(updates, state, params=None, **extra_args):
        lay = state.layout
        grads = _rows(updates, lay, "gradients")
        weights = None if params is None else _rows(applied.model_params(params), lay, "params")
        inner = state.inner
        if optimizer is not None:
            updates, inner = optimizer.update(updates, inner, params, **extra_args)
        made = _rows(applied.change(updates, params), lay, "updates") if optimizer is not None else None
        return updates, advance(state, grads, weights, made, inner, lay.reached or None)

    return optax.GradientTransformationExtraArgs(init, update)


def initial_state(lay, dtype, count=0, inner=None):
    """A ``MonitorState`` before its first step: nothing held, an empty window.

    The monitor's ``init``, and the entry for a trainer that is not optax's
    (``tb_gradcheck.jax.keras``), which makes its ``layout.Layout`` itself.

    Args:
      lay: The ``layout.Layout`` of the rows.
      dtype: The reductions' float dtype (float32, or float64 under x64).
      count: Int, default 0: the index the first step gets (the written
        steps are those whose index is a multiple of ``every_n_steps``).
      inner: The wrapped optimizer's state, or None for ``optax.EmptyState()``.
    """
    window = _empty_window(lay, dtype) if lay.every_n_steps > 1 else None
    inner = optax.EmptyState() if inner is None else inner
    return MonitorState(lay, jnp.asarray(count, jnp.int32), _empty_held(lay, dtype, window), window, inner)


def advance(state, grads, weights=None, applied=None, inner=None, present=None):
    """The ``MonitorState`` after one step: its reductions taken, held if the step is written, added to the window.

    Traced inside the step (``jit``); nothing is read to the host.

    Args:
      state: The ``MonitorState`` before the step.
      grads: The step's gradients as ``_rows`` gives them: ``[(array,
        stacked axes)]``, each leaf once in the order of its first row
        (``[(g, 0) for g in grads]`` in row order without stacks).
      weights: The weights the gradients were taken at, in the same form,
        or None (``weight_norm`` MISSING).
      applied: The updates the optimizer made, in the same form, or None.
      inner: The wrapped optimizer's new state, or None to keep the state's.
      present: Per row, whether it has a gradient (a static tuple of bools),
        or None for all. A row without one (the loss does not depend on its
        parameter: a head without a loss, a path behind ``stop_gradient``) is
        held with norm -1, which the writer stores as MISSING, as the
        TensorFlow and PyTorch writers store a variable whose gradient is None;
        its gradient, zeros, is not measured as a dead one.
    """
    lay = state.layout
    inner = state.inner if inner is None else inner
    count = state.count
    s = lay.structure
    present = np.ones(len(lay.names), bool) if present is None else np.asarray(present, bool)
    take = _taker(lay, grads, weights, applied, state.held)
    if lay.every_n_steps == 1:
        held = _absent(take(), present)._replace(step=count)
        return MonitorState(lay, count + 1, held, None, inner)
    due = count % lay.every_n_steps == 0
    sums, magnitudes = (_in_rows(lay, v) for v in zip(*[_quick_part(g, axes) for g, axes in grads]))
    skipped = jax.eval_shape(take)
    taken = jax.lax.cond(due | ~reductions.in_band(sums, magnitudes), take, lambda: _quick(skipped, sums))
    taken = _absent(taken, present)
    columns = running.step_columns(
        jnp,
        taken.norm,
        taken.nonfinite.astype(taken.norm.dtype),
        jnp.asarray(present),
        jnp.asarray(s.layer_matrix()),
        jnp.asarray((s.layer_matrix() & present).any(axis=1)),
    )
    window = running.add(jnp, state.window, columns.astype(state.window.sum.dtype))
    fresh = _empty_window(lay, state.window.sum.dtype)
    held = _select(due, taken._replace(step=count, window=window), state.held)
    window = _select(due, fresh, window)
    return MonitorState(lay, count + 1, held, window, inner)


def _rows(tree, lay, what):
    """``[(leaf, stacked axes)]``: each leaf of ``tree`` once, in the order of its first row, checked (at trace time).

    Without stacked parameters, one leaf per row in row order; a stacked
    leaf's reductions give one value per slice, which ``_in_rows`` puts in
    row order.
    """
    leaves = jax.tree_util.tree_leaves(tree)
    parts = _parts(lay)
    if len(leaves) != len(parts):
        raise ValueError(
            f"Expected {what} with one array per parameter ({len(parts)}), as the pytree the monitor was "
            f"initialised with. Received: {len(leaves)} arrays"
        )
    out = []
    for leaf, shape, name, axes, _ in parts:
        x = leaves[leaf]
        if tuple(x.shape) != shape:
            raise ValueError(f"Expected {what} of {name!r} to have shape {shape}. Received: shape {tuple(x.shape)}")
        out.append((x, axes))
    return out


@functools.lru_cache(maxsize=64)
def _parts(lay):
    """``[(leaf, shape, row name, stacked axes, units)]`` in the order of the leaves' first rows."""
    out = []
    for leaf, row in stacks.parts(lay):
        dims = lay.stacks[row] if lay.stacks else ()
        out.append((leaf, tuple(dims) + tuple(lay.shapes[row]), lay.names[row], len(dims), lay.units[row]))
    return out


def _in_rows(lay, values, dtype=None):
    """``[R]``: per-leaf reductions (``_rows`` order; a scalar, or one value per slice of a stacked leaf) in row order."""
    cast = (lambda v: v) if dtype is None else (lambda v: jnp.asarray(v).astype(dtype))
    rows, _ = stacks.gathers(lay)
    if rows is None:
        return jnp.stack([cast(v) for v in values])
    return jnp.concatenate([reductions.flat(cast(v)) for v in values])[rows]


def _quick_part(g, axes):
    return reductions.quick(g) if axes == 0 else reductions.quick_slices(g, axes)


def _full_part(g, units, axes):
    return reductions.full(g, units) if axes == 0 else reductions.full_slices(g, units, axes)


def _norm_part(x, axes):
    return reductions.norm(x) if axes == 0 else reductions.norm_slices(x, axes)


def _taker(lay, grads, weights, applied, template):
    """A function of no arguments that takes every reduction of the step (``Held`` without step and window).

    In the dtypes of ``template`` (the state's ``Held``), so the state keeps
    its dtypes from step to step whatever the gradients' dtypes.
    """
    floats, counts = template.norm.dtype, template.nonzero.dtype
    units = [u for _, _, _, _, u in _parts(lay)]

    def take():
        parts = [_full_part(g, u, axes) for (g, axes), u in zip(grads, units)]
        norm, top, nonzero, nonfinite, dead = zip(*parts)
        _, dead_rows = stacks.gathers(lay)
        if dead_rows is None:
            dead = jnp.concatenate(dead)
        else:  # one sharding for all (a Dense's units may be split over devices, a slice's flags are not)
            dead = jnp.concatenate([reductions.flat(d) for d in dead])[dead_rows]
        weight = (
            _missing(len(lay.names), floats)
            if weights is None
            else _in_rows(lay, [_norm_part(w, axes) for w, axes in weights], floats)
        )
        update = (
            _missing(len(lay.names), floats)
            if applied is None
            else _in_rows(lay, [_norm_part(u, axes) for u, axes in applied], floats)
        )
        return Held(
            step=jnp.zeros((), jnp.int32),
            norm=_in_rows(lay, norm, floats),
            max_abs=_in_rows(lay, top, floats),
            nonzero=_in_rows(lay, nonzero, counts),
            nonfinite=_in_rows(lay, nonfinite, counts),
            dead=dead,
            weight=weight,
            update=update,
            window=None,
        )

    return take


def _absent(held, present):
    """``held`` with norm -1 (no gradient) in the rows ``present`` (bool ``[R]``, NumPy) leaves out."""
    if present.all():
        return held
    return held._replace(norm=jnp.where(jnp.asarray(present), held.norm, -1.0).astype(held.norm.dtype))


def _missing(n, dtype):
    return jnp.full(n, -1.0, dtype)


def _quick(shapes, sums):
    """A window's step between writes: the norms from the sums (in band, so exact), nothing else taken."""
    out = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    return out._replace(norm=jnp.sqrt(sums).astype(shapes.norm.dtype))


def _select(pick_first, first, second):
    return jax.tree_util.tree_map(lambda a, b: jnp.where(pick_first, a, b), first, second)


def _float_dtype(leaves):
    """The dtype the reductions come out in: float64 if a parameter is float64, else float32."""
    return jnp.float64 if any(getattr(x, "dtype", None) == jnp.float64 for x in leaves) else jnp.float32


def _count_dtype(dtype):
    return jnp.int64 if dtype == jnp.float64 else jnp.int32


def _empty_window(lay, dtype):
    n_rows = len(lay.structure.layer_names) + len(lay.names)
    return running.init(lambda shape, value: jnp.full(shape, value, dtype), n_rows)


def _empty_held(lay, dtype, window):
    n = len(lay.names)
    counts = _count_dtype(dtype)

    def missing():
        return jnp.full(n, -1.0, dtype)

    # Every leaf a buffer of its own: a state is donated to the next step
    # (``jax.jit(..., donate_argnums=...)``), and one buffer in two leaves
    # would be donated twice.
    return Held(
        step=jnp.full((), -1, jnp.int32),
        norm=missing(),
        max_abs=missing(),
        nonzero=jnp.zeros(n, counts),
        nonfinite=jnp.zeros(n, counts),
        dead=jnp.zeros(int(np.sum(lay.units)), bool),
        weight=missing(),
        update=missing(),
        window=None if window is None else _empty_window(lay, dtype),
    )
