"""One list of variables' recording: its rows and tag content, and the path from gradients to events.

``GradientWriter`` keeps one ``Recording`` per list of variables it is given
and calls it inside its ``tf.summary`` writer's default scope. Every step:
``measure`` (the statistics, outside any cond), then ``record`` (write, or
accumulate the window and write every N steps), or, inside an XLA-compiled
step, ``stash`` and after it ``write_stashed``.
"""

import tensorflow as tf

from tb_gradcheck.core import metadata
from tb_gradcheck.tensorflow import branches
from tb_gradcheck.tensorflow import compiled
from tb_gradcheck.tensorflow import optimizer
from tb_gradcheck.tensorflow import statistics
from tb_gradcheck.tensorflow import window
from tb_gradcheck.tensorflow.variables import Rows


class Recording:
    """Rows, tag content, window and stash of one list of variables.

    Args:
      variables: The checked variables.
      sparse: Per variable, whether its gradient is a ``tf.IndexedSlices``.
      every_n_steps: The writer's window length.
      unit_axes: Unit-axis overrides (``units.unit_axes``).
      events: The writer's ``events.Events``.
      optimizer_columns: The optimizer columns (``tb_gradcheck.tensorflow.optimizer``)
        this layout stores after the others, in stored order.
    """

    def __init__(self, variables, sparse, every_n_steps, unit_axes, events, optimizer_columns=()):
        self.rows = Rows(variables, unit_axes)
        self.every_n_steps = every_n_steps
        self._events = events
        aggregates = metadata.SINGLE_STEP_AGGREGATES if every_n_steps == 1 else metadata.AGGREGATES
        self.content = metadata.stats_layout(
            *self.rows.blocks(sparse),
            aggregates,
            every_n_steps,
            optimizer_columns,
        )
        self.optimizer_columns = tuple(optimizer_columns)
        # An update bracket measures the weights' norms before the update,
        # and its weight_norm replaces the writer's own (optimizer.fill): then
        # the writer does not read the weights itself, one pass less.
        self.own_weights = not any(c in optimizer.UPDATE_COLUMNS for c in self.optimizer_columns)
        # Statistic columns this layout stores (before the optimizer ones).
        self.columns = len(metadata.stored_columns(every_n_steps))
        self.window = None
        if every_n_steps > 1:
            self.window = window.Window(self.rows, every_n_steps)
        self._stash = None  # a compiled.Stash once a compiled step records
        self._write_held = None  # the traced writer of stashed statistics

    def measure(self, gradients, step, compiled=False):
        """This step's statistics: all of them when every step is written, else what a window holds.

        Returns ``(layer, variable)`` stats, or for a window
        ``statistics.half_sums``: ``(half, rare, known)``. ``compiled``: the
        step is XLA-compiled (``statistics.compute``).
        """
        if self.every_n_steps == 1:
            return statistics.compute(gradients, self.rows, weights=self.own_weights, onset=False, compiled=compiled)
        # Between writes only one fused pass per gradient (window.py).
        return statistics.half_sums(gradients, self.rows)

    def _weight_norms(self, step, compiled=False, due=None):
        """The weight norms at a write step, MISSING between writes (and always, when an update bracket gives them).

        A cond of its own that reads only the step and the weights: inside the
        write's cond, which waits for every gradient, the weight reads would
        make the optimizer's updates wait for the whole backward pass,
        serialising the step; here the cond runs as soon as the step is known.
        ``due``: False where the caller knows the step is not written (no
        cond), or the bool tensor of the write step when the caller has it.
        """
        n_l, n_v = len(self.rows.layer_names), len(self.rows.variable_names)

        def missing():
            return tf.fill([n_l], statistics.MISSING), tf.fill([n_v], statistics.MISSING)

        if not self.own_weights or due is False:
            return missing()
        if due is None:
            due = tf.equal(step % self.every_n_steps, 0)
        return branches.cond(due, lambda: statistics.weight_norms(self.rows, compiled), missing)

    def record(self, measured, gradients, step, writer, extra, guard):
        """Writes (or, windowed, accumulates and every N steps writes) the measured statistics.

        ``writer`` is the ``tf.summary`` writer; ``extra`` (an
        ``optimizer.Extra``) gives the optimizer columns of the write step.
        ``guard(write)`` runs ``write`` (a function returning a bool tensor)
        if the writer is still open (``closing.Guard.run``). Leaving
        ``writer.as_default()`` flushes it: that makes every written step
        survive a SIGKILL (writer.py's flush policy), so it is entered only
        where something is written, never at a window's other steps, which
        hold their sums and run the window's conds (_record_window).
        """
        if self.every_n_steps == 1:
            layer, variable = measured

            def write_step():
                with writer.as_default():
                    stats_l, stats_v = self._fill(layer[None], variable[None], extra)
                    self._events.stats(self.content, stats_l, stats_v, step)
                return tf.constant(True)

            return guard(write_step)
        return self._record_window(measured, gradients, step, writer, extra, guard)

    def _record_window(self, measured, gradients, step, writer, extra, guard):
        """A window's step: holds its sums and takes one cond on them, which does the rest only when it must.

        That cond runs its work at a write step, when the held steps fill
        their variable, and at a rare step (``statistics.half_sums``); between,
        a step runs its ``l2_loss`` per gradient, a scatter, the cond's
        predicate and the weights' cond (``_weight_norms``), which reads only
        the step and the weights (``tests/tensorflow/test_window_ops.py``
        counts them). Read inside the cond on the gradients, the weights would
        make every step's updates wait for the whole backward pass: on the
        benchmark's MLP that cost more than the second cond (docs/benchmarks.md).
        """
        half, rare, known = measured
        due = tf.equal(step % self.every_n_steps, 0)
        weights = self._weight_norms(step, due=due)
        held = self.window.hold(half, step)

        def this_step_alone():
            # The steps before it are folded first, so the window sees them in order.
            self.window.fold(held - 1)
            self.window.add(*statistics.quick(gradients, self.rows), step)
            return tf.constant(True)

        def fold():
            self.window.fold(held)
            return tf.constant(True)

        def write_window():
            with writer.as_default():
                # The values and sums of squares half_sums took are reused: one pass fewer over each gradient.
                full = statistics.compute(gradients, self.rows, weights=False, known=known)
                return self.flush_window(step, weights, full, extra)

        def act():
            branches.cond(rare, this_step_alone, fold)
            self.window.reset_held()
            return branches.cond(due, lambda: guard(write_window), lambda: tf.constant(False))

        return branches.cond(due | rare | (held >= self.window.depth), act, lambda: tf.constant(False))

    def _fill(self, layer, variable, extra=None, values=None):
        """``[A, R, C]`` stats with this layout's optimizer columns appended (MISSING without ``extra``)."""
        if not self.optimizer_columns:
            return layer, variable
        if values is None and extra is not None:
            values = extra.columns(self.rows)
        return optimizer.fill(layer, variable, self.optimizer_columns, values)

    def stash(self, gradients, step, extra=None, between_writes=False):
        """Inside an XLA-compiled step: this step's statistics into variables (``compiled.Stash``).

        With ``extra`` (an ``optimizer.Extra``), its optimizer columns (and the
        weight norm it measured) are kept too, computed at write steps only.

        No cond here takes a gradient: under XLA a cond's branch is a
        computation of its own, and one that takes every gradient as an
        operand stops XLA from fusing the backward pass into the updates,
        which costs more than the statistics themselves. So a window computes
        the full statistics at every step that may be written (XLA fuses
        their reductions into one pass per gradient; their window columns are
        what ``quick`` would give) and keeps them as the ``last`` slab of
        whichever step is written.

        ``between_writes``: the caller knows, outside the step, that it is not
        a write step (``GradientCallback`` compiles a second train function
        for those steps). Then the step takes only what the window reduces,
        and nothing of the optimizer, and its NaN/Inf count only as a flag.
        Should the step be written after all (the step counter was moved by
        hand), or be the last of a partial window written at close, its
        ``last`` slab has the window's norms and MISSING for the other
        columns (the count too, where it was not 0), rather than numbers of
        another step.
        """
        if between_writes and self.every_n_steps == 1:
            raise ValueError(
                "Expected `between_writes=True` only with a window (every_n_steps > 1): "
                "every step of this writer is written. Received: every_n_steps=1"
            )
        if self._stash is None:
            depth = compiled.DEPTH if self.every_n_steps == 1 else 1
            self._stash = compiled.Stash(self.rows, self.columns, self._extra_names(), depth)
        held = self._stash
        if held.extra:
            held.store_extra(step, self._extra_values(extra, step, due=False if between_writes else None))
        if self.every_n_steps == 1:
            held.store(step, *self.measure(gradients, step, compiled=True))
            return
        if between_writes:
            # The NaN/Inf count only as a flag (its own pass was a third of these steps' cost on a CPU): a step
            # between writes is a `last` slab only as the last step of a partial window written at close.
            layer, variable = statistics.quick(gradients, self.rows, compiled=True, counted=False)
            self.window.add(layer, variable, step, counted=False)
            held.store(step, None, None, weights=self._weight_norms(step, due=False))
            return
        layer, variable = statistics.compute(gradients, self.rows, weights=False, compiled=True)
        self.window.add(statistics.window_columns(layer), statistics.window_columns(variable), step)
        held.store(step, layer, variable, weights=self._weight_norms(step, compiled=True))

    def _extra_names(self):
        """The stashed optimizer values: the layout's optimizer columns, and weight_norm with an update bracket."""
        names = list(self.optimizer_columns)
        if any(n in optimizer.UPDATE_COLUMNS for n in names):
            names.append("weight_norm")
        return tuple(names)

    def _extra_values(self, extra, step, due=None):
        """``{name: (layer [L], variable [V])}`` of the stashed names: computed at a write step, MISSING between."""
        names = self._stash.extra
        n_l, n_v = len(self.rows.layer_names), len(self.rows.variable_names)

        def missing():
            return {
                n: (
                    tf.fill([n_l], tf.constant(statistics.MISSING, tf.float32)),
                    tf.fill([n_v], tf.constant(statistics.MISSING, tf.float32)),
                )
                for n in names
            }

        def compute():
            values = {} if extra is None else extra.columns(self.rows)
            out = missing()
            out.update({n: values[n] for n in names if n in values})
            return out

        if self.every_n_steps == 1:
            return compute()
        if due is False:
            return missing()
        return branches.cond(tf.equal(step % self.every_n_steps, 0), compute, missing)

    def write_stashed(self, writer):
        """After compiled steps: writes through ``writer`` what ``stash`` holds that is new (and due).

        Returns the latest step stashed (an int64 tensor; -1 before the
        first), whether or not it was written.

        One traced call, which decides inside the graph what is new and due:
        reading the steps into Python first (``.numpy()``) made the host wait
        for the compiled step to finish before it could queue the next one.
        One traced function, too, instead of a few dozen eager ops per step
        (eager dispatch tripled a fast XLA step).
        """
        if self._stash is None:
            return tf.constant(-1, tf.int64)
        if self._write_held is None:
            self._write_held = tf.function(lambda: self._write_held_stats(writer), autograph=False)
        return self._write_held()

    def _write_held_stats(self, writer):
        held = self._stash
        fresh = held.fresh.read_value()
        latest = held.step.read_value()
        if self.every_n_steps > 1:  # a window's stash holds one step, written if it ends the window
            due = fresh[0] & tf.equal(latest % self.every_n_steps, 0)
        else:
            due = tf.reduce_any(fresh)

        def write():
            if self.every_n_steps > 1:
                self._write_held_window(writer, latest)
            else:
                self._write_held_steps(writer, fresh)
            held.fresh.assign(tf.zeros_like(fresh))
            return tf.constant(True)

        done = branches.cond(due, write, lambda: tf.constant(False))
        with tf.control_dependencies([done]):
            return tf.identity(latest)

    def _write_held_window(self, writer, step):
        _, layer, variable, values = self._stash.held(0)
        # Leaving as_default() flushes the events (see writer.py's flush policy).
        with writer.as_default():
            self.flush_window(step, self._stash.weights, (layer, variable), values=values)

    def _write_held_steps(self, writer, fresh):
        """Writes each ``fresh`` slot's step, oldest first."""
        held = self._stash
        order = held.slots()
        with writer.as_default():
            for k in range(held.depth):
                slot = order[k]
                step, layer, variable, values = held.held(slot)

                def write(step=step, layer=layer, variable=variable, values=values):
                    layer, variable = self._fill(layer[None], variable[None], values=values)
                    self._events.stats(self.content, layer, variable, step)
                    return tf.constant(True)

                branches.cond(fresh[slot], write, lambda: tf.constant(False))

    def finish(self, writer):
        """At the writer's close: the steps a compiled step stashed that no write wrote yet, and the partial window."""
        self.write_stashed(writer)
        if self.window is not None:
            self.window.fold_held()
        if self.window is not None and bool(self.window.pending()):
            with writer.as_default():
                self.flush_window(self.window.last_step.read_value(), statistics.weight_norms(self.rows))

    def flush_window(self, step, weight_norms, last=None, extra=None, values=None):
        """Writes the window; with this step's full statistics ``last``, its ``last`` slab has every statistic."""
        layer, variable = self.window.aggregates(step, weight_norms, last)
        layer, variable = self._fill(layer, variable, extra, values)
        self._events.stats(self.content, layer, variable, step)
        self.window.reset()
        return tf.constant(True)
