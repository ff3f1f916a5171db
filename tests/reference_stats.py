"""The stored statistics' definitions written plainly in numpy float64: what every writer's rows are held to.

``docs/stored_format.md`` and ``docs/statistics.md`` define them; the writers
compute them on the device in their own ways, and the tests compare.
"""

import numpy as np

from tb_gradcheck.core import metadata


def reference(grads, weights, units, groups):
    """Per group of names, the written step's statistics, columns ``metadata.stored_columns(1)``.

    Args:
      grads, weights: ``{name: array}``.
      units: ``{name: unit count}`` (a layer's units are its last parameter's).
      groups: Lists of names: a layer's parameters in row order, or one name for a variable row.
    """
    out = []
    for group in groups:
        g = np.concatenate([np.asarray(grads[n], np.float64).ravel() for n in group])
        w = np.concatenate([np.asarray(weights[n], np.float64).ravel() for n in group])
        count = units[group[-1]]
        members = [
            np.all(np.asarray(grads[n], np.float64).reshape(-1, count) == 0, axis=0) for n in group if units[n] == count
        ]
        with np.errstate(over="ignore", invalid="ignore"):
            row = {
                "grad_norm": np.sqrt(np.sum(g**2)),  # NaN with a NaN, Inf with an Inf
                "grad_max_abs": np.max(np.abs(g)),
                "grad_zero_fraction": np.mean(g == 0),
                "grad_nonfinite": np.sum(~np.isfinite(g)),
                "dead_unit_fraction": np.mean(np.logical_and.reduce(members)) if count else 0.0,
                "weight_norm": np.sqrt(np.sum(w**2)),
            }
        out.append([row[c] for c in metadata.stored_columns(1)])
    return np.array(out)


def layer_groups(content):
    """Per layer row of a layout, the names of its variable rows (a variable's layer is its parent path)."""
    variables = content["variable"]["rows"]
    return [[v for v in variables if v.rsplit("/", 1)[0] == layer] for layer in content["layer"]["rows"]]


def activation_reference(flat, units=None, squashed=None, tanh=True):
    """One layer row's ``metadata.ACTIVATION_STAT_COLUMNS`` from what its module output at the step, plainly.

    Args:
      flat: float64, every element the row's module output at the step (all its calls).
      units: None, or float64 ``[elements, units]``: the output a ReLU takes, its units on the last axis
        (before the ReLU or after it: either is above 0 where the other is). Gives ``act_dead_fraction``.
      squashed: None, or the following tanh's or sigmoid's output (any shape). Gives ``act_saturated_fraction``.
      tanh: ``squashed`` is a tanh's (else a sigmoid's).
    """
    want = {
        "act_rms": np.sqrt(np.mean(flat**2)),
        "act_max_abs": np.abs(flat).max(),
        "act_nonfinite": float(np.sum(~np.isfinite(flat))),
        "act_dead_fraction": -1.0,
        "act_saturated_fraction": -1.0,
    }
    if units is not None:
        alive = np.any((units > 0) | np.isnan(units), axis=0)  # a NaN unit is not dead: its output is not 0
        want["act_dead_fraction"] = float(np.mean(~alive))
    if squashed is not None:
        near = np.abs(squashed) > 0.98 if tanh else (squashed < 0.01) | (squashed > 0.99)
        want["act_saturated_fraction"] = float(np.mean(near))
    return want
