"""A window's steps between writes (``every_n_steps > 1``), reduced on the device with nothing read back.

``DeviceWindow`` keeps ``running.State`` on the gradients' device and adds
each step with ``running.step_columns`` and ``running.add`` (a handful of
small kernels, no host synchronisation). ``HeldWindow`` is for sharded
parameters, whose per-step norms are partial sums until their all-reduce:
it holds each step's partial reductions on the device and reduces them,
after the one all-reduce of the write, with the same ``running`` functions
on the host.
"""

import numpy as np
import torch

from tb_gradcheck import running

F64 = torch.float64


class DeviceWindow:
    """The running reductions of the steps since the last write, on the device.

    Args:
      structure: The rows' ``structure.Structure``.
      constants: The writer's ``reductions.Constants`` (masks made once).
    """

    def __init__(self, structure, constants):
        self._structure = structure
        self._constants = constants
        self._state = None
        self.steps = []

    def add(self, norm_v, nonfinite_v, present, step):
        """Adds one step: float64 ``[V]`` norms and non-finite counts (0 where absent), ``present`` a tuple."""
        device = norm_v.device
        structure = self._structure
        mask = self._constants.get(("present", present), device, lambda: torch.tensor(present))
        layers = self._constants.get("layer_matrix", device, lambda: torch.from_numpy(structure.layer_matrix()))
        layer_present = self._constants.get(
            ("layer_present", present), device, lambda: torch.from_numpy(_layer_present(structure, present))
        )
        if self._state is None:
            n_rows = len(structure.layer_names) + len(structure.variable_names)
            self._state = running.init(lambda shape, v: torch.full(shape, v, dtype=F64, device=device), n_rows)
        x = running.step_columns(torch, norm_v, nonfinite_v, mask, layers, layer_present)
        self._state = running.add(torch, self._state, x)
        self.steps.append(step)

    def take(self, pack):
        """Adds the state to ``pack`` and starts a new window; returns the window's steps."""
        for name, value in zip(running.State._fields, self._state):
            pack.add("state/" + name, value)
        steps, self._state, self.steps = self.steps, None, []
        return steps

    @staticmethod
    def host_state(host, steps):
        """The window's ``running.State`` on the host (``rowstats.window_slabs``' input)."""
        state = running.State(*[host["state/" + name] for name in running.State._fields])
        return running.to_numpy(state, np.asarray, steps)


class HeldWindow:
    """Each step's partial (per-shard) squared norms and non-finite counts, held on the device until the write."""

    def __init__(self, structure, constants):
        self._structure = structure
        self._held = []
        self._present = []
        self.steps = []

    def add(self, norm_v, nonfinite_v, present, step):
        self._held.append(torch.stack([norm_v * norm_v, nonfinite_v]))
        self._present.append(present)
        self.steps.append(step)

    def take(self, pack):
        pack.add("held", torch.stack(self._held))  # [S, 2, V]; summed over shards by the all-reduce
        steps, present = self.steps, self._present
        self._held, self._present, self.steps = [], [], []
        self._taken = present
        return steps

    def host_state(self, host, steps):
        structure = self._structure
        layers = structure.layer_matrix()
        n_rows = len(structure.layer_names) + len(structure.variable_names)
        state = running.init(lambda shape, v: np.full(shape, v, np.float64), n_rows)
        for (squares, nonfinite), present in zip(host["held"], self._taken):
            present = np.array(present)
            x = running.step_columns(
                np, np.sqrt(squares), nonfinite, present, layers, _layer_present(structure, present)
            )
            state = running.add(np, state, x)
        return running.to_numpy(state, np.asarray, steps)


def _layer_present(structure, present):
    return structure.layer_matrix() @ np.asarray(present, bool) > 0
