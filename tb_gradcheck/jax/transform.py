"""``monitor``: an optax ``GradientTransformation`` that takes per-layer gradient statistics inside ``jit``.

It passes the gradients through unchanged (or, wrapping an optimizer, the
optimizer's updates) and keeps in its own optax state what the host writer
(``tb_gradcheck.jax.GradientWriter``) writes: the per-parameter reductions
of the last written step (``Held``) and, with ``every_n_steps > 1``, the
running window since the previous write (``tb_gradcheck.running``, the same
code as the PyTorch writer's, in ``jax.numpy``). The state comes back with
the step's outputs like any optax state, so nothing leaves the device at
steps that are not written: no host callback, no transfer; the writer reads
the held statistics at written steps only.

A written step is one whose update index (the monitor's own count, from 0,
kept in its state, so it survives a checkpoint) is a multiple of
``every_n_steps``. What each step costs:

- ``every_n_steps=1``: every reduction at every step (``reduce.full``: a
  per-unit pass and a scaled norm pass per gradient, the weights' norms,
  and the updates' norms when it wraps an optimizer);
- a window's other steps: one pass per gradient for its sum of squares and
  sum of |g| (``reduce.quick``) and one ``lax.cond`` whose taken branch is empty, unless the step is
  written or a sum fell outside float32's exact band (a NaN, an Inf, a
  vanishing gradient): then the branch takes every reduction, so the
  window's norms are exact at any scale and its NaN counts exact.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from tb_gradcheck import running
from tb_gradcheck.jax import layout as layouts
from tb_gradcheck.jax import reduce


class Held(NamedTuple):
    """The reductions of the last written step, rows in depth order (``layout.Layout``).

    ``step``: the monitor's count at that step (-1 before the first).
    ``norm``, ``max_abs``: float ``[V]``; ``nonzero``, ``nonfinite``: integer
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


def monitor(optimizer=None, *, every_n_steps=1, order=None, unit_axes=None):
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
        the natural order of their paths (``layout``).
      unit_axes: ``{parameter name: 2}`` for parameters whose units are
        their last two axes (depthwise kernels), or None.

    Returns:
      An ``optax.GradientTransformation`` whose state is a ``MonitorState``
      (with the wrapped optimizer's state inside it).

    Raises:
      TypeError: ``optimizer`` is not a GradientTransformation.
      ValueError: ``every_n_steps`` is not a positive integer.
    """
    from tb_gradcheck import validate

    every_n_steps = validate.positive_int(every_n_steps, "every_n_steps")
    if optimizer is not None and not (hasattr(optimizer, "init") and hasattr(optimizer, "update")):
        raise TypeError(
            "Expected `optimizer` to be an optax.GradientTransformation (with init and update) or None. "
            f"Received: {type(optimizer).__name__}"
        )
    order = None if order is None else tuple(order)
    unit_axes = dict(unit_axes or {})

    def init(params):
        lay = layouts.make(params, every_n_steps, optimizer is not None, order, unit_axes)
        inner = optimizer.init(params) if optimizer is not None else optax.EmptyState()
        return initial_state(lay, _float_dtype(jax.tree_util.tree_leaves(params)), inner=inner)

    def update(updates, state, params=None, **extra_args):
        lay = state.layout
        grads = _rows(updates, lay, "gradients")
        weights = None if params is None else _rows(params, lay, "params")
        inner = state.inner
        if optimizer is not None:
            updates, inner = optimizer.update(updates, inner, params, **extra_args)
        applied = _rows(updates, lay, "updates") if optimizer is not None else None
        return updates, advance(state, grads, weights, applied, inner)

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


def advance(state, grads, weights=None, applied=None, inner=None):
    """The ``MonitorState`` after one step: its reductions taken, held if the step is written, added to the window.

    Traced inside the step (``jit``); nothing is read to the host.

    Args:
      state: The ``MonitorState`` before the step.
      grads: The step's gradients, one array per row, in row order.
      weights: The weights the gradients were taken at, in row order, or
        None (``weight_norm`` MISSING).
      applied: The updates the optimizer made, in row order, or None.
      inner: The wrapped optimizer's new state, or None to keep the state's.
    """
    lay = state.layout
    inner = state.inner if inner is None else inner
    count = state.count
    take = _taker(lay, grads, weights, applied, state.held)
    if lay.every_n_steps == 1:
        held = take()._replace(step=count)
        return MonitorState(lay, count + 1, held, None, inner)
    due = count % lay.every_n_steps == 0
    sums, magnitudes = (jnp.stack(v) for v in zip(*[reduce.quick(g) for g in grads]))
    skipped = jax.eval_shape(take)
    taken = jax.lax.cond(due | ~reduce.in_band(sums, magnitudes), take, lambda: _quick(skipped, sums))
    s = lay.structure
    columns = running.step_columns(
        jnp,
        taken.norm,
        taken.nonfinite.astype(taken.norm.dtype),
        jnp.ones(len(lay.names), bool),
        jnp.asarray(s.layer_matrix()),
        jnp.ones(len(s.layer_names), bool),
    )
    window = running.add(jnp, state.window, columns.astype(state.window.sum.dtype))
    fresh = _empty_window(lay, state.window.sum.dtype)
    held = _select(due, taken._replace(step=count, window=window), state.held)
    window = _select(due, fresh, window)
    return MonitorState(lay, count + 1, held, window, inner)


def _rows(tree, lay, what):
    """The leaves of ``tree`` in row order, checked against the layout's shapes (at trace time)."""
    leaves = jax.tree_util.tree_leaves(tree)
    if len(leaves) != len(lay.order):
        raise ValueError(
            f"Expected {what} with one array per parameter ({len(lay.order)}), as the pytree the monitor was "
            f"initialised with. Received: {len(leaves)} arrays"
        )
    out = [leaves[i] for i in lay.order]
    for x, shape, name in zip(out, lay.shapes, lay.names):
        if tuple(x.shape) != shape:
            raise ValueError(f"Expected {what} of {name!r} to have shape {shape}. Received: shape {tuple(x.shape)}")
    return out


def _taker(lay, grads, weights, applied, template):
    """A function of no arguments that takes every reduction of the step (``Held`` without step and window).

    In the dtypes of ``template`` (the state's ``Held``), so the state keeps
    its dtypes from step to step whatever the gradients' dtypes.
    """
    floats, counts = template.norm.dtype, template.nonzero.dtype

    def stack(values, dtype):
        return jnp.stack([jnp.asarray(v).astype(dtype) for v in values])

    def take():
        parts = [reduce.full(g, u) for g, u in zip(grads, lay.units)]
        norm, top, nonzero, nonfinite, dead = zip(*parts)
        weight = _missing(len(grads), floats) if weights is None else stack([reduce.norm(w) for w in weights], floats)
        update = _missing(len(grads), floats) if applied is None else stack([reduce.norm(u) for u in applied], floats)
        return Held(
            step=jnp.zeros((), jnp.int32),
            norm=stack(norm, floats),
            max_abs=stack(top, floats),
            nonzero=stack(nonzero, counts),
            nonfinite=stack(nonfinite, counts),
            dead=jnp.concatenate(dead),
            weight=weight,
            update=update,
            window=None,
        )

    return take


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
