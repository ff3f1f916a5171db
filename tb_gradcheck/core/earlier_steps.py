"""The gradient steps already in a run directory, written by another process: what a resumed job writes again.

A job killed and restarted from a checkpoint writes, into the same run,
steps an earlier process wrote. TensorBoard reads that as a restart: a
point at a step written again, and every point after it, are dropped for
the later points (the Rust data server's preemption; the plugin applies the
same rule on the Python loader, ``reader/spans.py``). A writer says so at
its first write (``run_directory.step_written``), from what ``scan`` finds.

``scan`` reads only the head of each record (the event's step and the tag
of its first value), seeking past the rest, so it costs one small read per
point, not the run's size: about 0.3 s for 100,000 points (35 MB). Only
points under the plugin's tags count (``gradients/``), so another writer's
scalars in the same run (a Trainer's loss) are not taken for gradients. A
record cut short (a process killed mid-write) ends its file's scan, as it
ends TensorBoard's read of it.
"""

import os
import struct

PREFIX = b"gradients/"
_HEAD = 96  # bytes of a record read: wall time, step, and the first value's tag fit in it
_EVENT_FILE = "events.out.tfevents."


def scan(path, skip=()):
    """``(first, last)``: the smallest and largest step of the gradient points in the run ``path``; None if none.

    Args:
      path: The run directory (a local path).
      skip: Event file paths not to read (the ones this process writes).
    """
    try:
        names = sorted(n for n in os.listdir(path) if n.startswith(_EVENT_FILE))
    except OSError:
        return None
    skip = {os.path.abspath(p) for p in skip}
    first = last = None
    for name in names:
        file = os.path.join(path, name)
        if os.path.abspath(file) in skip:
            continue
        for step in _steps(file):
            first = step if first is None else min(first, step)
            last = step if last is None else max(last, step)
    return None if first is None else (first, last)


def _steps(file):
    """The steps of the records of ``file`` whose first value's tag starts with ``PREFIX``."""
    try:
        f = open(file, "rb")
    except OSError:
        return
    with f:
        size = os.fstat(f.fileno()).st_size
        at = 0
        while True:
            header = f.read(12)  # uint64 length, uint32 masked CRC of it
            if len(header) < 12:
                return
            (length,) = struct.unpack("<Q", header[:8])
            at += 12 + length + 4  # the record's end: its data, then the data's CRC
            if at > size:
                return  # cut short: TensorBoard does not read it either
            head = f.read(min(length, _HEAD))
            step = _gradient_step(head)
            f.seek(at)
            if step is not None:
                yield step


def _varint(data, i):
    value = shift = 0
    while True:
        if i >= len(data):
            raise IndexError(i)
        b = data[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, i


def _gradient_step(head):
    """The ``Event.step`` of a record whose first ``Summary.Value`` tag starts with ``PREFIX``, else None.

    Fields are read in the order protobuf serialises them (by number):
    ``wall_time`` (1, fixed64), ``step`` (2, varint), then ``summary`` (5)
    -> ``value`` (1) -> ``tag`` (1).
    """
    step, i = 0, 0
    try:
        while i < len(head):
            key, i = _varint(head, i)
            field, wire = key >> 3, key & 7
            if wire == 1:
                i += 8
            elif wire == 5:
                i += 4
            elif wire == 0:
                value, i = _varint(head, i)
                if field == 2:
                    step = value
            elif wire == 2:
                size, i = _varint(head, i)
                if field != 5:
                    i += size
                    continue
                # Summary: its first field is a Value, whose first field is its tag.
                key, i = _varint(head, i)
                if key != 0x0A:
                    return None
                _, i = _varint(head, i)
                key, i = _varint(head, i)
                if key != 0x0A:
                    return None
                size, i = _varint(head, i)
                return step if head[i : i + len(PREFIX)] == PREFIX else None
            else:
                return None
    except IndexError:
        return None
    return None
