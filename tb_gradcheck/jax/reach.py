"""Which parameters a loss has a gradient path to, from JAX's own record of it: the symbolic zeros of its backward pass.

Why it is needed. ``jax.grad`` has no None: a parameter the loss does not
depend on (a head whose output the loss never uses, a pooler a masked
language model skips, a branch behind ``stop_gradient``) gets an array of
zeros. Measured, those zeros read as a layer whose every unit gets no
gradient, which the findings call dead; TensorFlow and PyTorch give such a
variable no gradient at all (None), and their writers store its rows as
MISSING. JAX knows the difference while it differentiates: a cotangent with
no path from the output is a ``SymbolicZero`` until it is turned into an
array at the end. An identity ``custom_vjp`` with ``symbolic_zeros=True``
around the parameters sees those cotangents at trace time and passes them on
unchanged, so the gradients are bit for bit those without it.

Used twice: ``depth_order`` traces the user's loss function through it once
(``unreached``; nothing runs on a device), and the Keras-on-JAX callback
taps its train step's trainable values (``tap``).
"""

import warnings

import jax
import jax.numpy as jnp


def tap(values, reached):
    """``values`` (a list of arrays) unchanged, and, when the backward pass reaches them, whether a gradient flows into each.

    The backward rule appends one list of flags to ``reached`` each time it
    is traced (per value: True unless its cotangent is a symbolic zero) and
    passes the cotangents on as they are.
    """

    def forward(values):
        return [v.value for v in values], None

    def backward(_, cotangents):
        reached.append([not isinstance(c, jax.custom_derivatives.SymbolicZero) for c in cotangents])
        return (cotangents,)

    identity = jax.custom_vjp(lambda values: values)
    identity.defvjp(forward, backward, symbolic_zeros=True)
    return identity(values)


def loss_of(out):
    """The scalar loss in ``fn``'s output ``out``: ``out`` itself, or the first of a ``(loss, aux)`` pair; else None.

    The pair is ``jax.value_and_grad(..., has_aux=True)``'s convention. A
    forward pass's output (logits, a tuple of heads) is not a loss: which of
    its parts the loss uses is not known from it.
    """
    if isinstance(out, (tuple, list)) and len(out) == 2:
        out = out[0]
    shape, dtype = getattr(out, "shape", None), getattr(out, "dtype", None)
    if shape != () or dtype is None or not jnp.issubdtype(dtype, jnp.inexact):
        return None
    return out


def unreached(fn, params, out_shape):
    """Per leaf of ``params`` (flattening order), whether the scalar loss ``fn(params)`` has no gradient path to it.

    Traced once (``jax.make_jaxpr`` of its gradient); nothing runs. Returns
    None where it cannot say: ``fn``'s output (``out_shape``, the shapes of
    the trace the caller already made) holds no scalar loss (``loss_of``),
    or a leaf is not a floating array (not differentiated).
    """
    leaves, treedef = jax.tree_util.tree_flatten(params)
    floating = [getattr(x, "dtype", None) is not None and jnp.issubdtype(x.dtype, jnp.inexact) for x in leaves]
    if not leaves or not all(floating) or loss_of(out_shape) is None:
        return None
    reached = []

    def loss(leaves):
        return loss_of(fn(jax.tree_util.tree_unflatten(treedef, tap(list(leaves), reached))))

    try:
        jax.make_jaxpr(jax.grad(loss))(leaves)
    except Exception as e:  # noqa: BLE001 - the order is still good; only this extra is lost, and said
        warnings.warn(
            f"depth_order could not differentiate its function ({type(e).__name__}: {e}); every parameter is "
            "measured, and one the loss has no gradient path to reads as zeros (a dead layer), not MISSING.",
            stacklevel=3,
        )
        return None
    if len(reached) != 1 or len(reached[0]) != len(leaves):
        return None
    return [not r for r in reached[0]]
