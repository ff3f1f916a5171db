"""How a list of variables maps to rows: their layers in depth order, and the variables themselves.

The statistics (``tb_gradcheck.stats``), the gradient check and the stored
layout all name their rows this way, from Python objects only (static).
"""

from tb_gradcheck import structure
from tb_gradcheck import units
from tb_gradcheck import validate


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
            [structure.keras_owner(v, name) for v, name in zip(variables, unique_names)],
            shapes,
            [structure.trailing_units(s, k) for s, k in zip(shapes, self.unit_axes)],
        )
