"""The writer's conditionals: ``tf.cond`` kept as one ``If`` op, so a branch not taken costs one op.

Outside XLA, TensorFlow lowers every ``tf.cond`` in a ``tf.function`` to
``Switch``/``Merge`` ops: one ``Switch`` per tensor the branches capture, all
executed at every step whichever branch runs. The writer's conds capture a
tensor per variable (the gradients for a write step's statistics, the values
for the rare non-finite recount, the weights for their norms), so on a model
with 40 variables a step ran some 150 ``Switch`` ops to take branches that
are empty at every step but the write step. On a CPU each costs microseconds:
on the benchmark's 20-layer MLP, keeping the conds as functional ``If`` ops
took the step that is not written from 1.07x to 1.03x of the bare step, and
the written step from 1.27x to 1.18x (an A/B of both forms of the writer,
imported side by side in one process). The ``If`` op runs the taken
branch as a function; its inputs are all ready by the time the writer's
conds run, so nothing waits that would not have waited anyway.

The lowering is decided by TensorFlow per op (``_lower_using_switch_merge``,
set where the graph is not compiled by XLA); where it set it, it is turned
off here. Under XLA the attribute is absent and XLA compiles the cond as it
would have. If a TensorFlow version stops exposing the attribute, the cond
is left lowered: only the speed changes.
"""

import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2

_LOWER = "_lower_using_switch_merge"


def static(pred):
    """``pred``'s value where it is known when traced (a bool, a constant, an eager tensor), else None."""
    return tf.get_static_value(pred) if isinstance(pred, (tf.Tensor, tf.Variable)) else pred


def cond(pred, true_fn, false_fn):
    """``tf.cond(pred, true_fn, false_fn)``, run as one ``If`` op; a static ``pred`` (a bool, a constant) picks in Python."""
    known = static(pred)
    if known is not None:
        return true_fn() if bool(known) else false_fn()
    if tf.executing_eagerly():  # a variable: get_static_value gives None for it even eagerly
        return tf.cond(pred, true_fn, false_fn)
    graph = tf.compat.v1.get_default_graph()
    before = len(graph.get_operations())
    out = tf.cond(pred, true_fn, false_fn)
    # The branches are graphs of their own: the one If op made in this graph
    # by this call is the cond itself.
    for op in graph.get_operations()[before:]:
        if op.type in ("If", "StatelessIf"):
            _keep_functional(op)
    return out


def _keep_functional(op):
    try:
        if op.get_attr(_LOWER):
            op._set_attr(_LOWER, attr_value_pb2.AttrValue(b=False))  # noqa: SLF001 (see module docstring)
    except (ValueError, AttributeError):
        pass  # no such attribute here: TensorFlow did not lower it, or cannot be told
