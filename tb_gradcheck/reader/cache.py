"""A thread-safe cache bounded by bytes that evicts what is cheapest to get back per byte freed; pure Python.

The plugin keeps exactly one of these (see ``store.Store``): decoded tag data
is large (a 200-layer run of 10,000 steps is about 80 MB), so what the plugin
holds must follow what the tab is looking at, not grow with the logdir.

Plain least-recently-used eviction is wrong here: entries differ in size by
four orders of magnitude, and a small one can cost as much to rebuild as a
large one (a tag's summary of steps, a few KB, needs the whole tag read
again). So every entry says its size and the cost of a miss (bytes to read
back), and eviction follows GreedyDual-Size (Cao and Irani, 1997): each entry
has a priority ``H = L + cost / size``, refreshed on every hit; the entry with
the lowest ``H`` goes first, and ``L`` rises to that ``H``. Entries whose cost
equals their size (decoded tags) all have ``cost / size = 1``, so among them
this is exactly LRU; an entry that is expensive for its size (a summary) stays
until many large entries have come and gone.
"""

import collections
import threading


class Cache:
    """``get``/``put`` by key, holding at most ``max_bytes``; see the module docstring for what goes first.

    Args:
      max_bytes: Int, the budget. An entry larger than the whole budget is
        not kept at all (caching it would evict everything else for one
        value that is itself evicted by the next put).
    """

    def __init__(self, max_bytes):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"Expected max_bytes to be a non-negative int. Received: max_bytes={max_bytes!r}")
        self.max_bytes = max_bytes
        self._entries = collections.OrderedDict()  # key -> [value, nbytes, cost / nbytes, H], least recent first
        self._nbytes = 0
        self._floor = 0.0  # L: the priority of the last entry evicted
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

    def keys(self):
        """The keys held now, least recently used first."""
        with self._lock:
            return list(self._entries)

    def get(self, key, default=None):
        """The value under ``key`` (its priority refreshed), or ``default``."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return default
            entry[3] = self._floor + entry[2]
            self._entries.move_to_end(key)
            return entry[0]

    def put(self, key, value, nbytes, cost=None):
        """Stores ``value``, replacing any value under ``key``; returns ``value``.

        Args:
          key: Hashable.
          value: Anything.
          nbytes: Int > 0, what the value takes in memory.
          cost: What a miss costs, in bytes to read back; default ``nbytes``.
        """
        nbytes = max(1, int(nbytes))
        ratio = (nbytes if cost is None else max(cost, nbytes)) / nbytes
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._nbytes -= old[1]
            if nbytes > self.max_bytes:
                return value
            self._entries[key] = [value, nbytes, ratio, self._floor + ratio]
            self._nbytes += nbytes
            while self._nbytes > self.max_bytes:
                # The lowest priority, the least recently used among equals.
                victim = min(self._entries, key=lambda k: self._entries[k][3])
                _, dropped, _, priority = self._entries.pop(victim)
                self._nbytes -= dropped
                self._floor = priority
        return value

    def pop(self, key):
        """Drops ``key`` if present."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._nbytes -= old[1]
