"""What a closed writer's traced graphs do (the close of writers still open at exit: ``core.at_exit``).

A ``tf.function`` traced while a ``GradientWriter`` was open may still run
after ``close()``, when Python code (and so the writer's own check) no longer
runs and the file is gone. Its writes therefore go through ``Guard.run``: the
graph reads a flag and skips the write, warning once, instead of failing the
training step.
"""

import sys

import tensorflow as tf

from tb_gradcheck.tensorflow import branches
from tb_gradcheck.tensorflow import distributed


class Guard:
    """One writer's open flag, as variables its traced graphs read."""

    def __init__(self):
        self._open = None  # variable(bool): False after close()
        self._warned = None  # variable(bool): the after-close warning was printed

    def run(self, write, step):
        """Runs ``write`` (which returns a bool tensor) now, or, in a graph, only while the writer is open.

        Every write to the file from a traced step (``write``, the Keras
        callback) goes through here; a window's accumulation between writes
        does not need to (it touches no file), so its steps pay for no cond
        of this kind.
        """
        if tf.executing_eagerly():
            return write()
        if self._open is None:
            self._open = distributed.host_variable(True, tf.bool, "tb_gradcheck_open")
            self._warned = distributed.host_variable(False, tf.bool, "tb_gradcheck_warned")
        return branches.cond(self._open, write, lambda: self._skip(step))

    def close(self):
        """From now on the graphs traced before skip their writes."""
        if self._open is not None:
            self._open.assign(False)

    def _skip(self, step):
        def warn():
            tf.print(
                "WARNING: tb_gradcheck: GradientWriter.write() ran at step",
                step,
                "after close(), from a tf.function traced before close(); gradient statistics are not "
                "recorded from this step on (this warning is printed once).",
                output_stream=sys.stderr,
            )
            self._warned.assign(True)
            return tf.constant(False)

        return branches.cond(self._warned, lambda: tf.constant(False), warn)
