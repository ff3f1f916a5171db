"""What an optax step does to the model's weights, for the monitor: the weights the gradient is of, and their change.

Two optax setups make the ``params`` and ``updates`` an optimizer sees differ
from the model's weights and their change:

- ``optax.lookahead`` keeps two copies of the weights in an
  ``optax.LookaheadParams`` (``fast``, the model the gradient is taken at,
  and ``slow``) and returns updates of both; the gradients are the fast
  weights' only. The rows are the fast weights, their change is the fast
  updates (which include the pull toward the slow weights at a sync step).
- Parameters stored in bfloat16 or float16: ``optax.apply_updates`` adds the
  update and rounds the sum to the parameter's dtype, which has 8 (11)
  significant bits, so an update under half a unit in the last place of a
  weight is lost and others are rounded to a multiple of it. The change the
  step made (``update_norm``'s definition, ||w_after - w_before||, as the
  TensorFlow, PyTorch and Keras writers measure it) is taken as
  ``apply_updates`` makes it. In float32 and float64 the two differ by at
  most half a unit in the last place of each weight, and the update is kept
  as returned (no extra pass). In bfloat16, XLA may still round a weight of
  the step's own ``apply_updates`` one ulp apart from this (it may add in
  more precision inside a fusion: ``xla_allow_excess_precision``), about 1%
  of the change's norm; the returned update was off by 15% on the tests' MLP,
  and by all of it where the rounding lost the update.
"""

import jax
import jax.numpy as jnp
import optax


def model_params(params):
    """The weights the gradients are of: ``params.fast`` of an ``optax.LookaheadParams``, else ``params``."""
    return params.fast if isinstance(params, optax.LookaheadParams) else params


def change(updates, params):
    """The change ``optax.apply_updates(params, updates)`` makes to the model's weights (``model_params``).

    Args:
      updates: What the optimizer returned (an ``optax.LookaheadParams`` for lookahead).
      params: The parameters the optimizer was given, or None (then the updates as returned).
    """
    if isinstance(updates, optax.LookaheadParams):
        updates = updates.fast
    if params is None:
        return updates
    return jax.tree_util.tree_map(_rounded, updates, model_params(params))


def _rounded(u, p):
    if u is None or p is None or not jnp.issubdtype(p.dtype, jnp.floating) or jnp.finfo(p.dtype).bits >= 32:
        return u
    # p + u rounded to p's dtype, as optax.apply_updates stores it. A cast
    # to bfloat16 and back would not do: XLA drops such round trips inside
    # a computation (excess precision); reduce_precision it keeps.
    info = jnp.finfo(p.dtype)
    before = p.astype(jnp.float32)
    after = jax.lax.reduce_precision(before + u.astype(jnp.float32), exponent_bits=info.nexp, mantissa_bits=info.nmant)
    return after - before
