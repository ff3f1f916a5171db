"""The window of a writer with ``every_n_steps > 1``: per-step reductions between writes, and the onset.

State lives in host variables (``replica.host_variable``), updated inside
the training step by the replica that records.
"""

import numpy as np
import tensorflow as tf

from tb_gradcheck import metadata
from tb_gradcheck import replica
from tb_gradcheck import stats


class Window:
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
        self.last_step = replica.host_variable(0, tf.int64, "tb_gradcheck_last_step")

    @staticmethod
    def _state(n, c):
        def var(value, shape=(n, c)):
            return replica.host_variable(np.full(shape, value, np.float32), tf.float32, "tb_gradcheck_window")

        return {
            "last": var(stats.MISSING),
            "sum": var(0.0),
            "max": var(-np.inf),
            "min": var(np.inf),
            "count": var(0.0),
            "first_nonfinite": replica.host_variable(np.full(n, -1, np.int64), tf.int64, "tb_gradcheck_window"),
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

    def aggregates(self, step, weight_norms, last=None):
        """Returns ``(layer, variable)`` float32 ``[A, R, C]`` in ``metadata.AGGREGATES`` order.

        Args:
          step: The write step (int64), which onset offsets count back from.
          weight_norms: ``(layer, variable)`` float32 weight norms of the write
            step, put in every slab's ``weight_norm`` column.
          last: ``(layer, variable)`` full statistics of the write step for the
            ``last`` slab, or None to use the last step's windowed columns.
        """
        out = []
        step = tf.cast(step, tf.int64)
        column = np.arange(stats.GRADIENT_COLUMNS) == stats.FIRST_NONFINITE
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
            grad = tf.where(column, offset[None, :, None], grad)
            weights = tf.broadcast_to(weight_norms[k][None, :, None], tf.concat([tf.shape(grad)[:2], [1]], 0))
            out.append(tf.concat([grad, weights], axis=-1))
        return tuple(out)

    def reset(self):
        for part in self._parts:
            part["sum"].assign(tf.zeros_like(part["sum"]))
            part["max"].assign(tf.fill(tf.shape(part["max"]), -np.inf))
            part["min"].assign(tf.fill(tf.shape(part["min"]), np.inf))
            part["count"].assign(tf.zeros_like(part["count"]))
            part["first_nonfinite"].assign(tf.fill(tf.shape(part["first_nonfinite"]), tf.constant(-1, tf.int64)))
