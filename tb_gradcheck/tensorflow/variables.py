"""How a list of variables maps to rows: their layers in depth order, and the variables themselves.

The statistics (``tb_gradcheck.tensorflow.statistics``), the gradient check and the stored
layout all name their rows this way, from Python objects only (static).
"""

import numbers

import tensorflow as tf

from tb_gradcheck.core import structure
from tb_gradcheck.core import validate
from tb_gradcheck.keras.variables import owner
from tb_gradcheck.tensorflow import units


class Rows(structure.Structure):
    """How variables map to rows: layers in depth order, and the variables themselves.

    A Keras 3 variable belongs to the layer that owns it (the parent of its
    ``path``, so ``sequential/dense/kernel`` is in ``sequential/dense``); a
    plain ``tf.Variable`` is its own layer. Layers are ordered by their first
    variable's position in ``variables``. Names that repeat (two plain
    variables both called ``Variable``) get ``#2``, ``#3``... appended, so
    every row name is unique.

    Args:
      variables: The checked variables (``validate.variables``).
      unit_axes: ``{variable name: number of trailing axes that index a
        unit}`` for variables whose units do not follow from their shape
        (``units.unit_axes(model)``); None for none.

    Attributes:
      variables: The variables, in the order given.
      unit_axes: Per variable, how many trailing axes index its units.
      The rest as ``structure.Structure`` (names, layer_of, sizes, shapes,
      unit counts; ``blocks`` for the stored layout).
    """

    def __init__(self, variables, unit_axes=None):
        self.variables = variables = list(variables)
        unit_axes = unit_axes or {}
        names = [validate.variable_name(v) for v in variables]
        unique_names = structure.unique(names)
        shapes = [tuple(int(d) for d in v.shape) for v in variables]
        # Trailing axes that index a unit: the last one from rank 1 up (a
        # vector's elements, a kernel's output channels), none for a scalar.
        self.unit_axes = [units.trailing_axes(s, n, unit_axes) for s, n in zip(shapes, names)]
        super().__init__(
            unique_names,
            [owner(v, name) for v, name in zip(variables, unique_names)],
            shapes,
            [structure.trailing_units(s, k) for s, k in zip(shapes, self.unit_axes)],
        )


# The checks of what a writer is given ("Expected ... Received: ..."), on TensorFlow's types.


def checked_step(value, name="step"):
    """A training step as a scalar int64 tensor.

    Accepts a Python int in 0..2**63-1 or a scalar integer tensor or variable
    (e.g. ``optimizer.iterations``); a tensor's sign is checked when its value
    is known (eagerly), since inside ``tf.function`` it is not.
    """
    if isinstance(value, bool) or value is None:
        raise TypeError(f"Expected `{name}` to be an integer. Received: {value!r}")
    if isinstance(value, numbers.Integral):
        if not 0 <= value <= validate.INT64_MAX:
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


def checked_variables(values, name="variables"):
    """A non-empty list of distinct floating-point ``tf.Variable`` or Keras variables."""
    values = validate.non_empty_list(values, name)
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
                f"Received: {name}[{seen[id(v)]}] and {name}[{i}] are the same variable {validate.variable_name(v)!r}"
            )
        seen[id(v)] = i
        dtype = tf.as_dtype(v.dtype)  # a string for Keras variables
        if not dtype.is_floating:
            raise TypeError(
                "Expected floating-point variables (gradients exist only for those). "
                f"Received: {name}[{i}] {validate.variable_name(v)!r} with dtype {dtype.name}"
            )
    return values


def checked_gradients(values, variables_, name="gradients"):
    """One gradient per variable: None, a ``tf.IndexedSlices`` or a floating-point tensor of the variable's shape.

    Args:
      values: The gradients, as from ``tape.gradient``.
      variables_: The checked list of variables (from ``variables``).
      name: The argument's name in messages.

    Returns:
      A list: None kept, slices kept, everything else converted to a tensor.
    """
    values = validate.non_empty_list(values, name)
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
                    f"Received: {name}[{i}] with dtype {dtype.name} for variable {validate.variable_name(v)!r}"
                )
        if isinstance(g, tf.Tensor) and g.shape.is_fully_defined() and g.shape != tuple(v.shape):
            raise ValueError(
                "Expected each gradient to have its variable's shape. "
                f"Received: {name}[{i}] of shape {tuple(g.shape)} for variable {validate.variable_name(v)!r} "
                f"of shape {tuple(v.shape)}"
            )
        out.append(g)
    return out


def _is_keras_variable(v):
    return isinstance(getattr(v, "path", None), str) and hasattr(v, "dtype") and hasattr(v, "shape")
