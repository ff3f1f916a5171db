"""A thread-safe least-recently-used cache bounded by bytes; pure Python.

The plugin keeps exactly one of these (see ``store.Store``): decoded tag
data is large (a 200-layer run of 10,000 steps is about 80 MB), so what the
plugin holds must follow what the tab is looking at, not grow with the
logdir. Entries say their own size; the least recently used ones are dropped
once the total passes the budget.
"""

import collections
import threading


class LRU:
    """``get``/``put`` by key, least recently used dropped first once over ``max_bytes``.

    Args:
      max_bytes: Int, the budget. An entry larger than the whole budget is
        not kept at all (caching it would evict everything else for one
        value that is itself evicted by the next put).
    """

    def __init__(self, max_bytes):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"Expected max_bytes to be a non-negative int. Received: max_bytes={max_bytes!r}")
        self.max_bytes = max_bytes
        self._entries = collections.OrderedDict()  # key -> (value, nbytes)
        self._nbytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self):
        """Bytes held now (the sum of the sizes the entries were put with)."""
        return self._nbytes

    def __len__(self):
        return len(self._entries)

    def __contains__(self, key):
        with self._lock:
            return key in self._entries

    def get(self, key, default=None):
        """The value under ``key`` (now the most recently used), or ``default``."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return default
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key, value, nbytes):
        """Stores ``value`` as ``nbytes`` bytes, replacing any value under ``key``; returns ``value``."""
        nbytes = int(nbytes)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._nbytes -= old[1]
            if nbytes > self.max_bytes:
                return value
            self._entries[key] = (value, nbytes)
            self._nbytes += nbytes
            while self._nbytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._nbytes -= dropped
        return value

    def pop(self, key):
        """Drops ``key`` if present."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._nbytes -= old[1]
