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
