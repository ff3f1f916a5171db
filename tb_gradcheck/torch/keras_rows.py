"""The rows of a Keras fit on the torch backend: the applied gradients reduced on their device, written through the core.

``tb_gradcheck.torch.keras``'s hooks hand each update's gradients here
(``Recorder.update``) and, at a written step, the weights before and after
it (``Recorder.write``). Rows are the TensorFlow callback's: Keras variable
paths in the order of ``model.trainable_variables``, layers their parent
paths (``keras.variables.owner``), units as ``keras.variables.unit_axes``
says. The reductions are the PyTorch writer's (``torch.reductions``), in
multi-tensor operators: a step that is not written writes its norms and
non-finite flags into a row of the writer's window on the device
(``torch.window.DeviceWindow``) and reads nothing back, in a fixed number
of operators whatever the number of variables; a written step adds the
writer's ``reductions.extras`` (max |g|, zeros, NaN and Inf counts, dead
units), the weights' and the update's norms, reads them in one transfer
(``torch.host.Pack``) and makes the rows with ``core.rowstats``, the
definitions every writer shares. Norms are exact at every magnitude
(``reductions.norms``: float32 squares over- and underflow where the
stored norms do not).
"""

import numpy as np
import torch

from tb_gradcheck.core import eventlog
from tb_gradcheck.core import metadata
from tb_gradcheck.core import rowstats
from tb_gradcheck.core import run_directory
from tb_gradcheck.core import structure
from tb_gradcheck.core import validate
from tb_gradcheck.keras.variables import owner
from tb_gradcheck.keras.variables import unit_axes
from tb_gradcheck.torch import host
from tb_gradcheck.torch import reductions
from tb_gradcheck.torch import window
from tb_gradcheck.torch.modules import UnitSpec

UPDATE_COLUMNS = ("update_norm", "update_to_weight")
BEFORE_CLIP_COLUMN = "grad_norm_before_clip"
LOSS_SCALE_COLUMNS = ("loss_scale", "refused_steps")
F64 = torch.float64


class Recorder:
    """One fit's rows, layout, window and event log.

    Args:
      model: The Keras model; its ``trainable_variables`` are the rows.
      run_dir: The run's directory (``log_dir/train``).
      every_n_steps: Steps per write.
      clips: Whether the optimizer clips (a ``grad_norm_before_clip`` column).
      loss_scale: Whether a LossScaleOptimizer scales the loss (``loss_scale``
        and ``refused_steps`` columns).
    """

    def __init__(self, model, run_dir, every_n_steps, clips, loss_scale=False, activations=False):
        self.variables = list(model.trainable_variables)
        names = structure.unique([validate.variable_name(v) for v in self.variables])
        axes = unit_axes(model)
        shapes = [tuple(int(d) for d in v.shape) for v in self.variables]
        self.structure = s = structure.Structure(
            names,
            [owner(v, n) for v, n in zip(self.variables, names)],
            shapes,
            [structure.trailing_units(shape, axes.get(n, 1)) for shape, n in zip(shapes, names)],
        )
        self.every = every_n_steps
        # Units are the trailing axes (``unit_axes``): unit j holds the elements at flat index j modulo the units.
        self.specs = [
            UnitSpec((int(np.prod(shape)) // max(u, 1), u), (0,), u) for shape, u in zip(shapes, s.variable_units)
        ]
        wanted = UPDATE_COLUMNS + ((BEFORE_CLIP_COLUMN,) if clips else ()) + (LOSS_SCALE_COLUMNS if loss_scale else ())
        wanted += metadata.ACTIVATION_STAT_COLUMNS if activations else ()
        self.columns = tuple(c for c in metadata.OPTIONAL_STAT_COLUMNS if c in wanted)
        layers, variables = s.blocks()
        aggregates = metadata.AGGREGATES if every_n_steps > 1 else metadata.SINGLE_STEP_AGGREGATES
        self.content = metadata.stats_layout(layers, variables, aggregates, every_n_steps, self.columns)
        run_directory.announce(run_dir)
        self.log = eventlog.EventLog(run_dir)
        self.constants = reductions.Constants()  # index tensors made once per device
        # The steps since the last write, on the gradients' device (the PyTorch writer's window).
        self.window = window.DeviceWindow(s, self.constants) if every_n_steps > 1 else None
        self.refused = 0  # steps the loss scaler refused since the last write
        self.last = None  # the last step's applied gradients and their rows, while a window is under way

    def update(self, step, due, grads, rows, before_clip=None, refused=False):
        """One update's applied gradients: into the window; at a written step, what ``write`` reads.

        Args:
          step: The update's step.
          due: Whether it is written.
          grads: The applied gradients, in row order.
          rows: Their rows (sorted, each once).
          before_clip: float64 ``[len(rows)]`` norms before clipping (a device tensor), or None.
          refused: The loss scaler refused the step (it updated nothing).

        Returns:
          At a written step, what ``write`` takes; else None.
        """
        device = grads[0].device
        self.refused += bool(refused)
        n = len(self.variables)
        present = [False] * n
        for i in rows:
            present[i] = True
        present = tuple(present)
        out = self.window.slot(device) if self.window is not None else torch.empty((2, n), dtype=F64, device=device)
        columns = reductions.present_norms(grads, rows, self.constants, out)  # [2, V]: norms, non-finite flags
        if self.window is not None:
            self.window.add(present, step)
            # References, no copy: a window that ends unwritten counts this step's NaN and Inf elements (``write_partial``).
            self.last = (grads, rows)
        if not due:
            return None
        extras = reductions.extras(grads, [self.specs[i] for i in rows], self.constants)
        if before_clip is not None:
            full = torch.full((n,), rowstats.MISSING, dtype=F64, device=device)
            before_clip = full.index_copy_(0, torch.as_tensor(rows, device=device), before_clip)
        return present, columns, extras, grads, rows, before_clip

    def write(self, step, taken, before, scale=None, activations=None):
        """Writes a written step.

        Args:
          step: The step.
          taken: What ``update`` returned for it.
          before: The weights before the update (the variables hold those
            after it), or None for a step that updated nothing (refused).
          scale: The loss scale of the step (a scalar tensor), or None.
          activations: float64 ``[L, len(rowstats.ACTIVATION_SUMS)]`` sums of the
            layers' outputs (``tb_gradcheck.keras.activations``), or None.
        """
        s = self.structure
        present, columns, extras, grads, rows, before_clip = taken
        refused_step = before is None
        if refused_step:
            before = [v.value.detach() for v in self.variables]
        after = [v.value.detach() for v in self.variables]
        pack = host.Pack()
        for name, value in extras.items():
            pack.add(name, value)
        pack.add("norm", columns[0])
        pack.add("weight", reductions.norms(before))
        pack.add("update", reductions.norms(_differences(after, before)) ** 2)
        if before_clip is not None:
            pack.add("before_clip", before_clip)
        if scale is not None:
            pack.add("loss_scale", scale)
        if activations is not None:
            pack.add("act", activations)
        steps = self.window.take(pack) if self.window is not None else None
        values = pack.to_host()  # the one read of the step
        weights = values["weight"]
        stats = rowstats.Reductions(
            np.array(present, bool),
            values["norm"][rows],
            values["nonfinite"],
            values["max_abs"],
            values["nonzero"],
            values["unit_nonzero"] == 0,
        )
        windowed = self.window is not None
        layer, variable = rowstats.rows(stats, s, weights, onset=windowed)
        slabs = np.concatenate([layer, variable])[None]
        if windowed:
            state = self.window.host_state(values, steps)
            slabs = rowstats.window_slabs(state, step, _both(weights, s), last=slabs[0])
        refused = None
        if scale is not None:
            scale, refused = float(values["loss_scale"]), self.refused
            self.refused = 0
        update_squares = values["update"]
        optimizer = rowstats.optimizer_values(s, weights, update_squares, values.get("before_clip"), scale, refused)
        if activations is not None:
            optimizer.update(rowstats.activation_values(s, values["act"]))
        if refused_step:  # the weights did not move: 0, also where they are all zero (TensorFlow's RefusedUpdate)
            optimizer["update_to_weight"] = optimizer["update_norm"]
        self._stats(slabs, optimizer, step)

    def write_partial(self):
        """Writes the window under way (the steps since the last write), if any, with the weights as they are now."""
        if self.window is None or not self.window.steps:
            return
        pack = host.Pack()
        pack.add("weight", reductions.norms([v.value.detach() for v in self.variables]))
        steps = self.window.take(pack)
        values = pack.to_host()
        state = self.window.host_state(values, steps)
        if self.last is not None:
            _count_last(state.last, *self.last, self.structure)
        self.last = None
        slabs = rowstats.window_slabs(state, steps[-1], _both(values["weight"], self.structure))
        self._stats(slabs, None, steps[-1])

    def _stats(self, slabs, values, step):
        n_layers = len(self.structure.layer_names)
        layer, variable = rowstats.fill(slabs[:, :n_layers], slabs[:, n_layers:], self.columns, values)
        self.log.stats(self.content, layer, variable, step)


def norms64(tensors):
    """float64 ``[n]`` L2 norms of ``tensors``, on their device, exact at every magnitude (``reductions.norms``)."""
    return reductions.norms(list(tensors))


def _differences(after, before):
    """``after - before`` per variable, in float32 at least (a float16 or bfloat16 weight's change is taken wider)."""
    if all(a.dtype == torch.float32 for a in after):
        return torch._foreach_sub(after, before)  # one multi-tensor operator
    return [a.float() - b.float() for a, b in zip(after, before)]


def _count_last(last, grads, rows, s):
    """Puts the last step's NaN and Inf element counts into a window's ``last`` columns (``[L + V, 3]``, in place).

    Between writes the window holds only whether a gradient had one (its
    norm is not finite: no per-tensor count at every step); a window's
    ``last`` slab keeps the element count (``running.steps_flagged``), so
    the few flagged gradients of the last step are counted here, once.
    """
    n_layers = len(s.layer_names)
    flags = last[:, 1]
    counts = np.zeros(len(s.variable_names))
    for g, i in zip(grads, rows):
        if flags[n_layers + i] > 0:
            counts[i] = flags[n_layers + i] = int(torch.isfinite(g).logical_not_().sum())
    layer_counts = np.bincount(s.layer_of, counts, n_layers)
    flags[:n_layers] = np.where(flags[:n_layers] > 0, layer_counts, flags[:n_layers])


def _both(per_variable, s):
    """float64 ``[L + V]``: layer norms then the per-variable ones."""
    return np.concatenate([rowstats.combine_norms(per_variable, s), per_variable])
