"""Numeric-vs-analytic gradient check per layer for JAX: ``check.algorithm`` on a JAX evaluator.

The algorithm (rows, noise, probes, steps, error bars, verdicts, bisection,
the report) is ``check.algorithm``'s, written once for every framework; this
module names the rows as the JAX writer does (``layout``: a parameter's
path, its layer the parent path), orders them by the loss's first read of
each parameter (``layout.depth_order``), builds the float64 twin under
``jax_enable_x64``, and evaluates the loss and its gradient through two
jitted functions of the parameters (compiled once; each evaluation is one
call). The report is the ``GradientCheckReport`` every check returns, for
``GradientWriter.write_check``.
"""

import os

import jax
import jax.numpy as jnp
import numpy as np

from tb_gradcheck.check import algorithm
from tb_gradcheck.check import float32_gap
from tb_gradcheck.check import settle
from tb_gradcheck.core import validate
from tb_gradcheck.jax import layout
from tb_gradcheck.jax.evaluator import Evaluator

DTYPES = (None, "float32", "float64")


def check_gradients(
    loss_fn,
    params,
    batch=None,
    *,
    dtype=None,
    probes=algorithm.DEFAULT_PROBES,
    epsilon=None,
    seed=None,
    granularity="layer",
    tolerance=None,
    thorough=False,
):
    """Checks the analytic gradient of a JAX loss against central differences, per layer.

    Example:

        report = tb_gradcheck.jax.check_gradients(loss_fn, params, (x, y), dtype="float64", seed=step)
        writer.write_check(report, step)
        assert report.ok, report.failures

    Rows are layers, named as ``GradientWriter`` names them (the parent path
    of each parameter: ``Dense_0`` for ``params/Dense_0/kernel``, ``linear1``
    for NNX's ``linear1.kernel``), in the order the loss first reads them;
    with ``granularity="variable"`` also each parameter. Every floating-point
    leaf of ``params`` is checked; others (integer counters) are held fixed.

    Args:
      loss_fn: ``loss_fn(params, batch)`` (or ``loss_fn(params)`` when
        ``batch`` is None), a scalar floating-point loss, traceable by
        ``jax.jit`` and ``jax.grad`` (a ``jax.custom_vjp`` inside it is what
        gets checked). Randomness must come from keys it closes over or
        takes in ``batch``, so every evaluation sees the same function.
      params: The parameter pytree, or an NNX module (then ``loss_fn`` takes
        the module; its ``nnx.Param`` state is checked). Not modified.
      batch: None (default), or the batch ``loss_fn`` takes (any pytree).
      dtype: None (default) checks in the parameters' own dtype, then
        re-checks the rows that does not convict (inconclusive, or ok only
        within float32's 1%) on the float64 twin below, with the same seed and
        probes (``tb_gradcheck.check.settle``): those rows hold the twin's
        verdict, marked ``float64_recheck="float64"``, or their own (the
        inconclusive ones marked ``"unavailable"`` with the reason) where the
        twin cannot run (a loss that cannot be traced in float64, not enough
        free memory). ``"float32"``: the parameters' own dtype only.
        ``"float64"`` checks a float64 twin: ``params`` and ``batch``'s
        floating-point leaves cast to float64, traced and run under
        ``jax.enable_x64``. Its error bar is ~1e-7 of the derivative instead
        of ~3e-3. A float32 model also has its own gradient held against the
        twin's (``float32_gap``): a row more than 1% off, or not finite where
        the twin's is, is a mismatch (float32 arithmetic the twin cannot see);
        not when the twin's loss is not the model's (more than float32
        rounding apart): under ``jax_enable_x64`` the same key can draw other
        random numbers (``nn.Dropout``'s mask), and the report's ``notes``
        say the gradients were not compared. The twin's own check is valid
        either way: every evaluation draws the same numbers from the key.
      probes, epsilon, seed, granularity, tolerance, thorough: As for
        ``tb_gradcheck.check_gradients`` (TensorFlow).

    Matrix products and convolutions run at full float32 precision while the
    check runs (``jax.default_matmul_precision("float32")``: no TF32 or
    bfloat16 passes on GPUs and TPUs), so a float32 model is checked in float32.

    Returns:
      A ``GradientCheckReport`` (``tb_gradcheck.check.report``).

    Raises:
      TypeError: ``loss_fn`` is not callable or returns no floating-point
        scalar; an argument of the wrong type.
      ValueError: No floating-point parameters, an argument out of range.
    """
    if not callable(loss_fn):
        raise TypeError(f"Expected `loss_fn` to be a callable. Received: {type(loss_fn).__name__}")
    opts = algorithm.options(probes, epsilon, seed, granularity, tolerance, thorough)
    dtype = validate.one_of(dtype, "dtype", DTYPES)
    tree, fn = _pure(loss_fn, params, batch)
    with jax.default_matmul_precision("float32"):
        if dtype == "float64":
            return _twin_check(loss_fn, params, batch, tree, fn, opts)
        report = _check(fn, tree, opts)
        if dtype is None:
            report = settle.settle(report, lambda only: _twin_check(loss_fn, params, batch, tree, fn, opts, only))
        return report


def _twin_check(loss_fn, params, batch, tree, fn, opts, only=None):
    """The check of the float64 twin (over the rows ``only``, or all), its gradient held against the model's."""
    leaves = [x for x in jax.tree_util.tree_leaves(tree) if hasattr(x, "dtype")]
    if only is not None and leaves:
        # The twin's float64 leaves and the evaluator's float64 snapshot of them.
        needed = 2 * 8 * sum(int(np.size(x)) for x in leaves)
        settle.require_memory(needed, _free_bytes(leaves[0]), str(_device(leaves[0])))
    with jax.enable_x64(True):
        tree64 = _to_float64(tree)
        fn64 = _pure(loss_fn, params, _to_float64(batch))[1]
        report = _check(fn64, tree64, opts, only)
        names, owners, checked = _rows(fn64, tree64)
        reference = _gradient(fn64, tree64, checked)
    if any(jax.tree_util.tree_leaves(tree)[i].dtype != jnp.float32 for i in checked):
        return report  # float16 or bfloat16 arithmetic is inexact by design; float64 is the twin's own
    # Under jax_enable_x64 the same key can draw other random numbers
    # (dropout masks): own_gap holds the two losses first, and compares
    # the gradients only when the twin computes the model's function.
    own = Evaluator(fn, tree, checked)
    return float32_gap.own_gap(report, own, reference, algorithm.Layout(names, owners))


def _device(leaf):
    devices = getattr(leaf, "devices", None)
    return next(iter(devices()), None) if callable(devices) else None


def _free_bytes(leaf):
    """Bytes free on ``leaf``'s device (its memory_stats), the host's on a CPU, or None when unknown."""
    device = _device(leaf)
    stats = device.memory_stats() if device is not None and device.platform != "cpu" else None
    if stats and "bytes_limit" in stats:
        return stats["bytes_limit"] - stats.get("bytes_in_use", 0)
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _pure(loss_fn, params, batch):
    """``(parameter pytree, loss as a function of it)``; an NNX module becomes its Param state."""
    rebuild = layout.nnx_rebuild(params)
    if rebuild is not None:
        tree, merge = rebuild
        return tree, (lambda p: loss_fn(merge(p))) if batch is None else (lambda p: loss_fn(merge(p), batch))
    return params, (lambda p: loss_fn(p)) if batch is None else (lambda p: loss_fn(p, batch))


def _rows(fn, tree):
    """``(names, owners, checked leaf indices)`` of the floating-point leaves, in the order ``fn`` first reads them."""
    leaves = jax.tree_util.tree_leaves(tree)
    parts = layout.path_names(tree)
    floating = [i for i, x in enumerate(leaves) if jnp.issubdtype(jnp.asarray(x).dtype, jnp.floating)]
    if not floating:
        raise ValueError(
            "Expected floating-point parameters to check. Received: a pytree with no floating-point arrays"
        )
    names = ["/".join(p) for p in parts]
    rank = {n: k for k, n in enumerate(layout.depth_order(fn, tree))}
    order = sorted(floating, key=lambda i: (rank.get(names[i], len(rank)), layout.natural_key(parts[i])))
    owners = ["/".join(parts[i][:-1]) or parts[i][0] for i in order]
    return [names[i] for i in order], owners, order


def _check(fn, tree, opts, only=None):
    names, owners, checked = _rows(fn, tree)
    evaluator = Evaluator(fn, tree, checked)
    return algorithm.run(evaluator, algorithm.Layout(names, owners), opts, only)


def _gradient(fn, tree, checked):
    """The gradient of each checked leaf as float64 numpy, at ``tree``."""
    grads = jax.tree_util.tree_leaves(jax.jit(jax.grad(fn))(tree))
    return [np.asarray(grads[i], np.float64) for i in checked]


def _to_float64(tree):
    """``tree`` with its floating-point leaves cast to float64 (under ``jax.enable_x64``)."""

    def cast(x):
        return x.astype(jnp.float64) if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) else x

    return jax.tree_util.tree_map(cast, tree)
