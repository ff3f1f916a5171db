"""The writer: per-layer gradient statistics -> TensorBoard summaries under plugin ``gradients``.

Stored layout (content version 1). Every summary has plugin name
``gradients`` and ``DATA_CLASS_TENSOR``; its metadata content is the JSON
layout from ``metadata.layout``. One event per written step and granularity:

- ``gradients/stats/layer/<fp>`` and ``gradients/stats/variable/<fp>``:
  float32 ``[A, R, C]``. ``A`` slabs are the window aggregates named in the
  content's ``aggregates`` (only ``last`` when every step is written; ``last,
  mean, max, min, sum`` over the steps since the previous write otherwise),
  ``R`` rows are layers (or variables) in depth order as listed in ``rows``,
  ``C`` columns are ``metadata.STAT_COLUMNS``. A row without a gradient holds
  -1 in every gradient column (all of them are non-negative when present).
- ``gradients/check/layer/<fp>`` and ``gradients/check/variable/<fp>``
  (from ``write_check``): float32 ``[R, C]``, rows as in ``rows`` (the
  same grouping and names as the stats rows), columns
  ``metadata.CHECK_COLUMNS``: analytic and numeric directional derivative,
  relative error, noise floor, and the status as its index in
  ``metadata.CHECK_STATUSES`` (0 ok, 1 inconclusive, 2 mismatch; ordered by
  severity, so binning several steps keeps the worst with a plain max). A
  row that was not checked has status NaN.
- ``gradients/progress/<fp>``: int64 scalar, how many stats writes this
  writer has made so far; the plugin reads it to say "N of M steps" when
  TensorBoard sampled a series.

The full metadata (with row names) rides on the first event of each tag a
writer writes; later events carry only the plugin name and data class, since
TensorBoard keeps the first metadata of a tag and ignores the rest. That keeps
the per-step cost to the numbers themselves.
"""

import atexit
import numbers
import weakref

import numpy as np
import tensorflow as tf
from tensorboard.compat.proto import summary_pb2

from tb_gradcheck import checks
from tb_gradcheck import metadata
from tb_gradcheck import stats

# Events are flushed to disk at least this often, and on flush(), close() and
# interpreter exit: a killed process loses at most this much of its record.
DEFAULT_FLUSH_MILLIS = 10_000
# Events queued in memory before a flush is forced regardless of time.
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
        statistics over the N steps since the previous write: statistics are
        accumulated at every call, so a one-step spike is never lost.
      flush_millis: Int, default 10000. Longest time events wait in memory.
    """

    def __init__(self, logdir=None, *, writer=None, every_n_steps=1, flush_millis=DEFAULT_FLUSH_MILLIS):
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
        if logdir is not None and not isinstance(logdir, (str, bytes)) and not hasattr(logdir, "__fspath__"):
            raise TypeError(f"Expected `logdir` to be a path. Received: {type(logdir).__name__}")
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, numbers.Integral) or every_n_steps < 1:
            raise ValueError(f"Expected `every_n_steps` to be a positive integer. Received: {every_n_steps!r}")
        self.every_n_steps = int(every_n_steps)
        self._owns_writer = writer is None
        if writer is None:
            writer = tf.summary.create_file_writer(
                str(logdir) if not isinstance(logdir, bytes) else logdir.decode(),
                max_queue=DEFAULT_MAX_QUEUE,
                flush_millis=int(flush_millis),
            )
        self._writer = writer
        self._closed = False
        self._layouts = {}  # tuple of variable ids -> _Layout
        self._fresh = {}  # tag -> tf.Variable(bool): full metadata not yet written
        self._writes = None  # tf.Variable(int64): stats writes so far
        _open_writers.add(self)

    # -- public API ---------------------------------------------------------

    @tf.autograph.experimental.do_not_convert
    def write(self, gradients, variables, step):
        """Records this step's gradient statistics.

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
          TypeError: ``gradients``, ``variables`` or ``step`` of the wrong kind.
          ValueError: Mismatched lengths, an empty list, or a closed writer.
        """
        self._check_open("write")
        variables = _as_list(variables, "variables")
        gradients = _as_list(gradients, "gradients")
        step = _as_step(step)
        layout = self._layout_for(variables)
        layer, variable = stats.compute(gradients, variables, layout.rows, weights=self.every_n_steps == 1)
        with self._writer.as_default():
            if self.every_n_steps == 1:
                self._write_stats(layout, layer[None], variable[None], step)
                return
            layout.window.add(layer, variable, step)
            due = tf.equal(step % self.every_n_steps, 0)
            tf.cond(due, lambda: self._flush_window(layout, step), lambda: tf.constant(False))

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
        step = _as_step(step)
        with self._writer.as_default():
            for granularity, rows in (("layer", report.layers), ("variable", report.variables)):
                if not rows:
                    continue
                content = metadata.layout(
                    metadata.KIND_CHECK, granularity, rows=[r.name for r in rows], columns=metadata.CHECK_COLUMNS
                )
                self._emit(content, tf.constant(check_matrix(rows)), step)

    def flush(self):
        """Writes buffered events to disk."""
        if not self._closed:
            self._writer.flush()

    def close(self):
        """Writes any partial window, flushes and (if this writer made it) closes the file.

        Safe to call twice. Writing after ``close()`` raises ValueError.
        """
        if self._closed:
            return
        for layout in self._layouts.values():
            if layout.window is not None and bool(layout.window.pending()):
                with self._writer.as_default():
                    self._flush_window(layout, layout.window.last_step.read_value())
        self._writer.flush()
        if self._owns_writer:
            self._writer.close()
        self._closed = True
        _open_writers.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # -- internals ----------------------------------------------------------

    def _check_open(self, what):
        if self._closed:
            raise ValueError(f"Cannot {what}: this GradientWriter is closed. Create a new one to keep writing.")

    def _layout_for(self, variables):
        key = tuple(id(v) for v in variables)
        layout = self._layouts.get(key)
        if layout is None:
            layout = _Layout(variables, self.every_n_steps)
            self._layouts[key] = layout
        return layout

    def _flush_window(self, layout, step):
        layer_w, variable_w = stats.weight_norms(layout.variables, layout.rows)
        layer, variable = layout.window.aggregates()
        self._write_stats(layout, stats.with_weights(layer, layer_w), stats.with_weights(variable, variable_w), step)
        layout.window.reset()
        return tf.constant(True)

    def _write_stats(self, layout, layer, variable, step):
        for content, tensor in zip(layout.contents, (layer, variable)):
            self._emit(content, tensor, step)
        with tf.init_scope():
            if self._writes is None:
                self._writes = tf.Variable(0, dtype=tf.int64, trainable=False, name="tb_gradcheck_writes")
        self._writes.assign_add(1)
        self._emit(_PROGRESS, self._writes.read_value(), step)

    def _emit(self, content, tensor, step):
        """Writes one tensor under its layout's tag; full metadata on the first write only."""
        tag = metadata.tag_for(content)
        with tf.init_scope():
            if tag not in self._fresh:
                self._fresh[tag] = tf.Variable(True, trainable=False, name="tb_gradcheck_fresh")
        fresh = self._fresh[tag]
        md = tf.where(fresh, _serialized_metadata(content), _SLIM_METADATA)
        written = tf.summary.write(tag, tensor, step=step, metadata=md)
        # Under tf.summary.record_if(False) nothing was written: stay fresh.
        fresh.assign(tf.logical_and(fresh, tf.logical_not(written)))


class _Layout:
    """Everything fixed for one list of variables: rows, tag contents, window state."""

    def __init__(self, variables, every_n_steps):
        self.variables = list(variables)
        self.rows = stats.Rows(self.variables)
        aggregates = metadata.SINGLE_STEP_AGGREGATES if every_n_steps == 1 else metadata.AGGREGATES
        self.contents = [
            metadata.layout(
                metadata.KIND_STATS,
                granularity,
                rows=self.rows.names(granularity),
                columns=metadata.STAT_COLUMNS,
                aggregates=aggregates,
                window=every_n_steps,
                sizes=self.rows.sizes(granularity),
            )
            for granularity in metadata.GRANULARITIES
        ]
        self.window = None
        if every_n_steps > 1:
            with tf.init_scope():
                self.window = _Window(len(self.rows.layer_names), len(self.rows.variable_names))


class _Window:
    """Running last/sum/max/min/count of the gradient columns since the last write.

    Only the gradient columns are reduced; weight columns are filled in at
    the write step. NaN propagates through sum, max and min on purpose: a
    window that saw a NaN must not look healthy in any aggregate.
    """

    def __init__(self, n_layers, n_variables):
        c = stats.GRADIENT_COLUMNS
        self._parts = [self._state(n, c) for n in (n_layers, n_variables)]
        self.last_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="tb_gradcheck_last_step")

    @staticmethod
    def _state(n, c):
        def var(value, shape=(n, c)):
            return tf.Variable(tf.fill(shape, tf.constant(value, tf.float32)), trainable=False)

        return {
            "last": var(stats.MISSING),
            "sum": var(0.0),
            "max": var(-np.inf),
            "min": var(np.inf),
            "count": var(0.0, (n,)),
        }

    def add(self, layer, variable, step):
        for part, current in zip(self._parts, (layer, variable)):
            grad = current[:, : stats.GRADIENT_COLUMNS]
            here = stats.present(current)[:, None]
            part["last"].assign(grad)
            part["count"].assign_add(tf.cast(here[:, 0], tf.float32))
            part["sum"].assign_add(tf.where(here, grad, 0.0))
            part["max"].assign(tf.where(here, tf.maximum(part["max"], grad), part["max"]))
            part["min"].assign(tf.where(here, tf.minimum(part["min"], grad), part["min"]))
        self.last_step.assign(tf.cast(step, tf.int64))

    def pending(self):
        return tf.reduce_any(self._parts[0]["count"] > 0)

    def aggregates(self):
        """Returns ``(layer, variable)`` float32 ``[A, R, C]`` in ``metadata.AGGREGATES`` order."""
        out = []
        for part in self._parts:
            count = part["count"][:, None]
            seen = count > 0
            mean = part["sum"] / tf.maximum(count, 1.0)
            slabs = {
                "last": part["last"],
                "mean": mean,
                "max": part["max"],
                "min": part["min"],
                "sum": part["sum"],
            }
            grad = tf.stack(
                [slabs[a] if a == "last" else tf.where(seen, slabs[a], stats.MISSING) for a in metadata.AGGREGATES]
            )
            weight_cols = tf.fill(tf.concat([tf.shape(grad)[:2], [2]], 0), stats.MISSING)
            out.append(tf.concat([grad, weight_cols], axis=-1))
        return tuple(out)

    def reset(self):
        for part in self._parts:
            part["sum"].assign(tf.zeros_like(part["sum"]))
            part["max"].assign(tf.fill(tf.shape(part["max"]), -np.inf))
            part["min"].assign(tf.fill(tf.shape(part["min"]), np.inf))
            part["count"].assign(tf.zeros_like(part["count"]))


_PROGRESS = metadata.layout(metadata.KIND_PROGRESS)


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


def _as_list(values, name):
    if isinstance(values, (tf.Tensor, tf.Variable, np.ndarray)) or not hasattr(values, "__iter__"):
        raise TypeError(f"Expected `{name}` to be a list. Received: {type(values).__name__}")
    values = list(values)
    if not values:
        raise ValueError(f"Expected a non-empty list of {name}. Received: an empty list")
    return values


def _as_step(step):
    if isinstance(step, bool) or step is None:
        raise TypeError(f"Expected `step` to be an integer. Received: {step!r}")
    if isinstance(step, numbers.Integral):
        if step < 0:
            raise ValueError(f"Expected `step` to be non-negative. Received: {step}")
        return tf.constant(int(step), tf.int64)
    if isinstance(step, (tf.Tensor, tf.Variable)) or hasattr(step, "dtype"):
        dtype = tf.as_dtype(step.dtype)
        if not dtype.is_integer:
            raise TypeError(f"Expected `step` to be an integer. Received: a {dtype.name} tensor")
        if step.shape.rank not in (0, None):
            raise ValueError(f"Expected `step` to be a scalar. Received: shape {step.shape}")
        return tf.cast(tf.convert_to_tensor(step), tf.int64)
    raise TypeError(f"Expected `step` to be an integer. Received: {step!r} of type {type(step).__name__}")


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
