"""Dead-unit fractions of parameters and layers from per-unit flags (``rowstats``' ``dead_unit_fraction``).

A unit is dead at a step when its every gradient element is exactly 0; a
layer's unit j is dead when it is dead in every present parameter with the
layer's unit count. A *pruned* unit (``torch.nn.utils.prune``: every
element of it masked to 0) has a zero gradient by construction, not because
it died: the mask took it out of the network on purpose. It is neither dead
nor alive, and is left out of the fraction, numerator and denominator: the
fraction is of the units the network still has. A layer's unit is pruned
when it is pruned in every parameter with the layer's unit count (a
structured-pruned ``Linear`` row whose bias is not masked is still a unit,
its bias; it is dead if its bias gets no gradient).
"""

import numpy as np

MISSING = -1.0


def fractions(dead, where, structure, pruned=None):
    """Dead-unit fraction of each present parameter ``[P]``, and of each layer ``[L]`` (MISSING where undefined).

    Args:
      dead: bool ``[sum of the present parameters' units]``, per unit in parameter order: every element is 0.
      where: The present parameters' indices.
      structure: The rows' ``structure.Structure``.
      pruned: None, or bool like ``dead``: the unit is masked out (counted neither way).
    """
    units = np.asarray([structure.variable_units[i] for i in where], int)
    n_layer = len(structure.layer_names)
    if len(dead) != units.sum():
        raise ValueError(
            "Expected one dead flag per unit of the present parameters. "
            f"Received: {len(dead)} flags for {int(units.sum())} units"
        )
    pruned = np.zeros(len(dead), bool) if pruned is None else np.asarray(pruned, bool)
    starts = np.concatenate([[0], np.cumsum(units)]).astype(int)

    def per_parameter(flags):  # whole arrays, not a NumPy call per parameter: this runs at every written step
        cumulative = np.concatenate([[0], np.cumsum(flags, dtype=np.int64)])
        return cumulative[starts[1:]] - cumulative[starts[:-1]]

    counted = units - per_parameter(pruned)
    dead_v = np.where(counted > 0, per_parameter(dead & ~pruned) / np.maximum(counted, 1), 0.0)
    # A layer's unit j is dead when it is dead in every present parameter of
    # the layer with the layer's unit count; a layer none of whose present
    # parameters has that count has no fraction.
    layer_of = np.asarray(structure.layer_of)[np.asarray(where, int)]
    layer_units = np.asarray(structure.layer_units, int)
    match = units == layer_units[layer_of] if len(where) else np.zeros(0, bool)
    offsets = np.concatenate([[0], np.cumsum(layer_units)]).astype(int)
    slots = np.concatenate([offsets[layer] + np.arange(u) for layer, u in zip(layer_of[match], units[match])] or [[]])
    pieces = list(zip(starts[:-1][match], starts[1:][match]))
    flags = np.concatenate([dead[s:e] for s, e in pieces] or [[]]).astype(bool)
    masked = np.concatenate([pruned[s:e] for s, e in pieces] or [[]]).astype(bool)
    total = int(offsets[-1])
    slots = slots.astype(int)
    alive = np.bincount(slots, ~flags, minlength=total)
    kept = np.bincount(slots, ~masked, minlength=total) > 0  # not pruned in some matching parameter
    slot_layer = np.repeat(np.arange(n_layer), layer_units)
    dead_l = np.bincount(slot_layer, (alive == 0) & kept, n_layer) / np.maximum(
        np.bincount(slot_layer, kept, n_layer), 1
    )
    covered = np.bincount(layer_of[match], minlength=n_layer) > 0
    return dead_v, np.where(covered, dead_l, MISSING)
