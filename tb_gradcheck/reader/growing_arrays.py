"""Arrays that grow at their end with room to spare, whose views never change under their readers; numpy only.

What the read side keeps of a run that is still training (``tag_blocks.py``'s
products, ``merge.Laid``) grows by a poll's new steps at a time; appending
to an array that has room is a copy of the new rows only.
"""

import numpy as np


class Stack:
    """An array that grows at its end (axis 0) with room to spare, so that appending is amortised.

    ``view()`` hands out a read-only view of the rows held then; rows are
    only ever added after them, so a view never changes under its reader.
    """

    def __init__(self, rows, used=None):
        """``rows``: the buffer, of which the first ``used`` rows (default all) are held; the rest is room."""
        self._held = (rows, len(rows) if used is None else used)  # (buffer, rows used): replaced as one, never torn

    def __len__(self):
        return self._held[1]

    @property
    def nbytes(self):
        return self._held[0].nbytes

    def view(self):
        buffer, n = self._held
        rows = buffer[:n]
        rows.flags.writeable = False
        return rows

    def extend(self, rows):
        buffer, n = self._held
        total = n + len(rows)
        if total > len(buffer):
            # A quarter to spare: a run that grows by a poll's worth of steps
            # is copied once every few dozen polls, not at each.
            grown = np.empty((total + total // 4,) + buffer.shape[1:], buffer.dtype)
            grown[:n] = buffer[:n]
            buffer = grown
        buffer[n:total] = rows
        self._held = (buffer, total)
