"""A written step's statistics on their way to the host: copied without waiting, written once they are there.

On a GPU, reading a written step's statistics with ``.cpu()`` makes the
host wait for everything queued before them: the whole backward pass, and
the device idles while the host then computes the rows and writes the
event. Instead ``send`` copies the step's one float64 vector into pinned
host memory with ``non_blocking=True`` and records a CUDA event behind the
copy; the writer checks the event without waiting (``Copy.ready``, at its
later calls) and does the host side (rows, event) once the copy is there.
It waits (``Copy.values``) only at ``flush`` / ``close``, or when
``MAX_IN_FLIGHT`` copies are already under way, which bounds the pinned
memory held. On a CPU there is nothing to wait for: the values are there at
once and the step is written in the same call, as before.

The pinned buffers are kept (``Buffers``) and reused: a written step's
vector has the same size from one write to the next, so after the first
writes no host memory is pinned again.
"""

import collections

import numpy as np
import torch

from tb_gradcheck.core import rowstats
from tb_gradcheck.core import running

F64 = torch.float64
# Written steps whose copy may be under way at once; the oldest is waited for before one more starts.
MAX_IN_FLIGHT = 2


class Copy:
    """A written step's named float64 values, on their way to the host (or already there).

    Args:
      names: The values' names, in order.
      shapes: Their shapes.
      flat: The values laid out flat: a numpy array already on the host, or
        a pinned host tensor a copy is filling.
      event: The CUDA event recorded after that copy, or None when ``flat``
        is already there.
      buffers: The ``Buffers`` that ``flat`` goes back to once read, or None.
    """

    def __init__(self, names, shapes, flat, event=None, buffers=None):
        self._names, self._shapes = names, shapes
        self._flat, self._event, self._buffers = flat, event, buffers

    def ready(self):
        """Whether the values are on the host (never waits)."""
        if self._event is not None and self._event.query():
            self._arrived()
        return self._event is None

    def values(self):
        """``{name: numpy float64 array}``, waiting for the copy if it is still under way."""
        if self._event is not None:
            self._event.synchronize()
            self._arrived()
        flat = self._flat
        out, at = {}, 0
        for name, shape in zip(self._names, self._shapes):
            n = int(np.prod(shape, dtype=np.int64))
            out[name] = flat[at : at + n].reshape(shape)
            at += n
        return out

    def _arrived(self):
        # The pinned buffer is reused by a later copy: the values are read out of it first.
        self._event = None
        pinned, self._flat = self._flat, self._flat.numpy().copy()
        self._buffers.give_back(pinned)


def arrived(values):
    """A ``Copy`` of values already on the host (``{name: array}``)."""
    names = tuple(values)
    shapes = tuple(np.shape(values[n]) for n in names)
    parts = [np.asarray(values[n], np.float64).reshape(-1) for n in names]
    return Copy(names, shapes, np.concatenate(parts) if parts else np.zeros(0))


class Buffers:
    """Pinned float64 host buffers by length, reused from one written step to the next."""

    def __init__(self):
        self._free = collections.defaultdict(list)

    def take(self, n):
        free = self._free[n]
        return free.pop() if free else torch.empty(n, dtype=F64, pin_memory=True)

    def give_back(self, buffer):
        free = self._free[buffer.numel()]
        if len(free) <= MAX_IN_FLIGHT:
            free.append(buffer)


def send(names, shapes, flat, buffers):
    """Starts copying ``flat`` (a float64 device vector) to the host; returns its ``Copy``.

    On a GPU the copy is queued behind the work that makes ``flat`` and the
    host goes on at once; on a CPU the values are simply there.
    """
    if flat.device.type != "cuda":
        return Copy(names, shapes, flat.numpy())
    pinned = buffers.take(flat.numel())
    pinned.copy_(flat, non_blocking=True)
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(flat.device))
    return Copy(names, shapes, pinned, event, buffers)


class Pending:
    """A written step: its device statistics (``pack``) until they are sent, and what its event needs."""

    def __init__(self, step, key, pack, steps, where):
        self.step, self.key, self.pack, self.steps, self.where = step, key, pack, steps, where


class Flights:
    """Written steps whose copy is under way, written in step order (``write(pending, values)``) as each arrives."""

    def __init__(self, write):
        self._write = write
        self._queue = collections.deque()  # (Pending, Copy)
        self.buffers = Buffers()

    def __len__(self):
        return len(self._queue)

    def add(self, pending, copy):
        if len(self._queue) >= MAX_IN_FLIGHT:
            self.arrive(wait=1)  # bounds the pinned memory held
        self._queue.append((pending, copy))

    def arrive(self, wait=0):
        """Writes the steps whose copy is on the host, in step order, waiting for the first ``wait`` of them."""
        queue = self._queue
        while queue and (wait > 0 or queue[0][1].ready()):
            pending, copy = queue.popleft()
            wait -= 1
            self._write(pending, copy.values())


def step_slabs(pending, values, structure, window=None):
    """``(layer [A, L, C], variable [A, V, C])`` of a written step, from its values on the host.

    Args:
      pending: The step's ``Pending``.
      values: ``{name: array}``, its pack on the host (``Copy.values``).
      structure: The rows' ``structure.Structure``.
      window: The writer's window when it writes windows (``every_n_steps > 1``), else None.
    """
    present, _, columns = pending.key
    stats = rowstats.Reductions(
        present=np.array(present, bool),
        norm=values["norm"][pending.where],
        nonfinite=values.get("nonfinite", np.zeros(0)),  # elements, of the present parameters
        max_abs=values.get("max_abs", np.zeros(0)),
        nonzero=values.get("nonzero", np.zeros(0)),
        dead=values.get("unit_nonzero", np.zeros(0)) <= 0,
        pruned=values.get("unit_nonzero", np.zeros(0)) < 0,  # step.py's mark: masked out whole (its gradient is 0)
    )
    layer, variable = rowstats.rows(stats, structure, values["weight"], onset=window is not None)
    if window is not None:
        state = window.host_state(values, pending.steps)
        last = np.concatenate([layer, variable])
        layer, variable = window_slabs(state, pending.step, values["weight"], structure, last)
    else:
        layer, variable = layer[None], variable[None]
    if columns:
        optimizer = rowstats.optimizer_values(
            structure,
            values["weight"],
            update_squares=_update_squares(values, len(structure.variable_names)),
            before_clip=values.get("before_clip"),
            loss_scale=float(values["loss_scale"]) if "loss_scale" in values else None,
            refused=float(values["refused"]) if "refused" in values else None,
        )
        if "act" in values:
            optimizer.update(rowstats.activation_values(structure, values["act"]))
        layer, variable = rowstats.fill(layer, variable, columns, optimizer)
    return layer, variable


def window_slabs(state, step, weights, structure, last=None):
    """``(layer [A, L, C], variable [A, V, C])`` of a window (``rowstats.window_slabs``)."""
    weight_rows = np.concatenate([rowstats.combine_norms(weights, structure), weights])
    slabs = rowstats.window_slabs(state, step, weight_rows, last)
    n_layer = len(structure.layer_names)
    return slabs[:, :n_layer], slabs[:, n_layer:]


def partial_window(window, group, rows, key, device):
    """``(step, layer [A, L, C], variable [A, V, C])`` of the steps since the last write, at close; None on a rank
    that does not write.

    The window's state and the weights' norms now, in one copy (one all-reduce
    when sharded), written at the window's last step with MISSING optimizer
    columns (no written step's update is there to measure).

    Args:
      window: The writer's window, with steps.
      group: The writer's ``distributed.Group``.
      rows: The writer's ``modules.Parameters``.
      key: The last step's layout key ``(present, sparse, columns)``.
      device: Where the weights' norms go.
    """
    pack = Pack()
    steps = window.take(pack)
    pack.add("weight", group.weight_norms(rows.params, device))
    values = group.reduce(pack, key[0], [])
    if values is None:
        return None
    state = window.host_state(values, steps)
    # Between writes a step's NaN and Inf are flagged, not counted (docs/statistics.md): the count is not there.
    state = state._replace(last=running.uncounted(np, state.last))
    layer, variable = window_slabs(state, steps[-1], values["weight"], rows.structure)
    if key[2]:
        layer, variable = rowstats.fill(layer, variable, key[2], None)
    return steps[-1], layer, variable


def _update_squares(values, n):
    if "update" in values:
        return values["update"]
    if "loss_scale" in values and np.any(values.get("nonfinite", np.zeros(0)) > 0):
        # A step the scaler refused: the optimizer did not run, the weights did not move.
        return np.zeros(n)
    return None


class Pack:
    """Named device tensors sent to the host in one copy (float64, flattened)."""

    def __init__(self):
        self._names, self._shapes, self._parts = [], [], []

    def add(self, name, tensor):
        tensor = torch.as_tensor(tensor)
        self._names.append(name)
        self._shapes.append(tuple(tensor.shape))
        self._parts.append(tensor.reshape(-1).to(F64))

    def __contains__(self, name):
        return name in self._names

    @property
    def names(self):
        return tuple(self._names)

    @property
    def parts(self):
        """The flattened float64 tensors, in the order added."""
        return tuple(self._parts)

    def flat(self):
        """Everything added, as one float64 vector on one device (the first GPU's, with several)."""
        devices = {p.device for p in self._parts}
        if len(devices) > 1:  # parameters on several devices: bring them to the first GPU's first
            target = next(iter(sorted(devices, key=lambda d: d.type == "cpu")))
            self._parts = [p.to(target) for p in self._parts]
        return torch.cat(self._parts)

    def send(self, buffers):
        """A ``Copy`` of everything added, started without waiting for the device (``send``)."""
        return send(self.names, tuple(self._shapes), self.flat(), buffers)

    def to_host(self):
        """``{name: numpy float64 array}``: one device-to-host copy of everything added, waited for."""
        if not self._parts:
            return {}
        return Copy(self.names, tuple(self._shapes), self.flat().cpu().numpy()).values()
