"""How a list of variables maps to rows: their layers in depth order, and the variables themselves.

The statistics (``tb_gradcheck.stats``), the gradient check and the stored
layout all name their rows this way, from Python objects only (static).
"""

import numpy as np

from tb_gradcheck import units
from tb_gradcheck import validate


class Rows:
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
      layer_names: Layer row names, depth order.
      variable_names: Variable row names, in the order given.
      layer_of: For each variable, the index of its layer row.
      variable_sizes: Element count of each variable.
      layer_sizes: Element count of each layer.
      variable_shapes: Each variable's shape as a one-element list of
        shapes (the stored layout's ``shapes``, ``metadata.stats_layout``).
      layer_shapes: Each layer's variables' shapes, in variable order.
      variable_units: Unit count of each variable.
      layer_units: Unit count of each layer (its last variable's).
    """

    def __init__(self, variables, unit_axes=None):
        self.variables = variables = list(variables)
        unit_axes = unit_axes or {}
        names = [validate.variable_name(v) for v in variables]
        self.variable_names = _unique(names)
        owners = [_owner(v, name) for v, name in zip(variables, self.variable_names)]
        self.layer_names = []
        index = {}
        for owner in owners:
            if owner not in index:
                index[owner] = len(self.layer_names)
                self.layer_names.append(owner)
        self.layer_names = _unique(self.layer_names)
        self.layer_of = [index[o] for o in owners]
        shapes = [tuple(int(d) for d in v.shape) for v in variables]
        self.variable_sizes = [int(np.prod(s)) for s in shapes]
        self.layer_sizes = [0] * len(self.layer_names)
        for size, layer in zip(self.variable_sizes, self.layer_of):
            self.layer_sizes[layer] += size
        self.variable_shapes = [[list(s)] for s in shapes]
        self.layer_shapes = [[] for _ in self.layer_names]
        for shape, layer in zip(shapes, self.layer_of):
            self.layer_shapes[layer].append(list(shape))
        # Trailing axes that index a unit: the last one from rank 1 up (a
        # vector's elements, a kernel's output channels), none for a scalar.
        self.unit_axes = [units.trailing_axes(s, n, unit_axes) for s, n in zip(shapes, names)]
        self.variable_units = [int(np.prod(s[len(s) - k :])) for s, k in zip(shapes, self.unit_axes)]
        self.layer_units = [0] * len(self.layer_names)
        for count, layer in zip(self.variable_units, self.layer_of):
            self.layer_units[layer] = count  # the last variable of the layer wins


def _owner(v, name):
    if isinstance(getattr(v, "path", None), str) and "/" in name:
        return name.rsplit("/", 1)[0]
    return name


def _unique(names):
    """``names`` with repeats numbered ``#2``, ``#3``...; a number already taken (a name that ends in ``#2``) is skipped."""
    taken = set(names)
    counts = {}
    out = []
    for n in names:
        if n not in counts:
            counts[n] = 1
            out.append(n)
            continue
        candidate = n
        while candidate in taken:
            counts[n] += 1
            candidate = f"{n}#{counts[n]}"
        taken.add(candidate)
        out.append(candidate)
    return out
