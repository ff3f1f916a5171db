"""Input validation for the public entry points: one helper per kind of argument, "Expected ... Received: ...".

Every public function validates its arguments once, here, and passes the
checked values down; nothing below an entry point validates again. Each
helper returns the value in the form the caller works with (an ``int``, a
``float``, a ``list``, an int64 tensor) or raises ``TypeError`` for the wrong
kind of object and ``ValueError`` for a wrong value.

TensorFlow is imported inside the helpers that need it (steps, variables,
gradients), so the TensorBoard plugin and the command line can import this
module without it.
"""

import collections.abc
import numbers
import os

import numpy as np

INT64_MAX = 2**63 - 1


def positive_int(value, name):
    """``value`` as an ``int`` >= 1; bools are refused (``True`` is not a count)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"Expected `{name}` to be a positive integer. Received: {value!r}")
    return int(value)


def non_negative_int(value, name):
    """``value`` as an ``int`` in 0..2**63-1 (seeds, offsets)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 0 <= value <= INT64_MAX:
        raise ValueError(f"Expected `{name}` to be a non-negative integer (0 to 2**63 - 1). Received: {value!r}")
    return int(value)


def fraction(value, name):
    """``value`` as a ``float`` strictly between 0 and 1 (tolerances, step sizes)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"Expected `{name}` to be a number. Received: {type(value).__name__}")
    if not 0 < value < 1:
        raise ValueError(f"Expected `{name}` to be between 0 and 1 (exclusive). Received: {value!r}")
    return float(value)


def one_of(value, name, choices):
    """``value`` if it is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"Expected `{name}` to be one of {list(choices)}. Received: {value!r}")
    return value


def boolean(value, name):
    """``value`` if it is ``True`` or ``False``."""
    if not isinstance(value, bool):
        raise TypeError(f"Expected `{name}` to be True or False. Received: {type(value).__name__} {value!r}")
    return value


def flag(value, name):
    """``value`` as a Python ``bool``: a choice fixed when a step is traced, so not a tensor."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(
            f"Expected `{name}` to be a Python bool (it is fixed when the step is traced). "
            f"Received: {type(value).__name__} {value!r}"
        )
    return bool(value)


def path(value, name):
    """A filesystem path (str, bytes or ``os.PathLike``) as a ``str``."""
    if isinstance(value, bytes):
        return value.decode()
    if not isinstance(value, str) and not hasattr(value, "__fspath__"):
        raise TypeError(f"Expected `{name}` to be a path. Received: {type(value).__name__}")
    return os.fspath(value)


def non_empty_list(values, name):
    """A non-empty sequence as a ``list``.

    Tensors, arrays, strings, mappings and sets are refused: each is iterable,
    but iterating one is never what a caller who passed it meant.
    """
    if (
        isinstance(values, (str, bytes, collections.abc.Mapping, collections.abc.Set))
        or (hasattr(values, "shape") and hasattr(values, "dtype"))
        or not hasattr(values, "__iter__")
    ):
        raise TypeError(f"Expected `{name}` to be a list. Received: {type(values).__name__}")
    values = list(values)
    if not values:
        raise ValueError(f"Expected a non-empty list of {name}. Received: an empty list")
    return values


def step(value, name="step"):
    """A training step as a scalar int64 tensor.

    Accepts a Python int in 0..2**63-1 or a scalar integer tensor or variable
    (e.g. ``optimizer.iterations``); a tensor's sign is checked when its value
    is known (eagerly), since inside ``tf.function`` it is not.
    """
    import tensorflow as tf

    if isinstance(value, bool) or value is None:
        raise TypeError(f"Expected `{name}` to be an integer. Received: {value!r}")
    if isinstance(value, numbers.Integral):
        if not 0 <= value <= INT64_MAX:
            raise ValueError(f"Expected `{name}` to be a non-negative int64 (0 to 2**63 - 1). Received: {value}")
        return tf.constant(int(value), tf.int64)
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        dtype = tf.as_dtype(value.dtype)
        if not dtype.is_integer:
            raise TypeError(f"Expected `{name}` to be an integer. Received: a {dtype.name} tensor")
        if value.shape.rank not in (0, None):
            raise ValueError(f"Expected `{name}` to be a scalar. Received: shape {value.shape}")
        value = tf.cast(tf.convert_to_tensor(value), tf.int64)
        if tf.executing_eagerly() and int(value) < 0:
            raise ValueError(f"Expected `{name}` to be non-negative. Received: {int(value)}")
        return value
    raise TypeError(f"Expected `{name}` to be an integer. Received: {value!r} of type {type(value).__name__}")


def variables(values, name="variables"):
    """A non-empty list of distinct floating-point ``tf.Variable`` or Keras variables."""
    import tensorflow as tf

    values = non_empty_list(values, name)
    seen = {}
    for i, v in enumerate(values):
        if not isinstance(v, tf.Variable) and not _is_keras_variable(v):
            raise TypeError(
                f"Expected tf.Variable or keras.Variable objects in `{name}`. "
                f"Received: {name}[{i}] of type {type(v).__name__}"
            )
        if id(v) in seen:
            raise ValueError(
                "Expected each variable once. "
                f"Received: {name}[{seen[id(v)]}] and {name}[{i}] are the same variable {variable_name(v)!r}"
            )
        seen[id(v)] = i
        dtype = tf.as_dtype(v.dtype)  # a string for Keras variables
        if not dtype.is_floating:
            raise TypeError(
                "Expected floating-point variables (gradients exist only for those). "
                f"Received: {name}[{i}] {variable_name(v)!r} with dtype {dtype.name}"
            )
    return values


def gradients(values, variables_, name="gradients"):
    """One gradient per variable: None, a ``tf.IndexedSlices`` or a floating-point tensor of the variable's shape.

    Args:
      values: The gradients, as from ``tape.gradient``.
      variables_: The checked list of variables (from ``variables``).
      name: The argument's name in messages.

    Returns:
      A list: None kept, slices kept, everything else converted to a tensor.
    """
    import tensorflow as tf

    values = non_empty_list(values, name)
    if len(values) != len(variables_):
        raise ValueError(
            f"Expected one gradient per variable. Received: len({name})={len(values)}, len(variables)={len(variables_)}"
        )
    out = []
    for i, (g, v) in enumerate(zip(values, variables_)):
        if isinstance(g, tf.distribute.DistributedValues):
            raise TypeError(
                f"Expected tensors in `{name}`; call write() inside `strategy.run`, with the "
                "gradients of that replica. "
                f"Received: {name}[{i}] of type {type(g).__name__}"
            )
        if g is not None and not isinstance(g, tf.IndexedSlices):
            try:
                g = tf.convert_to_tensor(g)
            except (TypeError, ValueError):
                raise TypeError(
                    "Expected each gradient to be a tensor, a tf.IndexedSlices or None. "
                    f"Received: {name}[{i}] of type {type(g).__name__}"
                ) from None
        if g is not None:
            dtype = g.values.dtype if isinstance(g, tf.IndexedSlices) else g.dtype
            if not dtype.is_floating:
                raise TypeError(
                    "Expected floating-point gradients. "
                    f"Received: {name}[{i}] with dtype {dtype.name} for variable {variable_name(v)!r}"
                )
        if isinstance(g, tf.Tensor) and g.shape.is_fully_defined() and g.shape != tuple(v.shape):
            raise ValueError(
                "Expected each gradient to have its variable's shape. "
                f"Received: {name}[{i}] of shape {tuple(g.shape)} for variable {variable_name(v)!r} "
                f"of shape {tuple(v.shape)}"
            )
        out.append(g)
    return out


def variable_name(v):
    """A variable's name for rows and messages: its Keras ``path``, else its name without ``:0``."""
    p = getattr(v, "path", None)
    if isinstance(p, str) and p:
        return p
    n = getattr(v, "name", None) or "variable"
    return n.removesuffix(":0")


def _is_keras_variable(v):
    return isinstance(getattr(v, "path", None), str) and hasattr(v, "dtype") and hasattr(v, "shape")
