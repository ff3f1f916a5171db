"""One list of variables' recording: its rows and tag content, and the path from gradients to events.

``GradientWriter`` keeps one ``Recording`` per list of variables it is given
and calls it inside its ``tf.summary`` writer's default scope. Every step:
``measure`` (the statistics, outside any cond), then ``record`` (write, or
accumulate the window and write every N steps), or, inside an XLA-compiled
step, ``stash`` and after it ``write_stashed``.
"""

import tensorflow as tf

from tb_gradcheck import metadata
from tb_gradcheck import stash
from tb_gradcheck import stats
from tb_gradcheck import window


class Recording:
    """Rows, tag content, window and stash of one list of variables.

    Args:
      variables: The checked variables.
      sparse: Per variable, whether its gradient is a ``tf.IndexedSlices``.
      every_n_steps: The writer's window length.
      unit_axes: Unit-axis overrides (``units.unit_axes``).
      events: The writer's ``events.Events``.
    """

    def __init__(self, variables, sparse, every_n_steps, unit_axes, events):
        self.rows = stats.Rows(variables, unit_axes)
        self.every_n_steps = every_n_steps
        self._events = events
        sparse_variables = [n for n, s in zip(self.rows.variable_names, sparse) if s]
        sparse_layers = [n for i, n in enumerate(self.rows.layer_names)
                         if any(s and self.rows.layer_of[v] == i for v, s in enumerate(sparse))]
        aggregates = metadata.SINGLE_STEP_AGGREGATES if every_n_steps == 1 else metadata.AGGREGATES
        self.content = metadata.stats_layout(
            {"rows": self.rows.layer_names, "sizes": self.rows.layer_sizes, "sparse_rows": sparse_layers},
            {"rows": self.rows.variable_names, "sizes": self.rows.variable_sizes, "sparse_rows": sparse_variables},
            aggregates,
            every_n_steps,
        )
        self.window = None
        if every_n_steps > 1:
            self.window = window.Window(len(self.rows.layer_names), len(self.rows.variable_names))
        self._stash = None  # a stash.Stash once a compiled step records
        self._write_held = None  # the traced writer of stashed statistics

    def measure(self, gradients):
        """This step's statistics: all of them when every step is written, else what a window reduces.

        Returns ``(layer, variable)`` stats, and for a window also
        ``(layer, variable)`` weight norms.
        """
        if self.every_n_steps == 1:
            return stats.compute(gradients, self.rows)
        # Between writes only what a window needs: one fused pass per
        # gradient for the norm (and, on a bad step only, the NaN count).
        # The weight norms are taken here too, outside the write's cond: read
        # inside it, the model's variables would make the cond an op that the
        # optimizer's updates must wait for, serialising the whole step.
        layer, variable = stats.compute(gradients, self.rows, weights=False, full=False)
        return layer, variable, stats.weight_norms(self.rows)

    def record(self, measured, gradients, step):
        """Writes (or, windowed, accumulates and every N steps writes) the measured statistics."""
        layer, variable = measured[:2]
        if self.every_n_steps == 1:
            self._events.stats(self.content, layer[None], variable[None], step)
            return tf.constant(True)
        self.window.add(layer, variable, step)
        tf.cond(
            tf.equal(step % self.every_n_steps, 0),
            lambda: self.flush_window(step, measured[2], stats.compute(gradients, self.rows, weights=False)),
            lambda: tf.constant(False),
        )
        return tf.constant(True)

    def stash(self, gradients, step):
        """Inside an XLA-compiled step: this step's statistics into variables (``stash.Stash``)."""
        if self._stash is None:
            self._stash = stash.Stash(self.rows)
        measured = self.measure(gradients)
        if self.every_n_steps == 1:
            self._stash.store(step, *measured)
            return
        layer, variable, weights = measured
        self.window.add(layer, variable, step)
        # The write step's full statistics (the last slab) are computed in a
        # cond, so the steps between writes pay for the window's norm only.
        last = tf.cond(
            tf.equal(step % self.every_n_steps, 0),
            lambda: stats.compute(gradients, self.rows, weights=False),
            lambda: (layer, variable),
        )
        self._stash.store(step, *last, weights=weights)

    def write_stashed(self, writer):
        """After the compiled step, eagerly: writes what ``stash`` stored through ``writer``, if new (and due)."""
        step = None if self._stash is None else self._stash.take()
        if step is None or (self.every_n_steps > 1 and step % self.every_n_steps):
            return
        if self._write_held is None:
            # One traced function instead of a few dozen eager ops per step
            # (eager dispatch tripled a fast XLA step).
            self._write_held = tf.function(self._write_held_stats, autograph=False)
        self._write_held(writer, tf.constant(step, tf.int64))

    def _write_held_stats(self, writer, step):
        held = self._stash
        # Leaving as_default() flushes the events (see summary.py's flush policy).
        with writer.as_default():
            if self.every_n_steps == 1:
                self._events.stats(self.content, held.layer[None], held.variable[None], step)
            else:
                self.flush_window(step, held.weights, (held.layer, held.variable))

    def flush_window(self, step, weight_norms, last=None):
        """Writes the window; with this step's full statistics ``last``, its ``last`` slab has every statistic."""
        layer, variable = self.window.aggregates(step, weight_norms, last)
        self._events.stats(self.content, layer, variable, step)
        self.window.reset()
        return tf.constant(True)
