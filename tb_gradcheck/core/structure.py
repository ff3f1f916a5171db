"""How a model's parameters map to rows, for any framework: layers in depth order, and the parameters themselves.

A framework adapter names each parameter, its owner (the layer, or module,
it belongs to), its shape and its unit count; ``Structure`` makes the rows
every writer stores and every reader shows: TensorFlow's ``variables.Rows``
builds on it, and so do the PyTorch and JAX writers. No framework imports
(Keras variables' rows are ``tb_gradcheck.keras.variables``').
"""

import numpy as np


class Structure:
    """Rows of a list of parameters: layers in depth order, and the parameters themselves.

    Layers are ordered by their first parameter's position in the list, so
    the list must be in depth order. Names that repeat get ``#2``, ``#3``...
    appended, so every row name is unique.

    Args:
      variable_names: One name per parameter (the variable rows).
      owners: Per parameter, the name of the layer it belongs to.
      shapes: Per parameter, its shape (a sequence of ints).
      units: Per parameter, its unit count for ``dead_unit_fraction``
        (``tb_gradcheck.tensorflow.units`` says what a unit is).
      module_classes: Optional ``{owner: class name}`` for layers whose name
        alone says nothing (``metadata.stats_layout``'s ``module_classes``).

    Attributes:
      variable_names, layer_names: Row names, unique.
      layer_of: For each parameter, the index of its layer row.
      variable_shapes: Each parameter's shape, a tuple.
      variable_sizes, layer_sizes: Element counts.
      variable_units: Unit count of each parameter.
      layer_units: Unit count of each layer: its last parameter's (a
        Dense or Linear layer's bias, whose elements are its units).
    """

    def __init__(self, variable_names, owners, shapes, units, module_classes=None):
        if not (len(variable_names) == len(owners) == len(shapes) == len(units)):
            raise ValueError(
                "Expected one owner, shape and unit count per parameter. "
                f"Received: {len(variable_names)} names, {len(owners)} owners, {len(shapes)} shapes, "
                f"{len(units)} unit counts"
            )
        self.variable_names = unique(list(variable_names))
        index = {}
        layer_names = []
        for owner in owners:
            if owner not in index:
                index[owner] = len(layer_names)
                layer_names.append(owner)
        self.layer_names = unique(layer_names)
        self.layer_of = [index[o] for o in owners]
        classes = module_classes or {}
        # Per layer row, its module's class where its name is an index (None elsewhere).
        self.layer_classes = [classes.get(owner) for owner in index]
        self.variable_shapes = [tuple(int(d) for d in s) for s in shapes]
        self.variable_sizes = [int(np.prod(s)) for s in self.variable_shapes]
        self.layer_sizes = [0] * len(self.layer_names)
        for size, layer in zip(self.variable_sizes, self.layer_of):
            self.layer_sizes[layer] += size
        self.variable_units = [int(u) for u in units]
        self.layer_units = [0] * len(self.layer_names)
        for count, layer in zip(self.variable_units, self.layer_of):
            self.layer_units[layer] = count  # the last parameter of the layer wins

    def layer_shapes(self):
        """Per layer row, the shapes of its parameters in order (lists of ints)."""
        out = [[] for _ in self.layer_names]
        for shape, layer in zip(self.variable_shapes, self.layer_of):
            out[layer].append(list(shape))
        return out

    def blocks(self, sparse=None, outside=()):
        """``(layers, variables)``: the two row blocks ``metadata.stats_layout`` takes.

        ``sparse``: per parameter, whether its gradient is sparse (an
        embedding's): its rows and its layer's are listed as sparse rows.
        ``outside``: indices of the parameters with a gradient that no
        parameter group of the optimizer holds: their rows and their layers'
        are listed as ``outside_optimizer`` (a key only when there are any).
        Each block stores every row's parameter shapes, which compare's
        alignment by structure reads.
        """
        sparse = list(sparse or [False] * len(self.variable_names))
        sparse_layers = {self.layer_of[i] for i, s in enumerate(sparse) if s}
        layers = {
            "rows": self.layer_names,
            "sizes": self.layer_sizes,
            "sparse_rows": [n for j, n in enumerate(self.layer_names) if j in sparse_layers],
            "shapes": self.layer_shapes(),
        }
        variables = {
            "rows": self.variable_names,
            "sizes": self.variable_sizes,
            "sparse_rows": [n for n, s in zip(self.variable_names, sparse) if s],
            "shapes": [[list(shape)] for shape in self.variable_shapes],
        }
        if outside:
            outside, outside_layers = set(outside), {self.layer_of[i] for i in outside}
            layers["outside_optimizer"] = [n for j, n in enumerate(self.layer_names) if j in outside_layers]
            variables["outside_optimizer"] = [n for i, n in enumerate(self.variable_names) if i in outside]
        if any(self.layer_classes):
            layers["module_classes"] = {n: c for n, c in zip(self.layer_names, self.layer_classes) if c}
            variables["module_classes"] = {
                n: self.layer_classes[j] for n, j in zip(self.variable_names, self.layer_of) if self.layer_classes[j]
            }
        return layers, variables

    def layer_matrix(self):
        """bool ``[L, V]``: parameter v belongs to layer l (sums over a layer's parameters on any device)."""
        out = np.zeros((len(self.layer_names), len(self.variable_names)), bool)
        out[self.layer_of, np.arange(len(self.layer_of))] = True
        return out


def trailing_units(shape, axes):
    """The unit count of a parameter whose units are its last ``axes`` axes (capped at its rank)."""
    shape = tuple(shape)
    axes = min(len(shape), axes)
    return int(np.prod(shape[len(shape) - axes :]))


def unique(names):
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
