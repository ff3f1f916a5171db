"""The per-parameter reductions inside the jitted step: what ``rowstats.Reductions`` holds, in ``jax.numpy``.

Each function takes the parameter's gradient (or weights, or update) as a
JAX array, of any sharding: under ``jit`` a reduction of a sharded array is
the reduction of the global array (XLA adds the collectives), so the numbers
do not depend on how the arrays are split over devices.

Float16 and bfloat16 are reduced in float32 (their squares overflow at
|g| > 256); float32 and float64 (``jax_enable_x64``) in their own dtype.

Norms at any scale. A float32 sum of squares underflows for elements below
~1e-19 and overflows above ~1e19, so a vanishing gradient would read 0 and a
large finite one Inf. ``norm`` scales by max |x| first:
||x|| = m * ||x / m|| with m = max |x|, which can neither under- nor
overflow (it is 0, Inf or NaN exactly when m is). It costs a second pass,
so between writes a window takes only ``quick`` (the sum of squares and max
|x|, one pass), and the monitor redoes the step with ``full`` when that sum
falls outside the band where it is exact (``in_band``).
"""

import functools
import math

import jax
import jax.numpy as jnp

# A float32 sum of squares at or above this is exact to float32 rounding:
# the squares it could have lost (each below float32's smallest normal,
# ~1.2e-38) add up to far less than it. A finite sum cannot have overflowed
# (a sum of squares only grows), so the band has no upper end. As
# TensorFlow's writer (``passes._SUMSQ_LOW``).
SUMSQ_LOW = 1e-30


@functools.cache
def on_cpu():
    """Whether jitted steps run on the CPU (JAX's default backend, read once)."""
    return jax.default_backend() == "cpu"


def total(x):
    """The sum of every element of ``x``, in the form that is fast where the step runs.

    XLA's CPU backend emits a whole-array float sum as one serial loop
    (latency-bound, ~1.4 ns an element); a matrix-vector product with a
    vector of ones over the last axis goes to Eigen's vectorised GEMV, as
    TensorFlow's compiled writer found (``tb_gradcheck.tensorflow.full_sums``). The same sum
    in another float order. Elsewhere a plain reduction is the fast form.
    Used between writes (``quick``), where these sums are the whole cost: on
    the benchmark's 20-layer MLP a window of 10 cost 1.04-1.7x the bare step
    with them, 1.19-1.8x with plain sums (a loaded 2-core machine, measured
    interleaved); a written step's reductions measured no faster this way.
    """
    if not on_cpu() or x.ndim == 0:
        return jnp.sum(x)
    return jnp.sum(x.reshape(-1, x.shape[-1]) @ jnp.ones(x.shape[-1], x.dtype))


def as_float(x):
    """``x`` as float32, or float64 if it is float64."""
    x = jnp.asarray(x)
    return x if x.dtype in (jnp.float32, jnp.float64) else x.astype(jnp.float32)


def quick(x):
    """A window's step between writes: the sum of squares and of |x| (``total``), one fused pass where XLA fuses them.

    The sum of |x| only says whether any element is nonzero (``in_band``):
    it is 0 exactly when every element is.
    """
    x = as_float(x)
    if x.size == 0:
        zero = jnp.zeros((), x.dtype)
        return zero, zero
    return total(x * x), total(jnp.abs(x))


def in_band(sums, magnitudes):
    """Whether every sum of squares gives its norm exactly: finite, and not below ``SUMSQ_LOW`` unless all 0.

    ``magnitudes`` (sums of |x|) tell a sum of squares that is 0 because
    every element is 0 (exact) from one whose squares all underflowed (a
    vanishing gradient, which must not read as no gradient).
    """
    return jnp.all(jnp.isfinite(sums) & ((sums >= SUMSQ_LOW) | (magnitudes == 0)))


def norm(x, top=None):
    """The L2 norm of ``x`` at any scale; ``top``: its max |x| if known (saves a pass)."""
    x = as_float(x)
    if x.size == 0:
        return jnp.zeros((), x.dtype)
    top = jnp.max(jnp.abs(x)) if top is None else top
    usable = jnp.isfinite(top) & (top > 0)
    scale = jnp.where(usable, top, 1.0)
    scaled = x * (1.0 / scale)
    # 0, Inf or NaN (any NaN element makes max |x| NaN) is the norm itself.
    return jnp.where(usable, top * jnp.sqrt(jnp.sum(scaled * scaled)), top)


def full(g, units):
    """All of one gradient's reductions: ``(norm, max_abs, nonzero, nonfinite, dead [units])``.

    ``units`` is its unit count (``layout``): the gradient is viewed as
    ``[-1, units]``, unit j its column j. A unit is dead when its every
    element is exactly 0 (NaN and Inf are not 0). max |g| is NaN when an
    element is NaN (``jnp.max`` propagates it). The per-unit reductions
    (max |g| and the nonzero count) read ``g`` once, and the whole-array
    ones follow from them; the norm needs one more pass (``norm``).
    """
    g = as_float(g)
    count = jnp.int32 if g.dtype == jnp.float32 else jnp.int64
    if g.size == 0:
        zero = jnp.zeros((), g.dtype)
        return zero, zero, jnp.zeros((), count), jnp.zeros((), count), jnp.zeros((units,), bool)
    per_unit = g.reshape(-1, units)
    top_u = jnp.max(jnp.abs(per_unit), axis=0)
    nonzero_u = jnp.sum(per_unit != 0, axis=0, dtype=count)
    top = jnp.max(top_u)
    nonfinite = jnp.sum(~jnp.isfinite(g), dtype=count)
    return norm(g, top), top, jnp.sum(nonzero_u, dtype=count), nonfinite, nonzero_u == 0


# Per slice: a parameter stacked for ``lax.scan`` (``stacks``) is ``axes``
# leading axes of layers; each function reduces every axis but those, in
# one pass over the whole array (no loop over the slices), and gives one
# value per slice, flat in the order of the stacked axes. They reduce over
# axes rather than reshape the array: under explicit sharding (sharding in
# types) a reshape that merges a sharded axis is refused, and a stack may
# be split along any axis. Their small results are replicated (``flat``).


def flat(x):
    """``x`` (a few values per slice) as one vector; replicated first where its type says it is sharded."""
    spec = getattr(getattr(jax.typeof(x), "sharding", None), "spec", ())
    if any(axis is not None for axis in spec):
        x = jax.sharding.reshard(x, jax.typeof(x).sharding.update(spec=jax.sharding.PartitionSpec()))
    return x.reshape(-1)


def _rest(x, axes, keep=0):
    """The axes of ``x`` after the first ``axes`` (and before the last ``keep``)."""
    return tuple(range(axes, x.ndim - keep))


def quick_slices(x, axes):
    """``quick`` per slice: ``(sums of squares [S], sums of |x| [S])``."""
    x = as_float(x)
    rest = _rest(x, axes)
    return flat(jnp.sum(x * x, axis=rest)), flat(jnp.sum(jnp.abs(x), axis=rest))


def norm_slices(x, axes, top=None):
    """``norm`` per slice ``[S]``, at any scale; ``top``: the slices' max |x| (stacked shape) if known."""
    x = as_float(x)
    rest = _rest(x, axes)
    top = jnp.max(jnp.abs(x), axis=rest, initial=0.0) if top is None else top
    usable = jnp.isfinite(top) & (top > 0)
    scale = jnp.where(usable, top, 1.0)
    scaled = x * (1.0 / scale).reshape(scale.shape + (1,) * len(rest))
    return flat(jnp.where(usable, top * jnp.sqrt(jnp.sum(scaled * scaled, axis=rest)), top))


def full_slices(g, units, axes):
    """``full`` per slice: ``(norm [S], max_abs [S], nonzero [S], nonfinite [S], dead [S * units])``.

    A slice's units are its own (a slice ``[in, out]`` of a Dense kernel
    ``[L, in, out]`` has ``out``: its last axes whose sizes multiply to
    ``units``); ``dead`` lists slice 0's units, then slice 1's...
    """
    g = as_float(g)
    count = jnp.int32 if g.dtype == jnp.float32 else jnp.int64
    if g.size == 0:  # slices without elements
        n = math.prod(g.shape[:axes])
        zero = jnp.zeros(n, g.dtype)
        return zero, zero, jnp.zeros(n, count), jnp.zeros(n, count), jnp.zeros(n * units, bool)
    keep, size = 0, 1
    while size < units and keep < g.ndim - axes:  # the unit axes: the last ones, ``units`` elements
        keep += 1
        size *= g.shape[-keep]
    middle = _rest(g, axes, keep)
    top_u = jnp.max(jnp.abs(g), axis=middle, initial=0.0)
    nonzero_u = jnp.sum(g != 0, axis=middle, dtype=count)
    units_axes = _rest(top_u, axes)
    top = jnp.max(top_u, axis=units_axes, initial=0.0)
    nonfinite = jnp.sum(~jnp.isfinite(g), axis=_rest(g, axes), dtype=count)
    nonzero = jnp.sum(nonzero_u, axis=units_axes, dtype=count)
    return norm_slices(g, axes, top), flat(top), flat(nonzero), flat(nonfinite), flat(nonzero_u == 0)
