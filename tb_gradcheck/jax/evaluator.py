"""The check's JAX evaluator: the loss and its gradient at the checked leaves through two jitted functions.

What ``check/evaluator.py`` asks of a framework, for a parameter pytree:
evaluations at written values (rounded to each leaf's dtype, placed with its
sharding) and bit-exact restoration of the leaves as they were. The pytree
itself is never modified: written values live in the evaluator's own list.
"""

import jax
import jax.numpy as jnp
import numpy as np

from tb_gradcheck.check import evaluator


class _Leaf:
    """One checked parameter: its index among the pytree's leaves (a handle the check passes back)."""

    def __init__(self, index):
        self.index = index


class Evaluator(evaluator.Evaluator):
    """The loss and its gradient at the parameters as they are, through two jitted functions of the leaves.

    Args:
      fn: The loss as a function of the parameter pytree.
      tree: The parameter pytree (JAX arrays); never modified: written
        values live in the evaluator's own list of leaves.
      checked: Indices of the checked leaves, in row order.
    """

    def __init__(self, fn, tree, checked):
        super().__init__([_Leaf(i) for i in checked])
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        self._saved = [jnp.asarray(x) for x in leaves]
        self._current = list(self._saved)
        indices = list(checked)

        def loss_of(checked_leaves, all_leaves):
            merged = list(all_leaves)
            for i, x in zip(indices, checked_leaves):
                merged[i] = x
            return fn(jax.tree_util.tree_unflatten(treedef, merged))

        self._loss = jax.jit(loss_of)
        self._grad = jax.jit(jax.grad(loss_of))

    def _checked_leaves(self):
        return [self._current[v.index] for v in self.checked]

    def _forward(self):
        value = self._loss(self._checked_leaves(), self._current)
        if np.ndim(value) != 0 or not jnp.issubdtype(value.dtype, jnp.floating):
            raise TypeError(
                "Expected `loss_fn` to return a floating-point scalar. "
                f"Received: shape {np.shape(value)}, dtype {value.dtype}"
            )
        return float(value), str(value.dtype)

    def _backward(self):
        return [np.asarray(g, np.float64) for g in self._grad(self._checked_leaves(), self._current)]

    def write(self, v, value):
        saved = self._saved[v.index]
        rounded = np.asarray(value).astype(saved.dtype)
        self._current[v.index] = jax.device_put(rounded, saved.sharding)
        return np.asarray(rounded, np.float64)

    def saved64(self, v):
        return np.asarray(self._saved[v.index], np.float64)

    def reset(self, v):
        self._current[v.index] = self._saved[v.index]

    def dtype_name(self, v):
        return str(self._saved[v.index].dtype)
