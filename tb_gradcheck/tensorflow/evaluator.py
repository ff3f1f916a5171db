"""The gradient check's TensorFlow evaluator: tracing the loss, evaluating it, restoring every variable it reads bit for bit."""

import warnings

import numpy as np
import tensorflow as tf

from tb_gradcheck.check import evaluator


class Evaluator(evaluator.Evaluator):
    """The TensorFlow evaluator: traces the loss, and owns the snapshot of every variable it reads."""

    def __init__(self, loss_fn, checked):
        super().__init__(checked)
        self._fn, self._state = trace(loss_fn)
        # Every variable the loss reads (from the trace) and the checked
        # ones, each once, snapshot to host memory before anything runs.
        seen, union = set(), []
        for v in list(checked) + list(self._state):
            if id(v) not in seen:
                seen.add(id(v))
                union.append(v)
        self._all = union
        self._saved = {id(v): _read(v) for v in union}
        self._checked_ids = {id(v) for v in checked}
        self._written = None  # the other variables loss_fn writes, found after its first call
        self._changed = set()

    def saved64(self, v):
        return self._saved[id(v)].astype(np.float64)

    def dtype_name(self, v):
        return tf.as_dtype(v.dtype).name

    def _forward(self):
        value = _scalar(self._fn())
        self._undo_writes()
        return float(value.numpy()), value.dtype.name

    def _backward(self):
        with tf.GradientTape(watch_accessed_variables=False) as tape:
            for v in self.checked:
                tape.watch(v)
            value = _scalar(self._fn())
        grads = tape.gradient(value, self.checked, unconnected_gradients=tf.UnconnectedGradients.NONE)
        self._undo_writes()
        return [None if g is None else tf.convert_to_tensor(g).numpy() for g in grads]

    def write(self, v, value):
        value = value.astype(v.dtype.as_numpy_dtype)
        v.assign(value)
        return value.astype(np.float64)

    def reset(self, v):
        v.assign(self._saved[id(v)])

    def _undo_writes(self):
        if self._written is None:
            # First call: find what loss_fn wrote by comparing with the snapshot.
            self._written = [
                v for v in self._all if id(v) not in self._checked_ids and not _same(_read(v), self._saved[id(v)])
            ]
        for v in self._written:
            self._changed.add(display_name(v))
            v.assign(self._saved[id(v)])

    def restore_all(self):
        """Puts every variable back bit for bit; returns names of the other variables loss_fn changed."""
        for v in self._all:
            current = _read(v)
            saved = self._saved[id(v)]
            if not _same(current, saved):
                if id(v) not in self._checked_ids:
                    self._changed.add(display_name(v))
                v.assign(saved)
        return self._changed


def trace(loss_fn):
    """``(callable, variables it reads)``: the concrete function of a trace, or loss_fn itself eagerly."""
    if isinstance(loss_fn, tf.types.experimental.PolymorphicFunction):
        concrete = loss_fn.get_concrete_function()
    else:
        # A fresh tf.function per call: tensors the closure holds are captured
        # as they are now, so a loss_fn over "the current batch" is never stale.
        try:
            concrete = tf.function(loss_fn).get_concrete_function()
        except Exception as e:  # untraceable Python (numpy calls, say): evaluate eagerly
            warnings.warn(
                f"loss_fn could not be traced with tf.function ({type(e).__name__}: {e}); evaluating it eagerly. "
                "Variables it reads other than `variables` cannot be found then, so state it changes there "
                "is not restored.",
                stacklevel=4,
            )
            return loss_fn, []
    _check_output(concrete.structured_outputs)
    return concrete, list(concrete.variables)


def _check_output(out):
    if not isinstance(out, tf.Tensor):
        raise TypeError(f"Expected `loss_fn` to return a scalar floating-point tensor. Received: {type(out).__name__}")
    if not out.dtype.is_floating:
        raise TypeError(f"Expected `loss_fn` to return a floating-point loss. Received: dtype {out.dtype.name}")
    if out.shape.is_fully_defined() and out.shape.num_elements() != 1:
        raise ValueError(f"Expected `loss_fn` to return a scalar loss. Received: shape {tuple(out.shape)}")


def _scalar(value):
    if isinstance(value, tf.Variable):
        value = tf.convert_to_tensor(value)
    _check_output(value)
    return tf.reshape(value, [])


def tf_variable(v):
    if isinstance(v, tf.Variable):
        return v
    inner = getattr(v, "_value", None)  # a Keras 3 variable wraps a tf.Variable
    if isinstance(inner, tf.Variable):
        return inner
    inner = getattr(v, "value", None)
    if isinstance(inner, tf.Variable):
        return inner
    raise TypeError(f"Expected tf.Variable or Keras variables backed by TensorFlow. Received: {type(v).__name__}")


def _read(v):
    return np.array(v.numpy(), copy=True)


def _same(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind == "O":
        return bool(np.array_equal(a, b))
    return a.tobytes() == b.tobytes()


def display_name(v):
    name = getattr(v, "path", None) or v.name
    return name[:-2] if name.endswith(":0") else name
