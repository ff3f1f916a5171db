"""The gradient check's PyTorch evaluator: parameters and rows, deterministic evaluations, bit-exact restoration.

``evaluator.Evaluator`` is what the framework-neutral check
(``check.algorithm``) asks of a framework; this module answers it for PyTorch.
Every evaluation runs with the random number generators forked and seeded
the same way (``torch.random.fork_rng``), so dropout draws the same mask at
every point and the loss is a function of the parameters; the state a
module writes while computing the loss (BatchNorm's running statistics and
batch count in training mode) is put back after each evaluation; and every
parameter and buffer is snapshot to host memory first and restored bit for
bit at the end. The caller's RNG state is never advanced and ``.grad`` is
never written (gradients come from ``torch.autograd.grad``).
"""

import collections.abc
import contextlib

import numpy as np
import torch

from tb_gradcheck.check import evaluator
from tb_gradcheck.torch import modules


def parameters(model):
    """``(names, parameters, state)`` to check: the parameters that require grad, and what to snapshot.

    Args:
      model: A ``torch.nn.Module`` (its parameters that require grad, named
        as ``named_parameters`` names them; its other parameters and its
        buffers are snapshot and restored too), a dict of named parameters,
        an iterable of ``(name, parameter)`` pairs (``model.named_parameters()``)
        or of parameters (named by position).

    Returns:
      ``names`` and ``parameters`` in order, and ``state``, ``[(name,
      tensor)]`` for every tensor the check snapshots and restores.

    Raises:
      TypeError: Something else than those, or a tensor that is not a
        floating-point leaf requiring grad.
      ValueError: No parameters, or the same parameter or name twice.
    """
    if isinstance(model, torch.nn.Module):
        # Named as the writer names them: through torch.compile's and DDP's wrappers.
        model = modules.unwrap(model)
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError(
                f"Expected a module with parameters that require grad. Received: {type(model).__name__} with none"
            )
        state = list(model.named_parameters()) + list(model.named_buffers())
    else:
        named = _named(model)
        state = list(named)
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        raise ValueError(f"Expected each parameter name once. Received: {names}")
    seen = set()
    for name, p in named:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"Expected torch tensors as parameters. Received: {name!r} of type {type(p).__name__}")
        if _dtype_name(p.dtype) not in evaluator.FLOATING:
            raise TypeError(
                f"Expected floating-point parameters ({', '.join(evaluator.FLOATING)}). "
                f"Received: {name!r} of dtype {p.dtype}"
            )
        if not (p.is_leaf and p.requires_grad):
            raise TypeError(
                f"Expected leaf tensors that require grad (parameters). Received: {name!r} with "
                f"is_leaf={p.is_leaf}, requires_grad={p.requires_grad}"
            )
        if id(p) in seen:
            raise ValueError(f"Expected each parameter once. Received: {name!r} repeats one already given")
        seen.add(id(p))
    return names, [p for _, p in named], state


def _named(values):
    if isinstance(values, torch.Tensor):
        raise TypeError(
            "Expected an nn.Module, a dict of named parameters, or an iterable of parameters or (name, parameter) "
            "pairs. Received: a single tensor (pass [tensor])"
        )
    if isinstance(values, collections.abc.Mapping):
        items = list(values.items())
    elif isinstance(values, collections.abc.Iterable):
        items = list(values)
    else:
        raise TypeError(
            "Expected an nn.Module, a dict of named parameters, or an iterable of parameters or (name, parameter) "
            f"pairs. Received: {type(values).__name__}"
        )
    if not items:
        raise ValueError("Expected at least one parameter. Received: none")
    if all(isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], str) for x in items):
        return items
    return [(str(i), x) for i, x in enumerate(items)]


class Evaluator(evaluator.Evaluator):
    """Evaluates ``loss_fn`` and its gradient deterministically, and owns the snapshot of every tensor in ``state``.

    Args:
      loss_fn: Zero-argument callable returning a scalar floating-point tensor.
      checked: The checked parameters.
      state: ``[(name, tensor)]``: every tensor to snapshot and restore
        (the checked ones included; names for the warning about writes).
      seed: The seed every evaluation's random number generators start from.
    """

    def __init__(self, loss_fn, checked, state, seed):
        super().__init__(checked)
        self._fn = loss_fn
        self._seed = seed
        union, seen = [], set()
        for t in list(checked) + [t for _, t in state]:
            if id(t) not in seen:
                seen.add(id(t))
                union.append(t)
        self._names = {id(t): name for name, t in state}
        self._all = union
        # Host copies: the snapshot costs no accelerator memory.
        self._saved = {id(t): t.detach().to("cpu", copy=True) for t in union}
        self._checked_ids = {id(p) for p in checked}
        self._devices = sorted({t.device.index or 0 for t in union if t.device.type == "cuda"})
        self._written = None  # the other tensors loss_fn writes, found after its first call
        self._changed = set()

    @contextlib.contextmanager
    def _fixed(self):
        """The same random numbers at every evaluation, the caller's generators untouched, autograd on."""
        with torch.random.fork_rng(devices=self._devices):
            torch.manual_seed(self._seed)
            with torch.inference_mode(False), torch.enable_grad():
                yield

    def _forward(self):
        # With autograd on, as for the gradient: some modules take another
        # code path without it (nn.MultiheadAttention's fused inference
        # kernel), and the differences must be of the function differentiated.
        with self._fixed():
            value = _scalar(self._fn())
            result = float(value.detach()), _dtype_name(value.dtype)
        self._undo_writes()
        return result

    def _backward(self):
        with self._fixed():
            value = _scalar(self._fn())
            if value.requires_grad:
                grads = torch.autograd.grad(value, self.checked, allow_unused=True)
            else:  # the loss reads none of the checked parameters
                grads = [None] * len(self.checked)
        self._undo_writes()
        return [None if g is None else _numpy64(g.to_dense() if g.is_sparse else g) for g in grads]

    def write(self, v, value):
        with torch.no_grad():
            v.copy_(torch.from_numpy(np.ascontiguousarray(value)).reshape(v.shape))
        return _numpy64(v)

    def saved64(self, v):
        return _numpy64(self._saved[id(v)])

    def reset(self, v):
        with torch.no_grad():
            v.copy_(self._saved[id(v)])

    def dtype_name(self, v):
        return _dtype_name(v.dtype)

    def _undo_writes(self):
        if self._written is None:
            # First call: find what loss_fn wrote by comparing with the snapshot.
            self._written = [
                t for t in self._all if id(t) not in self._checked_ids and not _same(t, self._saved[id(t)])
            ]
        for t in self._written:
            self._changed.add(self._names.get(id(t)) or "?")
            with torch.no_grad():
                t.copy_(self._saved[id(t)])

    def restore_all(self):
        """Puts every tensor back bit for bit; returns the names of the other tensors loss_fn changed."""
        for t in self._all:
            saved = self._saved[id(t)]
            if not _same(t, saved):
                if id(t) not in self._checked_ids:
                    self._changed.add(self._names.get(id(t)) or "?")
                with torch.no_grad():
                    t.copy_(saved)
        return self._changed


def gradients(loss_fn, model, seed):
    """The analytic gradients of ``model``'s checked parameters (numpy float64, or None), every tensor restored."""
    _, checked, state = parameters(model)
    evaluator = Evaluator(loss_fn, checked, state, seed)
    try:
        return [None if g is None else np.asarray(g, np.float64) for g in evaluator.gradients()]
    finally:
        evaluator.restore_all()


def _scalar(value):
    if not isinstance(value, torch.Tensor):
        raise TypeError(
            f"Expected `loss_fn` to return a scalar floating-point tensor. Received: {type(value).__name__}"
        )
    if not value.is_floating_point():
        raise TypeError(f"Expected `loss_fn` to return a floating-point loss. Received: dtype {value.dtype}")
    if value.numel() != 1:
        raise ValueError(f"Expected `loss_fn` to return a scalar loss. Received: shape {tuple(value.shape)}")
    return value.reshape(())


def _numpy64(t):
    return t.detach().to("cpu", torch.float64, copy=True).numpy()


def _dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def _same(t, saved):
    """Bit for bit: same dtype, shape and bytes (NaN payloads included)."""
    if t.dtype != saved.dtype or t.shape != saved.shape:
        return False
    return torch.equal(_bytes(t.detach().cpu()), _bytes(saved))


def _bytes(t):
    return t.contiguous().reshape(-1).view(torch.uint8)
