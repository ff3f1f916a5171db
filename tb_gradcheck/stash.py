"""Recording from an XLA-compiled step: statistics into variables inside the step, summaries written after it.

XLA cannot compile summary ops, so a writer that records from a compiled step
(``GradientWriter.record_compiled``) runs the same statistics ops as a traced
step, compiled with the rest of the step, and stores the result in host
variables; ``GradientWriter.write_compiled``, called after the step outside
XLA, writes them. A window's per-step accumulation runs inside the step as
usual; at a write step the stash holds that step's full statistics for the
``last`` slab and the weight norms.
"""

import numpy as np
import tensorflow as tf

from tb_gradcheck import replica


class Stash:
    """One layout's statistics of the latest compiled step, until they are written.

    Attributes:
      layer: float32 ``[L, C]`` variable: the step's layer statistics
        (``C``: ``columns``, the statistic columns the layout stores).
      variable: float32 ``[V, C]`` variable: the step's variable statistics.
      weights: ``(layer, variable)`` float32 weight-norm variables (windows).
      extra: Names of the optimizer values kept (``store_extra``).
      step: int64 variable: the step stored, -1 before the first.
      written: int64 variable: the last step written, -1 before the first.
    """

    def __init__(self, rows, columns, extra=()):
        c = columns
        n_l, n_v = len(rows.layer_names), len(rows.variable_names)
        self.step = replica.host_variable(-1, tf.int64, "tb_gradcheck_stash_step")
        self.layer = replica.host_variable(np.zeros([n_l, c], np.float32), tf.float32, "tb_gradcheck_stash")
        self.variable = replica.host_variable(np.zeros([n_v, c], np.float32), tf.float32, "tb_gradcheck_stash")
        self.weights = (
            replica.host_variable(np.zeros(n_l, np.float32), tf.float32, "tb_gradcheck_stash"),
            replica.host_variable(np.zeros(n_v, np.float32), tf.float32, "tb_gradcheck_stash"),
        )
        # The last step written (recording.write_stashed), read in the graph.
        self.written = replica.host_variable(-1, tf.int64, "tb_gradcheck_stash_written")
        # Optional optimizer values of the write step (tb_gradcheck.updates):
        # {name: (layer [L], variable [V])} float32 variables.
        self.extra = tuple(extra)
        self._extra = {
            name: (
                replica.host_variable(np.zeros(n_l, np.float32), tf.float32, "tb_gradcheck_stash"),
                replica.host_variable(np.zeros(n_v, np.float32), tf.float32, "tb_gradcheck_stash"),
            )
            for name in self.extra
        }

    def store_extra(self, values):
        """Inside the compiled step: keeps the optimizer values ``{name: (layer, variable)}`` of this step."""
        for name, (layer, variable) in values.items():
            self._extra[name][0].assign(layer)
            self._extra[name][1].assign(variable)

    def extra_values(self):
        """The kept optimizer values as ``{name: (layer, variable)}`` tensors (for ``updates.fill``)."""
        return {name: (lv.read_value(), vv.read_value()) for name, (lv, vv) in self._extra.items()}

    def store(self, step, layer, variable, weights=None):
        """Inside the compiled step: keeps this step's statistics (and weight norms) until they are written."""
        self.layer.assign(layer)
        self.variable.assign(variable)
        if weights is not None:
            self.weights[0].assign(weights[0])
            self.weights[1].assign(weights[1])
        self.step.assign(tf.cast(step, tf.int64))
