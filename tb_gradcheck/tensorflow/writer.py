"""The writer: per-layer gradient statistics -> TensorBoard summaries under plugin ``gradients``.

What it writes, tag by tag and byte by byte, is in ``docs/stored_format.md``
(versioned in ``metadata.CONTENT_VERSION``).

The writer's other modules are listed in ``docs/architecture.md``: ``recording``
does the work for one list of variables, ``lifetime`` guards a closed writer's traced graphs.
"""

import tensorflow as tf

from tb_gradcheck.check.report import stored_checks
from tb_gradcheck.core import at_exit
from tb_gradcheck.core import run_directory
from tb_gradcheck.core import validate
from tb_gradcheck.tensorflow import branches
from tb_gradcheck.tensorflow import compiled
from tb_gradcheck.tensorflow import distributed
from tb_gradcheck.tensorflow import events
from tb_gradcheck.tensorflow import lifetime
from tb_gradcheck.tensorflow import optimizer
from tb_gradcheck.tensorflow import recording
from tb_gradcheck.tensorflow.variables import checked_gradients
from tb_gradcheck.tensorflow.variables import checked_step
from tb_gradcheck.tensorflow.variables import checked_variables

# Flush policy. Every write() ends by flushing its events to the operating system: tf.summary's
# writer.as_default() flushes when its block exits, eagerly and inside tf.function alike, and write()
# runs inside one. So a process killed with SIGKILL loses nothing that write() had recorded (only a step
# whose graph was still running); what the OS had not yet put on disk is lost only if the machine itself
# goes down (there is no fsync). The cost is one write(2) of a few kilobytes per written step. The two
# settings below are the underlying tf.summary writer's: they bound how long events of *other* summaries
# wait when the writer is shared (GradientWriter(writer=...)). close() and exit (atexit) flush and close.
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
      logdir: Directory of the run (one run per directory), made and checked
        here; where it goes is logged once. Exactly one of ``logdir`` and ``writer``.
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
        own events anyway (see the flush policy at the top of writer.py).
      unit_axes: Dict or None (default). ``{variable path: 2}`` for
        depthwise kernels, whose units (for ``dead_unit_fraction``) are
        their last two axes: pass ``tb_gradcheck.tensorflow.units.unit_axes(model)``.
        Every other variable's units follow from its shape (see
        ``tb_gradcheck.tensorflow.units``).
    """

    def __init__(self, logdir=None, *, writer=None, every_n_steps=1, flush_millis=DEFAULT_FLUSH_MILLIS, unit_axes=None):
        validate.exactly_one(logdir=logdir, writer=writer)
        if writer is not None and not isinstance(writer, tf.summary.SummaryWriter):
            raise TypeError(
                "Expected `writer` to be a tf.summary.SummaryWriter (from tf.summary.create_file_writer). "
                f"Received: {type(writer).__name__}"
            )
        every_n_steps = validate.positive_int(every_n_steps, "every_n_steps")
        flush_millis = validate.positive_int(flush_millis, "flush_millis")
        if logdir is not None:  # made and checked now, once every argument is known good
            logdir = run_directory.prepare(logdir, "logdir", "tb_gradcheck.GradientWriter")
            run_directory.announce(logdir)
        self._unit_axes = dict(unit_axes or {})
        self.every_n_steps = int(every_n_steps)
        self._owns_writer = writer is None
        # The run directory (None through a tf.summary writer). Its event file is opened at the first write this
        # process records: a worker that never writes (a non-chief under tf.distribute) leaves no file there.
        self.log_dir = logdir
        self._flush_millis = int(flush_millis)
        self._summary_writer = writer
        self._closed = False
        self._layouts = {}  # (variable ids, sparse flags) -> recording.Recording
        self._events = events.Events()  # tags, fresh flags, the header row's write counter
        self._guard = lifetime.Guard()  # what traced graphs do after close()
        at_exit.opened(self)

    # -- public API ---------------------------------------------------------

    @tf.autograph.experimental.do_not_convert
    def write(self, gradients, variables, step, *, gradients_before_clip=None, update=None):
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
          gradients_before_clip: Optional, one per variable like
            ``gradients``: the gradients before your clipping, when
            ``gradients`` are the clipped ones the optimizer applies. Their
            norms are recorded as ``grad_norm_before_clip`` at write steps.
          update: Optional, the bracket from ``applying`` that was around
            this step's optimizer update: records ``update_norm`` and
            ``update_to_weight`` at write steps, and ``weight_norm`` of the
            weights before the update. Call ``write`` after the bracket.

        Returns:
          None. Inside ``tf.function`` the writes are ops of the graph.

        Raises:
          TypeError: ``gradients``, ``variables`` or ``step`` of the wrong
            kind, including per-replica values outside ``strategy.run``.
          ValueError: Mismatched lengths, an empty list, a step outside
            0..2**63-1, a closed writer, or a call traced under XLA. (A ``tf.function`` traced before
            ``close()`` and run after it skips the write with one warning.)
        """
        self._check_open("write")
        compiled.refuse_under_xla("write", "`stash(...)` in the compiled step and `write_stashed()` after it")
        variables = checked_variables(variables)
        gradients = checked_gradients(gradients, variables)
        step = checked_step(step)
        if gradients_before_clip is not None:
            gradients_before_clip = distributed.sum_over_replicas(checked_gradients(gradients_before_clip, variables))
        if update is not None and not isinstance(update, optimizer.UpdateBracket):
            raise TypeError(
                f"Expected `update` to be the bracket from GradientWriter.applying(). Received: {type(update).__name__}"
            )
        extra = None
        if gradients_before_clip is not None or update is not None:
            extra = optimizer.Extra(update=update, before_clip=gradients_before_clip)
        self.record(distributed.sum_over_replicas(gradients), variables, step, extra)

    def applying(self, variables, step):
        """A context manager around one optimizer update, to record the update it applied.

        Example (eagerly or inside ``tf.function``; under ``tf.distribute``
        inside ``strategy.run``):

            with writer.applying(model.trainable_variables, step) as update:
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
            writer.write(grads, model.trainable_variables, step, update=update)

        At a step that is not written it does nothing; at a write step it
        reads the weights before the update and the norm of their change
        after it (see ``tb_gradcheck.tensorflow.optimizer`` for the cost).

        Args:
          variables: The variables the update changes, as given to ``write``.
          step: The step given to ``write``.

        Returns:
          An ``optimizer.UpdateBracket`` to pass to ``write(..., update=...)``.
        """
        self._check_open("applying")
        variables = checked_variables(variables)
        step = checked_step(step)
        return optimizer.UpdateBracket(variables, self.due(step))

    def due(self, step):
        """Whether ``step`` (an int64 tensor) is a write step: a bool tensor (a Python True when every step is)."""
        if self.every_n_steps == 1:
            return True
        return tf.equal(step % self.every_n_steps, 0)

    @tf.autograph.experimental.do_not_convert
    def stash(self, gradients, variables, step, *, between_writes=False):
        """Records this step's statistics from inside a ``tf.function(jit_compile=True)`` step.

        XLA cannot compile summary ops, so ``write`` cannot run there.
        ``stash`` computes the same statistics inside the compiled step
        (compiled with it) into variables; call ``write_stashed()`` after the
        step, outside the compiled function, to write them:

            @tf.function(jit_compile=True)
            def train_step(x, y):
                with tf.GradientTape() as tape:
                    loss = loss_fn(y, model(x, training=True))
                grads = tape.gradient(loss, model.trainable_variables)
                writer.stash(grads, model.trainable_variables, optimizer.iterations)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))

            for x, y in dataset:
                train_step(x, y)
                writer.write_stashed()

        Each ``write_stashed()`` is a host round trip (about a millisecond
        on a CPU), and fewer calls are enough: with ``every_n_steps=N > 1``,
        one after each step that is a multiple of N; written every step, one
        at least every ``compiled.DEPTH`` (8) steps, since the stash holds the
        last 8. ``close()`` writes what is still held.

        With a window, ``between_writes=True`` (a Python bool) says that
        this step is not a write step: it then takes only what the window
        reduces (the norm, and from it whether there was a NaN or Inf), not
        the write step's other statistics, which a compiled step cannot skip
        with a cond. Trace the step once for each value and pass
        ``step % N != 0``; a write step stashed with it anyway has MISSING in the columns it did not take.

        For one replica (no ``tf.distribute`` strategy with several). Args,
        returns and errors as for ``write``.
        """
        self._check_open("write")
        between_writes = validate.flag(between_writes, "between_writes")
        variables = checked_variables(variables)
        gradients = checked_gradients(gradients, variables)
        self.record_compiled(gradients, variables, checked_step(step), between_writes=between_writes)

    def write_stashed(self):
        """Writes what ``stash`` recorded since the last call and still holds (see ``stash`` for how often to call)."""
        self.write_compiled()

    # -- internal interface ---------------------------------------------------
    # For callers inside tb_gradcheck that hold gradients already checked and
    # summed over replicas (tb_gradcheck.keras: the gradients a Keras
    # optimizer applies). Nothing is validated again below this line.

    def record(self, gradients, variables, step, extra=None):
        """Records one step's gradients, which are the same on every replica, once per step.

        Args:
          gradients: One per variable: None, a ``tf.IndexedSlices`` or a
            floating-point tensor of the variable's shape (what
            ``validate.gradients`` returns), already summed over replicas.
          variables: The variables (what ``validate.variables`` returns).
          step: A scalar int64 tensor (what ``validate.step`` returns).
          extra: An ``optimizer.Extra`` (the optimizer columns), or None.

        Returns:
          None. On a replica or worker that does not write, nothing is
          computed (the statistics would only be thrown away).
        """
        self._check_open("write")
        layout = self._layout_for(variables, gradients, () if extra is None else extra.names)
        writing = distributed.writing_replica()
        if writing is False:
            return
        if writing is True:
            # The statistics are computed outside any cond: there they overlap
            # with the rest of the backward pass, while inside a cond branch
            # they would wait for every gradient and run alone (that doubled
            # the cost on a 20-layer MLP). Only the writes are conditional.
            self._record(layout, layout.measure(gradients, step), gradients, step, extra)
            return
        # Replica id known only at run time (e.g. TPU): the same decision as a cond.
        branches.cond(
            writing,
            lambda: self._record(layout, layout.measure(gradients, step), gradients, step, extra),
            lambda: tf.constant(False),
        )

    def record_compiled(self, gradients, variables, step, extra=None, between_writes=False):
        """Like ``record``, inside an XLA-compiled step: statistics into variables, no summary op.

        Call ``write_compiled`` after the step, outside XLA, to write them
        (``tb_gradcheck.tensorflow.compiled``). For a single process without a
        distribution strategy, where replica 0 is the only replica.
        ``between_writes``: a window's step that the caller knows is not a
        write step takes only what the window reduces (``Recording.stash``).
        """
        self._check_open("write")
        layout = self._layout_for(variables, gradients, () if extra is None else extra.names)
        layout.stash(gradients, step, extra, between_writes)

    def write_compiled(self):
        """Writes, eagerly, what ``record_compiled`` stored since the last call (every N steps with a window).

        Returns the latest step stashed (an int64 tensor; -1 before the
        first), written or not: a caller that knows each call follows at most
        one step can wait for the next write step before calling again.
        """
        self._check_open("write")
        steps = [layout.write_stashed(self._writer) for layout in self._layouts.values()]
        return tf.reduce_max(tf.stack(steps)) if steps else tf.constant(-1, tf.int64)

    def _record(self, layout, measured, gradients, step, extra=None):
        layout.record(measured, gradients, step, self._writer, extra, guard=lambda write: self._guard.run(write, step))
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
        stored = stored_checks(report)
        if tf.inside_function():
            raise ValueError(
                "Expected write_check to be called eagerly, outside tf.function. "
                "Received: a call while tracing a tf.function"
            )
        step = checked_step(step)
        with self._writer.as_default():
            for content, matrix in stored:
                self._events.tensor(content, tf.constant(matrix), step)

    def flush(self):
        """Hands buffered events to the operating system (``write()`` already does for its own)."""
        if not self._closed and self._summary_writer is not None:
            self._summary_writer.flush()

    def close(self):
        """Writes any partial window and stashed step, flushes and (if this writer made it) closes the file.

        Safe to call twice. Calling ``write()`` after ``close()`` raises
        ValueError; a ``tf.function`` traced before ``close()`` and run after
        it skips the write and prints one warning to stderr, so training
        goes on.
        """
        if self._closed:
            return
        self._guard.close()
        if self._summary_writer is not None:
            for layout in self._layouts.values():
                layout.finish(self._summary_writer)
            self._summary_writer.flush()
            if self._owns_writer:
                self._summary_writer.close()
        self._closed = True
        at_exit.closed(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    @property
    def _writer(self):
        """The tf.summary writer, its event file opened on first use."""
        if self._summary_writer is None:
            with tf.init_scope():
                self._summary_writer = tf.summary.create_file_writer(
                    self.log_dir, max_queue=DEFAULT_MAX_QUEUE, flush_millis=self._flush_millis
                )
        return self._summary_writer

    def _check_open(self, what):
        if self._closed:
            raise ValueError(f"Cannot {what}: this GradientWriter is closed. Create a new one to keep writing.")

    def _layout_for(self, variables, gradients, optimizer_columns=()):
        sparse = tuple(isinstance(g, tf.IndexedSlices) for g in gradients)
        key = (tuple(id(v) for v in variables), sparse, tuple(optimizer_columns))
        layout = self._layouts.get(key)
        if layout is None:
            layout = recording.Recording(
                variables, sparse, self.every_n_steps, self._unit_axes, self._events, optimizer_columns
            )
            self._layouts[key] = layout
        return layout
