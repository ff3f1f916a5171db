"""The rows of a Keras fit on the torch backend: the applied gradients reduced on their device, written through the core.

``tb_gradcheck.torch.keras``'s hooks hand each update's gradients here
(``Recorder.update``) and, at a written step, the weights before and after
it (``Recorder.write``). Rows are the TensorFlow callback's: Keras variable
paths in the order of ``model.trainable_variables``, layers their parent
paths (``keras.variables.owner``), units as ``keras.variables.unit_axes``
says. A step that is not written adds its norms and non-finite counts to
the window's running state (``core.running``) on the device and reads
nothing back; a written step reduces every statistic on the device, reads
them in one transfer and makes the rows with ``core.rowstats``, the
definitions every writer shares. Norms are taken in float64 (float32
squares over- and underflow where the stored norms do not).
"""

import numpy as np
import torch

from tb_gradcheck.core import eventlog
from tb_gradcheck.core import metadata
from tb_gradcheck.core import rowstats
from tb_gradcheck.core import run_directory
from tb_gradcheck.core import running
from tb_gradcheck.core import structure
from tb_gradcheck.core import validate
from tb_gradcheck.keras.variables import owner
from tb_gradcheck.keras.variables import unit_axes

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

    def __init__(self, model, run_dir, every_n_steps, clips, loss_scale=False):
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
        wanted = UPDATE_COLUMNS + ((BEFORE_CLIP_COLUMN,) if clips else ()) + (LOSS_SCALE_COLUMNS if loss_scale else ())
        self.columns = tuple(c for c in metadata.OPTIMIZER_STAT_COLUMNS if c in wanted)
        layers, variables = s.blocks()
        aggregates = metadata.AGGREGATES if every_n_steps > 1 else metadata.SINGLE_STEP_AGGREGATES
        self.content = metadata.stats_layout(layers, variables, aggregates, every_n_steps, self.columns)
        run_directory.announce(run_dir)
        self.log = eventlog.EventLog(run_dir)
        self.window = None  # running.State on the gradients' device, since the last write
        self.window_steps = []
        self.masks = {}  # present flags -> the device masks running.step_columns takes
        self.refused = 0  # steps the loss scaler refused since the last write

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
        present = np.zeros(len(self.variables), bool)
        present[rows] = True
        norms = norms64(grads)
        nonfinite = _nonfinite(grads, norms)
        if self.every > 1:
            self._add_to_window(norms, nonfinite, rows, present, device)
            self.window_steps.append(step)
        if not due:
            return None
        if before_clip is not None:
            full = torch.full((len(self.variables),), rowstats.MISSING, dtype=F64, device=device)
            before_clip = full.index_copy_(0, torch.as_tensor(rows, device=device), before_clip)
        return present, norms, nonfinite, grads, rows, before_clip

    def _add_to_window(self, norms, nonfinite, rows, present, device):
        s = self.structure
        key = present.tobytes()
        masks = self.masks.get(key)
        if masks is None:
            layer_present = np.bincount(s.layer_of, present, len(s.layer_names)) > 0
            masks = self.masks[key] = tuple(
                torch.as_tensor(a, device=device) for a in (present, s.layer_matrix(), layer_present, rows)
            )
        present_t, matrix, layer_present, where = masks
        n = len(self.variables)
        norm_v = torch.zeros(n, dtype=F64, device=device).index_copy_(0, where, norms)
        nonfinite_v = torch.zeros(n, dtype=F64, device=device).index_copy_(0, where, nonfinite)
        if self.window is None:
            rows_count = len(s.layer_names) + n
            self.window = running.init(lambda shape, v: torch.full(shape, v, dtype=F64, device=device), rows_count)
        x = running.step_columns(torch, norm_v, nonfinite_v, present_t, matrix, layer_present)
        self.window = running.add(torch, self.window, x)

    def write(self, step, taken, before, scale=None):
        """Writes a written step.

        Args:
          step: The step.
          taken: What ``update`` returned for it.
          before: The weights before the update (the variables hold those
            after it), or None for a step that updated nothing (refused).
          scale: The loss scale of the step (a scalar tensor), or None.
        """
        s = self.structure
        present, norms, nonfinite, grads, rows, before_clip = taken
        refused_step = before is None
        if refused_step:
            before = [v.value.detach() for v in self.variables]
        zeros = [g == 0 for g in grads]  # NaN is not 0: it counts as nonzero and keeps its unit alive
        nonzero = torch.stack([(z.numel() - z.sum()).to(F64) for z in zeros])
        parts = [norms, nonfinite, torch.stack([_max_abs(g) for g in grads]), nonzero]
        parts.append(norms64(before))
        after = [v.value.detach() for v in self.variables]
        parts.append(norms64([a.float() - b.float() for a, b in zip(after, before)]) ** 2)
        if before_clip is not None:
            parts.append(before_clip)
        if scale is not None:
            parts.append(scale.reshape(1))
        parts.extend(_dead(z, s.variable_units[i]) for z, i in zip(zeros, rows))
        flat = torch.cat([p.reshape(-1).to(F64) for p in parts]).cpu().numpy()  # the one read of the step
        p, v = len(rows), len(self.variables)
        norm, nonfinite, max_abs, nonzero = (flat[k * p : (k + 1) * p] for k in range(4))
        weights, update_squares = flat[4 * p : 4 * p + v], flat[4 * p + v : 4 * p + 2 * v]
        offset = 4 * p + 2 * v
        if before_clip is not None:
            before_clip, offset = flat[offset : offset + v], offset + v
        refused = None
        if scale is not None:
            scale, refused, offset = flat[offset], self.refused, offset + 1
            self.refused = 0
        reductions = rowstats.Reductions(present, norm, nonfinite, max_abs, nonzero, flat[offset:] > 0.5)
        windowed = self.every > 1
        layer, variable = rowstats.rows(reductions, s, weights, onset=windowed)
        slabs = np.concatenate([layer, variable])[None]
        if windowed:
            slabs = rowstats.window_slabs(self._take_window(), step, _both(weights, s), last=slabs[0])
        values = rowstats.optimizer_values(s, weights, update_squares, before_clip, scale, refused)
        if refused_step:  # the weights did not move: 0, also where they are all zero (TensorFlow's RefusedUpdate)
            values["update_to_weight"] = values["update_norm"]
        self._stats(slabs, values, step)

    def write_partial(self):
        """Writes the window under way (the steps since the last write), if any, with the weights as they are now."""
        if self.window is None or not self.window_steps:
            return
        step = self.window_steps[-1]
        weights = norms64([v.value.detach() for v in self.variables]).cpu().numpy()
        slabs = rowstats.window_slabs(self._take_window(), step, _both(weights, self.structure))
        self._stats(slabs, None, step)

    def _take_window(self):
        state = running.to_numpy(self.window, lambda t: t.cpu().numpy(), self.window_steps)
        self.window, self.window_steps = None, []
        return state

    def _stats(self, slabs, values, step):
        n_layers = len(self.structure.layer_names)
        layer, variable = rowstats.fill(slabs[:, :n_layers], slabs[:, n_layers:], self.columns, values)
        self.log.stats(self.content, layer, variable, step)


def norms64(tensors):
    """float64 ``[n]`` L2 norms of ``tensors``, on their device."""
    with torch.no_grad():
        return torch.stack(torch._foreach_norm(list(tensors), 2, dtype=F64))


def _nonfinite(grads, norms):
    """float64 ``[n]``: the NaN and Inf elements of each gradient.

    A float64 norm of float32 (or narrower) elements is finite exactly when
    every element is: on a CPU, where reading it costs no wait, a step
    whose norms are all finite (nearly every step) counts nothing more.
    """
    if norms.device.type == "cpu" and bool(torch.isfinite(norms).all()):
        return torch.zeros_like(norms)
    return torch.stack([(~torch.isfinite(g)).sum().to(F64) for g in grads])


def _max_abs(g):
    """The largest |element| (NaN if any is NaN), in one pass that allocates nothing of ``g``'s size."""
    if not g.numel():
        return torch.zeros((), dtype=F64, device=g.device)
    low, high = torch.aminmax(g)
    return torch.maximum(-low, high).to(F64)


def _dead(zeros, units):
    """bool ``[units]``: whether each unit (an index of the trailing axes) has an all-zero gradient (``zeros``: ``g == 0``)."""
    if units == 0 or zeros.numel() == 0:
        return torch.ones(units, dtype=torch.bool, device=zeros.device)
    return zeros.reshape(-1, units).all(dim=0)


def _both(per_variable, s):
    """float64 ``[L + V]``: layer norms then the per-variable ones."""
    return np.concatenate([rowstats.combine_norms(per_variable, s), per_variable])
