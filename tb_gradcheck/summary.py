"""The writer: per-layer gradient statistics -> TensorBoard summaries under plugin ``gradients``.

Stored layout (content version 1). Every summary has plugin name
``gradients`` and ``DATA_CLASS_TENSOR``; its metadata content is the JSON
layout from ``metadata.stats_layout``. One event per written step:

- tag ``gradients/stats/<fp>``, float32 ``[A, L + V + 1, C]``:
  - ``A`` slabs, the window aggregates named in the content's ``aggregates``:
    only ``last`` when every step is written; ``last, mean, max, min, sum``
    over the training steps since the previous write otherwise.
  - rows: the ``L`` layers in depth order (``content["layer"]["rows"]``),
    then the ``V`` variables (``content["variable"]["rows"]``), then one
    header row whose column 0 is the number of writes this writer has made
    (the plugin reads it to say "N of M steps" when TensorBoard sampled).
  - ``C`` columns, ``metadata.STORED_STAT_COLUMNS``: grad_norm, grad_max_abs,
    grad_zero_fraction, grad_nonfinite, weight_norm. A row without a
    gradient holds -1 in every gradient column (all are non-negative when
    present). grad_to_weight is derived on read.
- tag ``gradients/check/<granularity>/<fp>`` (from ``write_check``):
  float32 ``[R, C]``, rows as in the content's ``rows`` (the same grouping
  and names as the stats rows), columns ``metadata.CHECK_COLUMNS``: analytic
  and numeric directional derivative, relative error, noise floor, and the
  status as its index in ``metadata.CHECK_STATUSES`` (0 ok, 1 inconclusive,
  2 mismatch; ordered by severity, so binning several steps keeps the worst
  with a plain max). A row that was not checked has status NaN.

The full metadata (with row names) rides on the first event of each tag a
writer writes; later events carry only the plugin name and data class, since
TensorBoard keeps the first metadata of a tag and ignores the rest.

Under ``tf.distribute`` one event is written per step, by one replica: replica
0 of the chief (``strategy.extended.should_save_summary``). Every other worker
keeps its event file closed (none is created) and writes nothing. The writer's
state (window accumulators, fresh flags, the write counter) lives in plain
variables of the process that writes, updated by that replica only; see
``_host_variable`` for why they are not the strategy's mirrored variables.
"""

import atexit
import sys
import weakref

import numpy as np
import tensorflow as tf
from tensorboard.compat.proto import summary_pb2
from tensorflow.python.ops import resource_variable_ops

from tb_gradcheck import checks
from tb_gradcheck import metadata
from tb_gradcheck import stats
from tb_gradcheck import validate

# Flush policy. Every write() ends by flushing its events to the operating
# system: tf.summary's writer.as_default() flushes when its block exits,
# eagerly and inside tf.function alike, and write() runs inside one. So a
# process killed with SIGKILL loses nothing that write() had recorded (only a
# step whose graph was still running); what the OS had not yet put on disk is
# lost only if the machine itself goes down (there is no fsync). The cost is
# one write(2) of a few kilobytes per written step. The two settings below are
# the underlying tf.summary writer's: they bound how long events of *other*
# summaries wait when the writer is shared (GradientWriter(writer=...)).
# close() and interpreter exit (atexit) flush and close as well.
DEFAULT_FLUSH_MILLIS = 10_000
# Events queued in memory before the tf.summary writer flushes regardless of time.
DEFAULT_MAX_QUEUE = 100


class GradientWriter:
    """Writes per-layer gradient statistics for the Gradients tab.

    Call ``write(gradients, variables, step)`` in the training step, eagerly
    or inside ``tf.function`` (it adds ops to the graph; no retrace per step
    and no transfer of values to Python).

    Example:

        writer = tb_gradcheck.GradientWriter("logs/run1")

        @tf.function
        def train_step(x, y):
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            writer.write(grads, model.trainable_variables, optimizer.iterations)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))

    Args:
      logdir: Directory of the run to write (TensorBoard shows one run per
        directory). Exactly one of ``logdir`` and ``writer``.
      writer: An existing ``tf.summary`` writer to write through instead. It
        stays the caller's: ``close()`` flushes it but does not close it.
      every_n_steps: Int, default 1. Write every step (1), or every N steps
        with each write holding the last, mean, max, min and sum of the
        gradient norm and NaN/Inf count over the N steps since the previous
        write: those are accumulated at every call, so a one-step spike or
        NaN is never lost. max |g|, the zero fraction and the weights are
        taken at the write step (they cost a pass each; see _Window).
      flush_millis: Int, default 10000. Longest time events wait in memory
        in the tf.summary writer this creates. Each ``write()`` flushes its
        own events anyway (see the flush policy at the top of summary.py).
      unit_axes: Dict or None (default). ``{variable path: 2}`` for
        depthwise kernels, whose units (for ``dead_unit_fraction``) are
        their last two axes: pass ``tb_gradcheck.stats.unit_axes(model)``.
        Every other variable's units follow from its shape (see
        ``tb_gradcheck.stats``).
    """

    def __init__(
        self, logdir=None, *, writer=None, every_n_steps=1, flush_millis=DEFAULT_FLUSH_MILLIS, unit_axes=None
    ):
        if (logdir is None) == (writer is None):
            raise ValueError(
                "Expected exactly one of `logdir` and `writer`. "
                f"Received: logdir={logdir!r}, writer={writer!r}"
            )
        if writer is not None and not isinstance(writer, tf.summary.SummaryWriter):
            raise TypeError(
                "Expected `writer` to be a tf.summary.SummaryWriter (from tf.summary.create_file_writer). "
                f"Received: {type(writer).__name__}"
            )
        if logdir is not None:
            logdir = validate.path(logdir, "logdir")
        every_n_steps = validate.positive_int(every_n_steps, "every_n_steps")
        flush_millis = validate.positive_int(flush_millis, "flush_millis")
        self._unit_axes = dict(unit_axes or {})
        self.every_n_steps = int(every_n_steps)
        self._owns_writer = writer is None
        # The event file is opened at the first write this process records, so
        # a worker that never writes (a non-chief under tf.distribute) leaves
        # no file in the run directory.
        self._logdir = logdir
        self._flush_millis = int(flush_millis)
        self._summary_writer = writer
        self._closed = False
        self._layouts = {}  # tuple of variable ids -> _Layout
        self._fresh = {}  # tag -> tf.Variable(bool): full metadata not yet written
        self._writes = None  # variable(float32): distinct steps written so far, for the header row
        self._last_write_step = None  # variable(int64): the step of the latest stats write
        self._open = None  # variable(bool): False after close(), read by traced graphs
        self._warned = None  # variable(bool): the after-close warning was printed
        _open_writers.add(self)

    # -- public API ---------------------------------------------------------

    @tf.autograph.experimental.do_not_convert
    def write(self, gradients, variables, step):
        """Records this step's gradient statistics.

        Under ``tf.distribute``, call it inside ``strategy.run`` with this
        replica's gradients, the ones you pass to the optimizer: the writer
        sums them over the replicas (as Keras optimizers do before applying
        them) and records the sum once, from replica 0 of the chief. Every
        worker must make the call, since the sum is a collective operation;
        only the chief opens an event file. The sum costs one all-reduce of
        the gradients per step; ``tb_gradcheck.keras.GradientCallback`` reads
        the optimizer's own all-reduced gradients instead and costs none.

        Args:
          gradients: One gradient per variable, as from ``tape.gradient``:
            dense tensors, ``tf.IndexedSlices`` or None (a variable the loss
            does not depend on; recorded as missing, not as zero).
          variables: The variables, in depth order (for a Keras model,
            ``model.trainable_variables``).
          step: Integer training step: a Python int, an integer tensor, or
            a variable such as ``optimizer.iterations``.

        Returns:
          None. Inside ``tf.function`` the writes are ops of the graph.

        Raises:
          TypeError: ``gradients``, ``variables`` or ``step`` of the wrong
            kind, including per-replica values outside ``strategy.run``.
          ValueError: Mismatched lengths, an empty list, a step outside
            0..2**63-1, or a closed writer. (A ``tf.function`` traced before
            ``close()`` and run after it skips the write with one warning.)
        """
        self._check_open("write")
        variables = validate.variables(variables)
        gradients = validate.gradients(gradients, variables)
        step = validate.step(step)
        self._write_aggregated(_sum_over_replicas(gradients), variables, step)

    def _write_aggregated(self, gradients, variables, step):
        """Records gradients that are already the same on every replica, once per step.

        ``tb_gradcheck.keras`` calls this with the gradients a Keras optimizer
        has all-reduced. On a replica or worker that does not write, nothing
        is computed (the statistics would only be thrown away).
        """
        self._check_open("write")
        step = validate.step(step)
        layout = self._layout_for(variables, gradients)
        writing = _writing_replica()
        if writing is False:
            return
        if writing is True:
            # The statistics are computed outside any cond: there they overlap
            # with the rest of the backward pass, while inside a cond branch
            # they would wait for every gradient and run alone (that doubled
            # the cost on a 20-layer MLP). Only the writes are conditional.
            measured = self._measure(layout, gradients)
            self._while_open(lambda: self._record(layout, measured, gradients, step), step)
            return
        # Replica id known only at run time (e.g. TPU): the same decision as a cond.
        tf.cond(
            writing,
            lambda: self._while_open(
                lambda: self._record(layout, self._measure(layout, gradients), gradients, step), step
            ),
            lambda: tf.constant(False),
        )

    def _while_open(self, record, step):
        """Runs ``record`` (which returns a bool tensor) now, or, in a graph, only while the writer is open.

        A tf.function traced now may still run after close(), when Python
        code (and so _check_open) no longer runs and the file is gone: the
        graph checks the writer is open and otherwise skips the write,
        warning once, instead of failing the training step. Every writing
        path (write, the Keras callback, a gradient-check write) goes through
        here.
        """
        if tf.executing_eagerly():
            return record()
        if self._open is None:
            self._open = _host_variable(True, tf.bool, "tb_gradcheck_open")
            self._warned = _host_variable(False, tf.bool, "tb_gradcheck_warned")
        return tf.cond(self._open, record, lambda: self._skip_closed(step))

    def _skip_closed(self, step):
        def warn():
            tf.print(
                "WARNING: tb_gradcheck: GradientWriter.write() ran at step", step,
                "after close(), from a tf.function traced before close(); gradient statistics are not "
                "recorded from this step on (this warning is printed once).",
                output_stream=sys.stderr,
            )
            self._warned.assign(True)
            return tf.constant(False)

        return tf.cond(self._warned, lambda: tf.constant(False), warn)

    def _measure(self, layout, gradients):
        """This step's statistics: all of them when every step is written, else what a window reduces."""
        if self.every_n_steps == 1:
            return stats.compute(gradients, layout.variables, layout.rows)
        # Between writes only what a window needs: one fused pass per
        # gradient for the norm (and, on a bad step only, the NaN count).
        # The weight norms are taken here too, outside the write's cond: read
        # inside it, the model's variables would make the cond an op that the
        # optimizer's updates must wait for, serialising the whole step.
        layer, variable = stats.compute(gradients, layout.variables, layout.rows, weights=False, full=False)
        return layer, variable, stats.weight_norms(layout.variables, layout.rows)

    def _record(self, layout, measured, gradients, step):
        """Writes (or, windowed, accumulates and every N steps writes) the measured statistics."""
        layer, variable = measured[:2]
        # Leaving as_default() flushes the writer: this is what makes every
        # written step survive a SIGKILL (see the flush policy above).
        with self._writer.as_default():
            if self.every_n_steps == 1:
                self._write_stats(layout, layer[None], variable[None], step)
                return tf.constant(True)
            layout.window.add(layer, variable, step)
            due = tf.equal(step % self.every_n_steps, 0)
            tf.cond(due, lambda: self._flush_window(layout, step, gradients, measured[2]), lambda: tf.constant(False))
        return tf.constant(True)

    def write_check(self, report, step):
        """Records a gradient check report for the tab's ``check_error`` heatmap.

        Writes one check tensor per granularity the report has: layers
        always, variables when it was checked per variable. Call it eagerly,
        next to the training step, every N steps:

            if step % 100 == 0:
                report = tb_gradcheck.check_gradients(loss_fn, model.trainable_variables, seed=step)
                writer.write_check(report, step)

        Args:
          report: A ``GradientCheckReport`` from ``check_gradients``.
          step: Integer training step (Python int, integer tensor or variable).

        Returns:
          None.

        Raises:
          TypeError: ``report`` is not a ``GradientCheckReport``, or ``step``
            is not an integer.
          ValueError: A negative step, a closed writer, or a call inside
            ``tf.function`` (a report is a Python object, computed eagerly).
        """
        self._check_open("write_check")
        if not isinstance(report, checks.GradientCheckReport):
            raise TypeError(
                "Expected `report` to be a GradientCheckReport (from tb_gradcheck.check_gradients). "
                f"Received: {type(report).__name__}"
            )
        if tf.inside_function():
            raise ValueError(
                "Expected write_check to be called eagerly, outside tf.function. "
                "Received: a call while tracing a tf.function"
            )
        step = validate.step(step)
        with self._writer.as_default():
            for granularity, rows in (("layer", report.layers), ("variable", report.variables)):
                if not rows:
                    continue
                content = metadata.check_layout(granularity, [r.name for r in rows])
                self._emit(content, tf.constant(check_matrix(rows)), step)

    def flush(self):
        """Hands buffered events to the operating system (``write()`` already does for its own)."""
        if not self._closed and self._summary_writer is not None:
            self._summary_writer.flush()

    def close(self):
        """Writes any partial window, flushes and (if this writer made it) closes the file.

        Safe to call twice. Calling ``write()`` after ``close()`` raises
        ValueError; a ``tf.function`` traced before ``close()`` and run after
        it skips the write and prints one warning to stderr, so training
        goes on.
        """
        if self._closed:
            return
        if self._open is not None:
            self._open.assign(False)
        if self._summary_writer is not None:
            for layout in self._layouts.values():
                if layout.window is not None and bool(layout.window.pending()):
                    with self._summary_writer.as_default():
                        self._flush_window(layout, layout.window.last_step.read_value())
            self._summary_writer.flush()
            if self._owns_writer:
                self._summary_writer.close()
        self._closed = True
        _open_writers.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- internals ----------------------------------------------------------

    @property
    def _writer(self):
        """The tf.summary writer, its event file opened on first use."""
        if self._summary_writer is None:
            with tf.init_scope():
                self._summary_writer = tf.summary.create_file_writer(
                    self._logdir, max_queue=DEFAULT_MAX_QUEUE, flush_millis=self._flush_millis
                )
        return self._summary_writer

    def _check_open(self, what):
        if self._closed:
            raise ValueError(f"Cannot {what}: this GradientWriter is closed. Create a new one to keep writing.")

    def _layout_for(self, variables, gradients):
        sparse = tuple(isinstance(g, tf.IndexedSlices) for g in gradients)
        key = (tuple(id(v) for v in variables), sparse)
        layout = self._layouts.get(key)
        if layout is None:
            layout = _Layout(variables, sparse, self.every_n_steps, self._unit_axes)
            self._layouts[key] = layout
        return layout

    def _flush_window(self, layout, step, gradients=None, weight_norms=None):
        """Writes the window; with this step's ``gradients``, its ``last`` slab has every statistic."""
        layer_w, variable_w = weight_norms or stats.weight_norms(layout.variables, layout.rows)
        last = None
        if gradients is not None:
            last = stats.compute(gradients, layout.variables, layout.rows, weights=False)
        layer, variable = layout.window.aggregates(step, last)
        self._write_stats(layout, stats.with_weights(layer, layer_w), stats.with_weights(variable, variable_w), step)
        layout.window.reset()
        return tf.constant(True)

    def _write_stats(self, layout, layer, variable, step):
        if self._writes is None:
            self._writes = _host_variable(0.0, tf.float32, "tb_gradcheck_writes")
            self._last_write_step = _host_variable(-1, tf.int64, "tb_gradcheck_step")
        # Count steps, not calls: two models written through one writer (a
        # GAN's generator and discriminator) write twice per step, and a
        # count of calls would make the tab say "N of 2N steps" (sampled).
        step = tf.cast(step, tf.int64)
        writes = self._writes.assign_add(tf.cast(tf.not_equal(step, self._last_write_step), tf.float32))
        self._last_write_step.assign(step)
        # float32 counts exactly up to 2**24 (16.7 million) writes.
        header = tf.pad(tf.fill([tf.shape(layer)[0], 1, 1], writes), [[0, 0], [0, 0], [0, layer.shape[-1] - 1]])
        self._emit(layout.content, tf.concat([layer, variable, header], axis=1), step)

    def _emit(self, content, tensor, step):
        """Writes one tensor under its layout's tag; full metadata on the first write only."""
        tag = metadata.tag_for(content)
        if tag not in self._fresh:
            self._fresh[tag] = _host_variable(True, tf.bool, "tb_gradcheck_fresh")
        fresh = self._fresh[tag]
        md = tf.where(fresh, _serialized_metadata(content), _SLIM_METADATA)
        written = tf.summary.write(tag, tensor, step=step, metadata=md)
        # Under tf.summary.record_if(False) nothing was written: stay fresh.
        fresh.assign(tf.logical_and(fresh, tf.logical_not(written)))


class _Layout:
    """Everything fixed for one list of variables: rows, tag content, window state."""

    def __init__(self, variables, sparse, every_n_steps, unit_axes):
        self.variables = list(variables)
        self.rows = stats.Rows(self.variables, unit_axes)
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
            self.window = _Window(len(self.rows.layer_names), len(self.rows.variable_names))


class _Window:
    """Running last/sum/max/min/count of the gradient columns since the last write, and the onset.

    Every cell that holds a value at a step (not MISSING) is reduced, so what
    a window reduces is what the per-step statistics hold: grad_norm,
    grad_nonfinite and grad_norm_finite, one fused pass per gradient; max
    |g|, the zero fraction and dead units need passes of their own, so they
    are taken at the write step only (the ``last`` slab) and their other
    slabs are MISSING. Weight columns are filled in at the write step. NaN
    propagates through sum, max and min on purpose: a window that saw a NaN
    must not look healthy in any aggregate; grad_norm_finite's max is what
    the window saw before it. The first step with a non-finite gradient is
    kept per row as an int64 step and written as its offset before the write
    step (``first_nonfinite_offset``, the same in every slab).
    """

    def __init__(self, n_layers, n_variables):
        c = stats.GRADIENT_COLUMNS
        self._parts = [self._state(n, c) for n in (n_layers, n_variables)]
        self.last_step = _host_variable(0, tf.int64, "tb_gradcheck_last_step")

    @staticmethod
    def _state(n, c):
        def var(value, shape=(n, c)):
            return _host_variable(np.full(shape, value, np.float32), tf.float32, "tb_gradcheck_window")

        return {
            "last": var(stats.MISSING),
            "sum": var(0.0),
            "max": var(-np.inf),
            "min": var(np.inf),
            "count": var(0.0),
            "first_nonfinite": _host_variable(np.full(n, -1, np.int64), tf.int64, "tb_gradcheck_window"),
        }

    def add(self, layer, variable, step):
        step = tf.cast(step, tf.int64)
        for part, current in zip(self._parts, (layer, variable)):
            grad = current[:, : stats.GRADIENT_COLUMNS]
            here = tf.not_equal(grad, stats.MISSING)  # NaN != MISSING: NaN is data
            part["last"].assign(grad)
            part["count"].assign_add(tf.cast(here, tf.float32))
            part["sum"].assign_add(tf.where(here, grad, 0.0))
            part["max"].assign(tf.where(here, tf.maximum(part["max"], grad), part["max"]))
            part["min"].assign(tf.where(here, tf.minimum(part["min"], grad), part["min"]))
            first = part["first_nonfinite"]
            bad = grad[:, stats.FIRST_NONFINITE] == 0.0  # this step's offset: 0 where it had NaN/Inf
            first.assign(tf.where(bad & (first < 0), step, first))
        self.last_step.assign(step)

    def pending(self):
        return tf.reduce_any(self._parts[0]["count"][:, 0] > 0)

    def aggregates(self, step, last=None):
        """Returns ``(layer, variable)`` float32 ``[A, R, C]`` in ``metadata.AGGREGATES`` order.

        Args:
          step: The write step (int64), which onset offsets count back from.
          last: ``(layer, variable)`` full statistics of the write step for the
            ``last`` slab, or None to use the last step's windowed columns.
        """
        out = []
        step = tf.cast(step, tf.int64)
        for k, part in enumerate(self._parts):
            count = part["count"]
            seen = count > 0
            mean = part["sum"] / tf.maximum(count, 1.0)
            slabs = {
                "last": part["last"] if last is None else last[k][:, : stats.GRADIENT_COLUMNS],
                "mean": mean,
                "max": part["max"],
                "min": part["min"],
                "sum": part["sum"],
            }
            grad = tf.stack(
                [slabs[a] if a == "last" else tf.where(seen, slabs[a], stats.MISSING) for a in metadata.AGGREGATES]
            )
            first = part["first_nonfinite"]
            offset = tf.where(first >= 0, tf.cast(step - first, tf.float32), stats.MISSING)
            column = np.arange(stats.GRADIENT_COLUMNS) == stats.FIRST_NONFINITE
            grad = tf.where(column, offset[None, :, None], grad)
            weight_col = tf.fill(tf.concat([tf.shape(grad)[:2], [1]], 0), stats.MISSING)
            out.append(tf.concat([grad, weight_col], axis=-1))
        return tuple(out)

    def reset(self):
        for part in self._parts:
            part["sum"].assign(tf.zeros_like(part["sum"]))
            part["max"].assign(tf.fill(tf.shape(part["max"]), -np.inf))
            part["min"].assign(tf.fill(tf.shape(part["min"]), np.inf))
            part["count"].assign(tf.zeros_like(part["count"]))
            part["first_nonfinite"].assign(tf.fill(tf.shape(part["first_nonfinite"]), tf.constant(-1, tf.int64)))


def check_matrix(rows):
    """float32 ``[R, len(CHECK_COLUMNS)]`` of check rows; the status as its index in CHECK_STATUSES."""
    out = np.full((len(rows), len(metadata.CHECK_COLUMNS)), np.nan, np.float32)
    for i, row in enumerate(rows):
        for j, column in enumerate(metadata.CHECK_COLUMNS):
            if column == "status":
                out[i, j] = metadata.CHECK_STATUSES.index(row.status)
            else:
                out[i, j] = getattr(row, column)
    return out


def _serialized_metadata(content):
    md = summary_pb2.SummaryMetadata()
    md.plugin_data.plugin_name = metadata.PLUGIN_NAME
    md.plugin_data.content = metadata.encode(content)
    md.data_class = summary_pb2.DATA_CLASS_TENSOR
    return md.SerializeToString()


def _slim_metadata():
    md = summary_pb2.SummaryMetadata()
    md.plugin_data.plugin_name = metadata.PLUGIN_NAME
    md.data_class = summary_pb2.DATA_CLASS_TENSOR
    return md.SerializeToString()


_SLIM_METADATA = _slim_metadata()


def _host_variable(initial_value, dtype, name):
    """A plain variable of this process, whatever distribution strategy is in scope.

    Variables made under a strategy (also in ``tf.init_scope()`` inside
    ``strategy.run``, which is where the writer first runs) become the
    strategy's distributed variables, and neither kind fits this state:

    - ``MirroredVariable`` (the default, aggregation NONE): in replica context
      each replica updates its own copy, so the copies drift apart, since
      only replica 0 records summaries;
    - ``MultiWorkerMirroredStrategy`` broadcasts every new variable's initial
      value from the chief, a collective that each worker must join in the
      same order. State created only where the writer writes would hang the
      other workers.

    The writer's state is used by one replica of one process and needs
    neither copies nor collectives, so it is made directly as a
    ResourceVariable, which does not go through the strategy's variable
    creator. It is not tracked by any model or checkpoint.
    """
    with tf.init_scope():
        return resource_variable_ops.ResourceVariable(
            tf.constant(initial_value, dtype), trainable=False, name=name
        )


def _writing_replica():
    """Whether this replica records: True, False, or a bool tensor when only known at run time.

    One replica per step records: replica 0 of the worker that saves
    summaries (the chief; every worker of a single-worker strategy). In
    cross-replica context the code runs once per worker, so the worker decides.
    tf.summary makes the same choice for summaries (it records in replica
    context only where ``replica_id_in_sync_group == 0``); the writer makes it
    for its state updates too, which would otherwise run on every replica.
    """
    strategy = tf.distribute.get_strategy()
    if not strategy.extended.should_save_summary:
        return False
    context = tf.distribute.get_replica_context()
    if context is None:
        return True
    replica = context.replica_id_in_sync_group
    static = tf.get_static_value(replica)
    if static is not None:
        return int(static) == 0
    return tf.equal(replica, 0)


def _sum_over_replicas(gradients):
    """Sums per-replica gradients over the replicas in sync, as Keras optimizers do before applying them."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return gradients
    present = [g for g in gradients if g is not None]
    if not present:
        return gradients
    summed = iter(context.all_reduce(tf.distribute.ReduceOp.SUM, present))
    return [None if g is None else next(summed) for g in gradients]


# Writers still open at interpreter exit get flushed and closed, so a normal
# exit never loses the tail of a run.
_open_writers = weakref.WeakSet()


@atexit.register
def _close_open_writers():
    for w in list(_open_writers):
        try:
            w.close()
        except Exception:  # at exit TensorFlow may already be half torn down
            pass
