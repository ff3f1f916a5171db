"""A window's steps between writes (``every_n_steps > 1``), reduced on the device with nothing read back.

Each step's per-parameter norms and non-finite flags are written straight
into a row of a history on the device (``slot``: the reductions' own
output, no copy); every ``HISTORY`` steps, and at the write, the rows are
added to the window's ``running.State`` at once (``running.step_columns``
and ``running.add_steps``, a fixed number of small kernels whatever the
number of steps). So a step between writes costs its reductions and no
bookkeeping kernel of its own, and the host never waits for the device.
A flag is 1 where a gradient has a NaN or Inf element: the window's
``grad_nonfinite`` counts steps (a layer's too, however many of its
parameters had one), the written step's ``last`` slab elements
(``docs/statistics.md``).

``HeldWindow`` is for sharded parameters, whose per-step values are partial
sums until the all-reduce of the write: it keeps every step's row until the
write and reduces them on the host after that one all-reduce, with the same
``running`` functions.
"""

import numpy as np
import torch

from tb_gradcheck.core import running

F64 = torch.float64
# Steps held on the device before they are added to the running state.
HISTORY = 32


class DeviceWindow:
    """The steps since the last write, on the device.

    Args:
      structure: The rows' ``structure.Structure``.
      constants: The writer's ``reductions.Constants`` (masks made once).
    """

    def __init__(self, structure, constants):
        self._structure = structure
        self._constants = constants
        self._history = None  # float64 [HISTORY, 2, V]: norms and non-finite flags
        self._held = []  # the present flags of the rows held
        self._state = None
        self.steps = []

    def slot(self, device):
        """The ``[2, V]`` row this step's norms and counts go to (``add`` then keeps it)."""
        if self._history is None:
            self._history = torch.empty((HISTORY, 2, len(self._structure.variable_names)), dtype=F64, device=device)
        return self._history[len(self._held)]

    def add(self, present, step):
        """Keeps the row of ``slot`` as the step ``step`` with parameters ``present`` (a tuple)."""
        self._held.append(present)
        self.steps.append(step)
        if len(self._held) == HISTORY:
            self._fold()

    def _fold(self):
        held = len(self._held)
        if not held:
            return
        structure, constants = self._structure, self._constants
        rows = self._history[:held]
        device = rows.device
        layers = constants.get("layer_matrix", device, lambda: torch.from_numpy(structure.layer_matrix()))
        patterns = sorted(set(self._held))
        masks = {p: _masks(structure, constants, p, device) for p in patterns}
        if len(patterns) == 1:
            mask, layer_mask = masks[patterns[0]]
            mask, layer_mask = mask.expand(held, -1), layer_mask.expand(held, -1)
        else:
            mask = torch.stack([masks[p][0] for p in self._held])
            layer_mask = torch.stack([masks[p][1] for p in self._held])
        if self._state is None:
            n_rows = len(structure.layer_names) + len(structure.variable_names)
            self._state = running.init(lambda shape, v: torch.full(shape, v, dtype=F64, device=device), n_rows)
        xs = running.step_columns(torch, rows[:, 0], rows[:, 1], mask, layers, layer_mask)
        xs[..., 1].clamp_(max=1.0)  # a layer's step is non-finite once, however many of its parameters are
        self._state = running.add_steps(torch, self._state, xs)
        self._held = []

    def take(self, pack):
        """Adds the window's state to ``pack`` and starts a new window; returns the window's steps."""
        self._fold()
        for name, value in zip(running.State._fields, self._state):
            pack.add("state/" + name, value)
        steps, self._state, self.steps = self.steps, None, []
        return steps

    def host_state(self, host, steps):
        """The window's ``running.State`` on the host (``rowstats.window_slabs``' input)."""
        state = running.State(*[host["state/" + name] for name in running.State._fields])
        return running.to_numpy(state, np.asarray, steps)


class HeldWindow:
    """Each step's partial (per-shard) norms and non-finite flags, held on the device until the write."""

    def __init__(self, structure, constants):
        self._structure = structure
        self._rows = []
        self._present = []
        self._taken = []
        self.steps = []

    def slot(self, device):
        self._rows.append(torch.empty((2, len(self._structure.variable_names)), dtype=F64, device=device))
        return self._rows[-1]

    def add(self, present, step):
        self._present.append(present)
        self.steps.append(step)

    def take(self, pack):
        held = torch.stack(self._rows)
        held[:, 0] = held[:, 0] * held[:, 0]  # squares: their sum over the shards is the whole's
        pack.add("held", held)  # [S, 2, V], summed over the shards by the all-reduce
        steps, self._taken = self.steps, self._present
        self._rows, self._present, self.steps = [], [], []
        return steps

    def host_state(self, host, steps):
        structure = self._structure
        layers = structure.layer_matrix()
        n_rows = len(structure.layer_names) + len(structure.variable_names)
        state = running.init(lambda shape, v: np.full(shape, v, np.float64), n_rows)
        present = np.array(self._taken, bool)
        held = host["held"].reshape(len(self._taken), 2, -1)
        xs = running.step_columns(np, np.sqrt(held[:, 0]), held[:, 1], present, layers, present @ layers.T > 0)
        xs[..., 1] = np.minimum(xs[..., 1], 1.0)  # flags summed over the shards and a layer's parameters
        state = running.add_steps(np, state, xs)
        return running.to_numpy(state, np.asarray, steps)


def _masks(structure, constants, present, device):
    """bool ``[V]`` present parameters and bool ``[L]`` layers with one, on ``device`` (made once per pattern)."""
    mask = constants.get(("present", present), device, lambda: torch.tensor(present))
    layer_mask = constants.get(
        ("layer_present", present),
        device,
        lambda: torch.from_numpy(structure.layer_matrix() @ np.asarray(present, bool) > 0),
    )
    return mask, layer_mask
