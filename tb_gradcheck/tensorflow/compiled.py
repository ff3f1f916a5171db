"""Recording from an XLA-compiled step: statistics into variables inside the step, summaries written after it.

XLA cannot compile summary ops, so a writer that records from a compiled step
(``GradientWriter.record_compiled``) runs the same statistics ops as a traced
step, compiled with the rest of the step, and stores the result in host
variables; ``GradientWriter.write_compiled``, called after the step outside
XLA, writes them. Written every step, the stash holds the last ``DEPTH``
steps, so one call after several steps writes them all. A window's per-step
accumulation runs inside the step as usual; at a write step the stash holds
that step's full statistics for the ``last`` slab and the weight norms.
"""

import numpy as np
import tensorflow as tf

from tb_gradcheck.tensorflow import distributed
from tb_gradcheck.tensorflow import statistics

# Steps a stash holds when every step is written. Writing is a host round
# trip of about a millisecond after the compiled step (as much as a small
# step's statistics), so the writes of DEPTH steps share one; a process
# killed outright loses at most the DEPTH - 1 steps not yet written
# (``GradientWriter.close`` writes them otherwise).
DEPTH = 8


def refuse_under_xla(what, instead):
    """Raises ValueError where ``what`` is traced inside ``tf.function(jit_compile=True)``.

    XLA cannot compile summary ops: left to XLA, such a call fails when the
    step runs with "Uninitialized arguments" on a variable of the writer's,
    which names neither the call nor the fix.
    """
    if tf.executing_eagerly():
        return
    # TensorFlow has no public API that tells whether a trace is compiled by XLA.
    from tensorflow.python.ops import control_flow_util

    if control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()):
        raise ValueError(
            f"Expected GradientWriter.{what} outside tf.function(jit_compile=True): XLA cannot compile summary "
            f"ops. Call {instead} (docs/tensorflow.md). Received: a call traced in an XLA-compiled function"
        )


class Stash:
    """One layout's statistics of the latest compiled steps, until they are written.

    Args:
      rows: The layout's ``variables.Rows``.
      columns: The statistic columns the layout stores.
      extra: Names of the optimizer values kept (``store_extra``).
      depth: Steps held: a step goes to slot ``step % depth``, so the last
        ``depth`` consecutive steps are all there.

    Attributes:
      layer: float32 ``[depth, L, C]`` variable: each held step's layer statistics.
      variable: float32 ``[depth, V, C]`` variable: its variable statistics.
      steps: int64 ``[depth]`` variable: the step in each slot, -1 if none.
      weights: ``(layer, variable)`` float32 weight-norm variables of the
        latest step (windows, whose depth is 1).
      extra: Names of the optimizer values kept.
      step: int64 variable: the latest step stored, -1 before the first.
      fresh: bool ``[depth]`` variable: the slot was stored since it was last written.
    """

    def __init__(self, rows, columns, extra=(), depth=1):
        c, d = columns, depth
        n_l, n_v = len(rows.layer_names), len(rows.variable_names)
        self.depth = depth
        self.step = distributed.host_variable(-1, tf.int64, "tb_gradcheck_stash_step")
        self.steps = distributed.host_variable(np.full(d, -1, np.int64), tf.int64, "tb_gradcheck_stash_steps")
        self.layer = distributed.host_variable(np.zeros([d, n_l, c], np.float32), tf.float32, "tb_gradcheck_stash")
        self.variable = distributed.host_variable(np.zeros([d, n_v, c], np.float32), tf.float32, "tb_gradcheck_stash")
        self.weights = (
            distributed.host_variable(np.zeros(n_l, np.float32), tf.float32, "tb_gradcheck_stash"),
            distributed.host_variable(np.zeros(n_v, np.float32), tf.float32, "tb_gradcheck_stash"),
        )
        # Per slot: stored since it was last written (recording.write_stashed).
        self.fresh = distributed.host_variable(np.zeros(d, bool), tf.bool, "tb_gradcheck_stash_fresh")
        # Optional optimizer values of the write step (tb_gradcheck.tensorflow.optimizer):
        # {name: (layer [depth, L], variable [depth, V])} float32 variables.
        self.extra = tuple(extra)
        self._extra = {
            name: (
                distributed.host_variable(np.zeros([d, n_l], np.float32), tf.float32, "tb_gradcheck_stash"),
                distributed.host_variable(np.zeros([d, n_v], np.float32), tf.float32, "tb_gradcheck_stash"),
            )
            for name in self.extra
        }

    def _slot(self, step):
        return [[tf.cast(step, tf.int64) % self.depth]]

    def store_extra(self, step, values):
        """Inside the compiled step: keeps the optimizer values ``{name: (layer, variable)}`` of ``step``."""
        slot = self._slot(step)
        for name, (layer, variable) in values.items():
            self._extra[name][0].scatter_nd_update(slot, layer[None])
            self._extra[name][1].scatter_nd_update(slot, variable[None])

    def store(self, step, layer, variable, weights=None):
        """Inside the compiled step: keeps this step's statistics (and weight norms) until they are written.

        ``layer`` and ``variable`` None: the step's statistics were not taken
        (a step known not to be written); MISSING is kept in their place.
        """
        step = tf.cast(step, tf.int64)
        if layer is None:
            layer = tf.fill(self.layer.shape[1:], statistics.MISSING)
            variable = tf.fill(self.variable.shape[1:], statistics.MISSING)
        slot = self._slot(step)
        self.layer.scatter_nd_update(slot, layer[None])
        self.variable.scatter_nd_update(slot, variable[None])
        if weights is not None:
            self.weights[0].assign(weights[0])
            self.weights[1].assign(weights[1])
        self.steps.scatter_nd_update(slot, step[None])
        self.fresh.scatter_nd_update(slot, [True])
        self.step.assign(step)

    def slots(self):
        """The slots in the order of their steps (an int32 ``[depth]`` tensor), oldest first."""
        return tf.argsort(self.steps.read_value(), stable=True)

    def held(self, slot):
        """``(step, layer [L, C], variable [V, C], extra {name: (layer [L], variable [V])})`` of one slot."""
        extra = {name: (lv[slot], vv[slot]) for name, (lv, vv) in self._extra.items()}
        return self.steps[slot], self.layer[slot], self.variable[slot], extra


class Schedule:
    """When a compiled fit's host writes what its steps stashed, counted in train-function calls.

    Each write is one host round trip of about a millisecond on a CPU, as
    much as the statistics of a small step, so it is made only when it
    cannot wait. A compiled fit runs one step per call
    (``hooks.why_not_compiled``), and a step moves the stashed step on by at
    most one. Written every step, the stash holds the last ``DEPTH`` steps:
    a call every DEPTH calls writes them all before any is overwritten. A
    window writes at one step in N: from the step the last call saw, the
    next write step is at least ``N - step % N`` calls away. If fewer steps
    were stashed than calls made, the call finds nothing due and counts
    again from there; it is never late. What is held at the end is written
    by ``GradientWriter.close``.

    Args:
      writer: The fit's ``GradientWriter``.
    """

    def __init__(self, writer):
        self.writer = writer
        self._calls_to_skip = 0

    def after_call(self):
        """After one call of the compiled train function: writes what is stashed, when it must be."""
        if self._calls_to_skip > 0:
            self._calls_to_skip -= 1
            return
        step = self.writer.write_compiled()
        n = self.writer.every_n_steps
        if n == 1:
            # Not reading the step leaves the host free to queue the next one.
            self._calls_to_skip = DEPTH - 1
            return
        step = int(step)
        if step >= 0:
            self._calls_to_skip = n - step % n - 1

    def between_writes_next(self):
        """Whether the next compiled call is known not to reach a write step (a window's other steps).

        For those calls ``GradientCallback`` runs a second train function,
        traced with ``between_writes`` set: under XLA a step cannot skip the
        write step's statistics with a cond on the gradients
        (``Recording.stash``), but a function compiled for the steps between
        writes never computes them, nor the optimizer columns. The calls are
        counted as in ``after_call``: a write step is never predicted late.
        """
        return self.writer.every_n_steps > 1 and self._calls_to_skip > 0
