"""A window's running reductions (``every_n_steps > 1``), kept on the training device between writes.

Written once, in the array operations NumPy, PyTorch and JAX share
(``where``, ``maximum``, ``minimum``, ``sum(axis=)``, ``sqrt``, ``isfinite``,
``stack``, ``concatenate``): an adapter passes its array module as ``xp``.
Every function is pure (a new ``State`` out), so the same code is a
PyTorch writer's device state and a JAX optax transform's state inside
``jit``; no value is read back to the host between writes.

The definitions are those of TensorFlow's ``window.Window``; the host turns
a written state into stored slabs with ``rowstats.window_slabs``.
"""

from typing import NamedTuple

from tb_gradcheck.core.rowstats import MISSING


class State(NamedTuple):
    """Per row (layers, then parameters), over the steps since the last write.

    ``last``, ``sum``, ``max``, ``min``, ``count``: ``[R, 3]`` over
    ``rowstats.WINDOW_COLUMNS``. ``first_nonfinite``: ``[R]``, the index
    (steps since the window began) of the first step with a non-finite
    gradient element, -1 if none: a small integer, exact in float32 where a
    training step (up to 2**63) would not be. ``steps``: steps added.
    """

    last: object
    sum: object
    max: object
    min: object
    count: object
    first_nonfinite: object
    steps: object


def init(full, n_rows):
    """An empty window: ``full(shape, value)`` makes an array of the adapter's dtype and device."""
    shape = (n_rows, 3)
    return State(
        last=full(shape, MISSING),
        sum=full(shape, 0.0),
        max=full(shape, -float("inf")),
        min=full(shape, float("inf")),
        count=full(shape, 0.0),
        first_nonfinite=full((n_rows,), -1.0),
        steps=full((), 0.0),
    )


def step_columns(xp, norm_v, nonfinite_v, present, layer_matrix, layer_present):
    """``[..., L + V, 3]``: one step's ``WINDOW_COLUMNS``, layers first, MISSING in rows without a gradient.

    Args:
      xp: The array module (numpy, torch, jax.numpy).
      norm_v: ``[..., V]`` gradient norms (any value where absent); leading
        axes are steps (``add_steps`` takes several at once).
      nonfinite_v: ``[..., V]`` non-finite element counts (likewise).
      present: bool ``[..., V]`` array: the parameter has a gradient.
      layer_matrix: bool ``[L, V]`` array (``Structure.layer_matrix``).
      layer_present: bool ``[..., L]`` array: some parameter of the layer has one.

    A layer's norm is ``sqrt`` of its parameters' squared norms summed in the
    arrays' dtype, at any scale (``_layer_norms``). NaN stays in its own layer.
    """
    zero = xp.where(present, norm_v, 0.0) * 0.0  # a zero of the arrays' dtype and device
    norm_v = xp.where(present, norm_v, zero)
    nonfinite_v = xp.where(present, nonfinite_v, zero)
    norm_l = _layer_norms(xp, norm_v, layer_matrix)
    nonfinite_l = xp.sum(xp.where(layer_matrix, nonfinite_v[..., None, :], 0.0), axis=-1)
    norm = xp.concatenate([norm_l, norm_v], axis=-1)
    nonfinite = xp.concatenate([nonfinite_l, nonfinite_v], axis=-1)
    here = xp.concatenate([layer_present, present], axis=-1)
    out = xp.stack([norm, nonfinite, xp.where(xp.isfinite(norm), norm, MISSING)], axis=-1)
    return xp.where(here[..., None], out, MISSING)


def _layer_norms(xp, norm_v, layer_matrix):
    """``[..., L]``: ``sqrt`` of each layer's squared parameter norms, exact where the squares would under- or overflow.

    Float32 squares overflow for norms above ~1.8e19 and underflow below
    ~1e-19 (an exploding layer would read Inf, a vanishing one 0). The sum
    is also taken with the norms scaled by 2**-64 and by 2**64, and the one
    in range is kept: the plain sum where it is finite and not tiny (every
    square it lost is then negligible), the scaled-down one where it
    overflowed (its squares of norms above 1e-19 are exact, and smaller ones
    do not count beside an overflowing one), the scaled-up one where every
    norm is below 1e-18. Three sums over ``[L, V]``: nothing beside the
    gradients. NaN gives NaN in all three.
    """

    def root_sum_of_squares(scale):
        scaled = norm_v * scale
        return xp.sqrt(xp.sum(xp.where(layer_matrix, (scaled * scaled)[..., None, :], 0.0), axis=-1))

    plain = root_sum_of_squares(1.0)
    big = root_sum_of_squares(2.0**-64) * 2.0**64
    tiny = root_sum_of_squares(2.0**64) * 2.0**-64
    return xp.where(plain < 1e-18, tiny, xp.where(xp.isfinite(plain), plain, big))


def steps_flagged(xp, x):
    """``x`` (``[..., R, 3]`` step columns) with ``grad_nonfinite`` as 1 where some element was not finite, else 0.

    A window's ``sum``, ``max``, ``min`` (and so ``mean``) of ``grad_nonfinite``
    count *steps* with a non-finite gradient; its ``last`` slab keeps the
    element count. One definition for every writer (docs/statistics.md): the
    PyTorch writer sees only whether a norm is finite between writes (one
    multi-tensor kernel, no per-tensor count), so the others count as it does.
    """
    counts = x[..., 1:2]
    flags = xp.where(counts > 0, counts * 0.0 + 1.0, counts * 0.0)
    return xp.concatenate([x[..., :1], flags, x[..., 2:]], axis=-1)


def uncounted(xp, last):
    """A window's ``last`` step columns whose grad_nonfinite flagged NaN and Inf: MISSING where it did, not 1.

    Writers that flag a step's non-finite elements between writes instead of
    counting them (PyTorch; TensorFlow under XLA, ``window.Window.add``)
    have no count for the last step of a partial window written at close,
    where the ``last`` slab holds an element count (docs/stored_format.md).
    """
    counts = last[..., 1:2]
    return xp.concatenate([last[..., :1], xp.where(counts > 0, MISSING, counts), last[..., 2:]], axis=-1)


def add(xp, state, x):
    """``state`` with one step's ``step_columns`` ``x`` added."""
    here = x != MISSING  # NaN != MISSING: NaN is data
    bad = x[:, 1] > 0  # MISSING (-1) is not
    flagged = steps_flagged(xp, x)
    return State(
        last=x,
        sum=state.sum + xp.where(here, flagged, 0.0),
        max=xp.where(here, xp.maximum(state.max, flagged), state.max),
        min=xp.where(here, xp.minimum(state.min, flagged), state.min),
        count=state.count + xp.where(here, 1.0, 0.0),
        first_nonfinite=xp.where(bad & (state.first_nonfinite < 0), state.steps, state.first_nonfinite),
        steps=state.steps + 1.0,
    )


def add_steps(xp, state, xs):
    """``state`` with several steps' ``step_columns`` ``xs`` ``[S, R, 3]`` added, oldest first.

    The same state as ``add`` once per step, in a fixed number of array
    operations whatever ``S``: a device adapter keeps each step's columns
    (a store or two per step) and adds them every few steps at once.
    """
    here = xs != MISSING  # NaN != MISSING: NaN is data
    bad = xs[..., 1] > 0  # [S, R]; MISSING (-1) is not
    seen_bad = xp.any(bad, axis=0)
    first = xp.argmax(bad * 1.0, axis=0) * 1.0 + state.steps  # the first True along the steps
    flagged = steps_flagged(xp, xs)
    return State(
        last=xs[-1],
        sum=state.sum + xp.sum(xp.where(here, flagged, 0.0), axis=0),
        # NaN propagates through amax and maximum; -inf where absent changes nothing.
        max=xp.maximum(state.max, xp.amax(xp.where(here, flagged, -float("inf")), axis=0)),
        min=xp.minimum(state.min, xp.amin(xp.where(here, flagged, float("inf")), axis=0)),
        count=state.count + xp.sum(xp.where(here, 1.0, 0.0), axis=0),
        first_nonfinite=xp.where(seen_bad & (state.first_nonfinite < 0), first, state.first_nonfinite),
        steps=state.steps + xs.shape[0] * 1.0,
    )


def to_numpy(state, to_host, steps):
    """The state as NumPy arrays on the host, ``first_nonfinite`` as a training step (-1 none).

    Args:
      state: A ``State`` on the device.
      to_host: Turns the adapter's arrays into NumPy.
      steps: The training steps of the window, in the order they were added
        (the host knows them without reading the device).
    """
    import numpy as np

    host = State(*[np.asarray(to_host(a), np.float64) for a in state])
    index = host.first_nonfinite.astype(np.int64)
    steps = np.asarray(list(steps) or [-1], np.int64)
    first = np.where(index >= 0, steps[np.clip(index, 0, len(steps) - 1)], -1)
    return host._replace(first_nonfinite=first)
