"""The window of a writer with ``every_n_steps > 1``: per-step reductions between writes, and the onset.

State lives in host variables (``distributed.host_variable``), updated inside
the training step by the replica that records. Layer and variable rows are
kept as one matrix (layers first).

Between writes a graph step only holds its ``statistics.half_sums`` (one
``l2_loss`` per gradient) in a ``[DEPTH + 1, V]`` variable: one scatter,
whatever the number of variables. Everything else (the norms, the layer rows,
the running last/sum/max/min/count) is computed from the held steps when the
window is folded, inside the step's cond on those sums
(``recording.Recording._record_window``), which works only at a write step,
when the held steps fill the variable (every ``DEPTH`` steps), or at a rare
step (a non-finite gradient, a sum of squares out of band), which is added on
its own from ``statistics.quick``. A compiled step adds each step itself (``add``).
"""

import numpy as np
import tensorflow as tf

from tb_gradcheck.core import metadata
from tb_gradcheck.core import running
from tb_gradcheck.tensorflow import distributed
from tb_gradcheck.tensorflow import statistics

_REDUCED = [metadata.STORED_STAT_COLUMNS.index(c) for c in statistics.WINDOW_COLUMNS]
_NONFINITE = statistics.WINDOW_COLUMNS.index("grad_nonfinite")
_FIRST_NONFINITE = metadata.STORED_STAT_COLUMNS.index("first_nonfinite_offset")
_WEIGHT_NORM = metadata.STORED_STAT_COLUMNS.index("weight_norm")
# Steps held between folds. A fold is a few dozen small ops inside the cond,
# so folding every 64 steps costs under one op per step, and the held sums
# take 64 x 8 bytes per variable.
DEPTH = 64


class Window:
    """Running last/sum/max/min/count of ``statistics.WINDOW_COLUMNS`` since the last write, and the onset.

    What a window reduces is what ``statistics.quick`` gives at every step:
    grad_norm, grad_nonfinite and grad_norm_finite (one fused pass per
    gradient). max |g|, the zero fraction and dead units need passes of
    their own, so they are taken at the write step only (the ``last`` slab)
    and their other slabs are MISSING. Weight columns are filled in at the
    write step. NaN propagates through sum, max and min on purpose: a window
    that saw a NaN must not look healthy in any aggregate; grad_norm_finite
    (MISSING, so left out, at a non-finite step) keeps what the window saw
    before it. The first step with a non-finite gradient is kept per row as
    an int64 step and written as its offset before the write step
    (``first_nonfinite_offset``, the same in every slab).
    """

    def __init__(self, rows, every_n_steps):
        self._rows = rows
        n_layers, n_variables = len(rows.layer_names), len(rows.variable_names)
        self._split = n_layers
        shape = (n_layers + n_variables, len(statistics.WINDOW_COLUMNS))
        # The steps held since the last fold: their half sums of squares (hold, fold).
        self.depth = min(every_n_steps, DEPTH)
        # Step k of those held is in row k (1 to depth): the count after its
        # increment is its row, with no op to subtract one. Row 0 is unused.
        self._half = distributed.host_variable(
            np.full((self.depth + 1, n_variables), statistics.MISSING), tf.float64, "tb_gradcheck_window_held"
        )
        self._held = distributed.host_variable(0, tf.int64, "tb_gradcheck_window_held")

        def var(value):
            return distributed.host_variable(np.full(shape, value, np.float32), tf.float32, "tb_gradcheck_window")

        self._last = var(statistics.MISSING)
        self._sum = var(0.0)
        self._max = var(-np.inf)
        self._min = var(np.inf)
        self._count = var(0.0)
        self._first_nonfinite = distributed.host_variable(
            np.full(shape[0], -1, np.int64), tf.int64, "tb_gradcheck_window"
        )
        self.last_step = distributed.host_variable(0, tf.int64, "tb_gradcheck_last_step")

    def add(self, layer, variable, step, counted=True):
        """Adds one step's ``statistics.quick`` columns (layer ``[L, 3]``, variable ``[V, 3]``).

        ``counted`` False: their grad_nonfinite is a flag (``quick(counted=False)``),
        which is all sum, max, min and the onset keep; the ``last`` slab, which
        shows the count, reads MISSING where a row was flagged.
        """
        step = tf.cast(step, tf.int64)
        x = tf.concat([layer, variable], axis=0)
        here = tf.not_equal(x, statistics.MISSING)  # NaN != MISSING: NaN is data
        self._last.assign(x if counted else running.uncounted(tf.experimental.numpy, x))
        # sum, max and min count steps with a non-finite gradient; last keeps the elements (running.steps_flagged).
        flags = tf.cast(x[:, _NONFINITE : _NONFINITE + 1] > 0, x.dtype)
        flagged = tf.concat([x[:, :_NONFINITE], flags, x[:, _NONFINITE + 1 :]], axis=1)
        self._count.assign_add(tf.cast(here, tf.float32))
        self._sum.assign_add(tf.where(here, flagged, 0.0))
        self._max.assign(tf.where(here, tf.maximum(self._max, flagged), self._max))
        self._min.assign(tf.where(here, tf.minimum(self._min, flagged), self._min))
        first = self._first_nonfinite
        bad = x[:, _NONFINITE] > 0  # MISSING (-1) is not
        first.assign(tf.where(bad & (first < 0), step, first))
        self.last_step.assign(step)

    def hold(self, half, step):
        """Holds one step's ``statistics.half_sums`` (float64 ``[V]``); returns the steps held, this one included."""
        held = self._held.assign_add(1)
        tf.raw_ops.ResourceScatterUpdate(resource=self._half.handle, indices=held, updates=half)
        self.last_step.assign(step)
        return held

    def fold(self, count):
        """Adds the first ``count`` held steps (an int64 tensor; none of them rare) as ``add`` would, one by one.

        The sums are added in another order than ``add``'s, so they can
        differ from it in float32's last bit; last, max, min and counts are the same.
        """
        x = statistics.held_columns(self._half[1:], self._rows)  # [R, D, 3]
        here = (tf.range(self.depth, dtype=tf.int64) < count)[None, :, None] & tf.not_equal(x, statistics.MISSING)
        self._count.assign_add(tf.reduce_sum(tf.cast(here, tf.float32), axis=1))
        self._sum.assign_add(tf.reduce_sum(tf.where(here, x, 0.0), axis=1))
        self._max.assign(tf.maximum(self._max, tf.reduce_max(tf.where(here, x, -np.inf), axis=1)))
        self._min.assign(tf.minimum(self._min, tf.reduce_min(tf.where(here, x, np.inf), axis=1)))
        last = tf.gather(x, tf.maximum(count - 1, 0), axis=1)
        self._last.assign(tf.where(count > 0, last, self._last))

    def fold_held(self):
        """Folds every step held (at the writer's close)."""
        self.fold(self._held.read_value())
        self.reset_held()

    def reset_held(self):
        """After a fold: no step is held."""
        self._held.assign(tf.zeros_like(self._held))

    def pending(self):
        return tf.reduce_any(self._count[:, 0] > 0)

    def aggregates(self, step, weight_norms, last=None):
        """Returns ``(layer, variable)`` float32 ``[A, R, C]`` in ``metadata.AGGREGATES`` order.

        Args:
          step: The write step (int64), which onset offsets count back from.
          weight_norms: ``(layer, variable)`` float32 weight norms of the write
            step, put in every slab's ``weight_norm`` column.
          last: ``(layer, variable)`` full statistics (``statistics.compute``) of
            the write step for the ``last`` slab, or None to use the last
            step's windowed columns.
        """
        seen = self._count > 0
        slabs = {
            "last": self._last,
            "mean": self._sum / tf.maximum(self._count, 1.0),
            "max": self._max,
            "min": self._min,
            "sum": self._sum,
        }
        reduced = tf.stack(
            [slabs[a] if a == "last" else tf.where(seen, slabs[a], statistics.MISSING) for a in metadata.AGGREGATES]
        )
        # Spread the reduced columns into the stored layout; every other
        # column reads MISSING (index 3: the pad).
        pad = tf.fill(tf.concat([tf.shape(reduced)[:2], [1]], 0), statistics.MISSING)
        source = np.full(len(metadata.STORED_STAT_COLUMNS), len(statistics.WINDOW_COLUMNS))
        source[_REDUCED] = np.arange(len(_REDUCED))
        out = tf.gather(tf.concat([reduced, pad], axis=-1), source, axis=-1)
        first = self._first_nonfinite
        offset = tf.where(first >= 0, tf.cast(tf.cast(step, tf.int64) - first, tf.float32), statistics.MISSING)
        weights = tf.concat(weight_norms, axis=0)
        column = np.arange(len(metadata.STORED_STAT_COLUMNS))
        out = tf.where(column == _FIRST_NONFINITE, offset[None, :, None], out)
        out = tf.where(column == _WEIGHT_NORM, weights[None, :, None], out)
        layer, variable = out[:, : self._split], out[:, self._split :]
        if last is not None:
            layer = _with_last(layer, last[0])
            variable = _with_last(variable, last[1])
        return layer, variable

    def reset(self):
        self._sum.assign(tf.zeros_like(self._sum))
        self._max.assign(tf.fill(tf.shape(self._max), -np.inf))
        self._min.assign(tf.fill(tf.shape(self._min), np.inf))
        self._count.assign(tf.zeros_like(self._count))
        self._first_nonfinite.assign(tf.fill(tf.shape(self._first_nonfinite), tf.constant(-1, tf.int64)))


def _with_last(slabs, full):
    """``slabs`` whose ``last`` slab holds the write step's full gradient columns; onset and weights kept.

    Where ``full`` is MISSING (a row without a gradient, or a step whose full
    statistics were not taken: ``Recording.stash``) the windowed column stays.
    """
    keep = np.zeros(len(metadata.STORED_STAT_COLUMNS), bool)
    keep[[_FIRST_NONFINITE, _WEIGHT_NORM]] = True
    last = tf.where(keep | tf.equal(full, statistics.MISSING), slabs[0], full)
    return tf.concat([last[None], slabs[1:]], axis=0)
